"""The files the library ships as package data: record and config schemas, the report's
templates, and the vLLM patches. Found through ``importlib.resources``, so they are there in
an installed (not only an editable) package."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def resource_dir(name: str) -> Path:
    """A folder of package data: ``schemas``, ``templates`` or ``patches``."""
    return Path(str(files("llmtrial") / name))


SCHEMAS = resource_dir("schemas")
TEMPLATES = resource_dir("templates")
PATCHES = resource_dir("patches")
