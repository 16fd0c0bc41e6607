"""The Jinja environment the report and the comparison page render with.

Compiling ``report.html.j2`` takes about a second, a sixth of a trial's report stage; the compiled
code is kept under :func:`llmtrial.core.resources.cache_root` (``templates/jinja2-<version>``) by
Jinja's own bytecode cache, which keys it by the template's name and checks it against the source's
checksum, so an edited template is compiled again. A cache folder that cannot be written (a read-only
home, a full disk) is skipped with a warning: the page renders the same, compiled each time.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
from pathlib import Path

import jinja2

from llmtrial.core.resources import TEMPLATES, cache_root

logger = logging.getLogger(__name__)


class KeptTemplates(jinja2.FileSystemBytecodeCache):
    """Jinja's file cache, whose failure to write (a full disk) costs the next render a compile, not the page."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError as exc:
            logger.warning("the compiled template %s was not kept in %s: %s", bucket.key, self.directory, exc)


def bytecode_cache() -> jinja2.BytecodeCache | None:
    """Jinja's file cache of compiled templates in this user's cache folder, or None where it cannot be written."""
    folder = cache_root() / "templates" / f"jinja2-{md.version('jinja2')}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return KeptTemplates(str(folder)) if os.access(folder, os.W_OK | os.X_OK) else None


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
