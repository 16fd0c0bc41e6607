"""The files the library ships as package data: record and config schemas, the report's
templates, and the vLLM patches. Found through ``importlib.resources``, so they are there in
an installed (not only an editable) package. And the folder where the library keeps what it can
make again (:func:`cache_root`): generated tiny models, compiled report templates."""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

#: The environment variable naming the cache's root folder in place of the default.
CACHE_ENV = "LLMTRIAL_CACHE_DIR"


def resource_dir(name: str) -> Path:
    """A folder of package data: ``schemas``, ``templates`` or ``patches``."""
    return Path(str(files("llmtrial") / name))


SCHEMAS = resource_dir("schemas")
TEMPLATES = resource_dir("templates")
PATCHES = resource_dir("patches")


def cache_root() -> Path:
    """The cache's root folder: :data:`CACHE_ENV`, else ``$XDG_CACHE_HOME/llmtrial``, else ``~/.cache/llmtrial``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmtrial"
