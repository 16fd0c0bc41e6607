"""The default trial's report, rendered from a stored set of its records, reads field by field as it did
before the trial file and the records were typed end to end.

``tests/data/records/demo-default/report-fields.json`` holds the report's fields as the project rendered
them from these records at commit 051c320, before that work (``python tests/report_fields.py
tests/data/records/demo-default tests/data/demo/cleanup.json OUT.json`` with that revision's library),
the render time aside. It was written again when the intervals over passes became the t interval of
the pass values' logarithms (never below zero) and the method line said so: 29 of its 2,129 fields
changed, that line and 28 intervals, each only in its numbers; every other field as before.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from report_fields import render, report_fields

DATA = Path(__file__).parents[1] / "data"
RECORDS = DATA / "records" / "demo-default"
RENDERED = re.compile(r"^Rendered \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC ")


def fields(rows: list[list[str]]) -> list[tuple[str, str]]:
    """Each field as (where, text), the report's own render time set aside."""
    return [(where, RENDERED.sub("Rendered (render time) ", text)) for where, text in rows]


def test_the_default_trials_report_reads_field_by_field_as_before(tmp_path):
    html = render(RECORDS, DATA / "demo" / "cleanup.json", tmp_path / "report.html").read_text(encoding="utf-8")
    now = fields(report_fields(html))
    before = fields(json.loads((RECORDS / "report-fields.json").read_text(encoding="utf-8")))
    changed = [f"{where}: {old!r} -> {new!r}" for (where, old), (_, new) in zip(before, now, strict=False) if old != new]
    assert not changed, f"{len(changed)} field(s) read otherwise:\n" + "\n".join(changed[:20])
    assert len(now) == len(before), f"{len(before)} fields before, {len(now)} now: {(before + now)[min(len(before), len(now))]}"
    # the fields are the report's: its sections, the figures of both configurations, the cleanup's rows
    sections = {where.split(" :: ")[0] for where, _ in now}
    assert {"Serving trial: demo", "Cleanup"} <= sections, sorted(sections)
    assert any(text == "tp2" for _, text in now) and any(text == "tp1" for _, text in now)
