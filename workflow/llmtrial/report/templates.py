"""The Jinja environment the report and the comparison page render with.

Compiling ``report.html.j2`` takes about a second, a sixth of a trial's report stage; the compiled
code is kept under :func:`llmtrial.core.resources.cache_root` (``templates/jinja2-<version>``) by
Jinja's own bytecode cache, which keys it by the template's name and checks it against the source's
checksum, so an edited template is compiled again. A cache folder that cannot be written (a read-only
home) is skipped: the page renders the same, compiled each time.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from pathlib import Path

import jinja2

from llmtrial.core.resources import TEMPLATES, cache_root


def bytecode_cache() -> jinja2.BytecodeCache | None:
    """Jinja's file cache of compiled templates in this user's cache folder, or None where it cannot be written."""
    folder = cache_root() / "templates" / f"jinja2-{md.version('jinja2')}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(folder)) if os.access(folder, os.W_OK | os.X_OK) else None


def template_environment(template_dir: Path = TEMPLATES) -> jinja2.Environment:
    """Templates from ``template_dir``, HTML autoescaped, undefined names an error, blocks trimmed."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=bytecode_cache(),
    )
