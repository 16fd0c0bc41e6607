"""A run's last lines: the report's path, its first screen's findings, whether the host was restored.
From the default trial's real records (tests/data/demo) rendered as the report rule renders them."""

from __future__ import annotations

import html
import json
import re
import time

from conftest import DATA
from llmtrial.core.paths import TrialPaths
from llmtrial.core.records import write_record
from llmtrial.report.render import write_report
from llmtrial.report.run_summary import SHOWN, run_summary

DEMO = DATA / "demo"


def rendered(root):
    """The default trial's records under ``root`` as a results folder, and the report rendered from them."""
    paths = TrialPaths(root)
    files = {name: write_record(root / "records" / f"{name}.json", json.loads((DEMO / f"{name}.json").read_text()))
             for name in ("preflight", "manifest", "tp1", "tp2", "plan-tp1", "plan-tp2")}
    files["cleanup"] = write_record(paths.cleanup, json.loads((DEMO / "cleanup.json").read_text()))
    write_report(paths.report, trial="demo", preflight=files["preflight"], manifest=files["manifest"],
                 plans=[files["plan-tp1"], files["plan-tp2"]], configurations=[files["tp1"], files["tp2"]],
                 cleanup=files["cleanup"], findings_file=paths.findings)
    return paths


def test_the_findings_text_is_the_reports_first_screen_in_its_order(tmp_path):
    paths = rendered(tmp_path)
    text = paths.findings.read_text().splitlines()
    page = paths.report.read_text()
    found = page.split('<ul class="findings">', 1)[1].split("</ul>", 1)[0]
    items = [html.unescape(re.sub(r"<[^>]+>", "", li)) for li in re.findall(r"<li[^>]*>(.*?)</li>", found, re.S)]
    assert text[0] == "2 of 2 serving configurations completed; 0 failed; 0 not launched (the planner said they cannot work)."
    assert text[0] in html.unescape(page)
    assert [line.removeprefix("- ") for line in text[1:]] == items and len(items) >= 2
    assert any("In scenario c1 (concurrency 1), tp1 delivers" in line for line in text)


def test_the_last_lines_name_the_report_a_few_findings_and_the_host(tmp_path):
    before = time.time() - 1
    paths = rendered(tmp_path)
    found = paths.findings.read_text().splitlines()
    lines = run_summary(tmp_path, since=before)
    assert lines[0] == f"report: {paths.report.resolve()}"
    assert lines[1:2 + min(len(found) - 1, SHOWN)] == [f"  {line}" for line in found[: SHOWN + 1]]
    assert lines[-1] == "host restored: yes"  # the demo's cleanup record: restored, no service to check


def test_a_report_this_run_did_not_render_is_not_named(tmp_path):
    rendered(tmp_path)
    assert run_summary(tmp_path, since=time.time() + 60) == ["host restored: yes"]
