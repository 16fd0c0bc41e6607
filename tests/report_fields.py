"""A rendered report as its fields: each piece of text a reader sees, named by where it stands (the section's
heading, the element path inside it, and the position among its siblings), so two renderings of the same
records can be compared field by field.

    python tests/report_fields.py RESULTS CLEANUP OUT.json

renders the report of the records in RESULTS (a results folder: provenance, preflight, model, plans,
patches, configs) with the cleanup record CLEANUP, and writes its fields to OUT.json. The library it
renders with is whichever ``llmtrial`` the interpreter imports, so the same command run from two
revisions gives the fields before and after a change.
"""

from __future__ import annotations

import json
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

#: Elements whose text is not a field (scripts, styles, the SVG charts' own markup).
SKIPPED = {"script", "style", "svg"}
#: Elements that hold no text and have no closing tag.
VOID = {"br", "hr", "img", "input", "meta", "link", "col", "wbr", "source"}


class _Fields(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.counts: list[dict[str, int]] = [{}]
        self.section = "(top)"
        self.heading: list[str] | None = None
        self.fields: list[tuple[str, str]] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            return
        seen = self.counts[-1]
        seen[tag] = seen.get(tag, 0) + 1
        self.stack.append(f"{tag}[{seen[tag]}]")
        self.counts.append({})
        if tag in SKIPPED:
            self.skipping += 1
        if tag in ("h1", "h2", "h3") and not self.skipping:
            self.heading = []

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID or not self.stack or not self.stack[-1].startswith(f"{tag}["):
            return
        if tag in SKIPPED:
            self.skipping -= 1
        if tag in ("h1", "h2", "h3") and self.heading is not None:
            self.section = " ".join("".join(self.heading).split())
            self.heading = None
        self.stack.pop()
        self.counts.pop()

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if not text or self.skipping:
            return
        if self.heading is not None:
            self.heading.append(data)
        self.fields.append((f"{self.section} :: {'/'.join(self.stack)}", text))


def report_fields(html: str) -> list[list[str]]:
    """Every piece of text of ``html`` with where it stands, in reading order."""
    parser = _Fields()
    parser.feed(html)
    parser.close()
    return [[where, text] for where, text in parser.fields]


def render(results: Path, cleanup: Path, out: Path) -> Path:
    """The report of the records in ``results`` with the cleanup record ``cleanup``."""
    from llmtrial.report.render import write_report

    configs = sorted((results / "configs").glob("*/record.json"))
    return write_report(out, trial=json.loads((results / "provenance.json").read_text())["config"]["trial"],
                        preflight=results / "preflight" / "record.json", manifest=results / "model" / "manifest.json",
                        plans=sorted((results / "plans").glob("*.json")), configurations=configs, cleanup=cleanup,
                        patches=results / "patches" / "record.json", provenance=results / "provenance.json")


if __name__ == "__main__":
    results, cleanup, target = map(Path, sys.argv[1:4])
    with tempfile.TemporaryDirectory() as tmp:
        html = render(results, cleanup, Path(tmp) / "report.html").read_text(encoding="utf-8")
    target.write_text(json.dumps(report_fields(html), indent=0) + "\n", encoding="utf-8")
    print(f"{target}: {len(report_fields(html))} fields")
