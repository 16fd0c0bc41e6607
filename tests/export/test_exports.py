"""A results folder exported (``llmtrial export RESULTS [--out DIR]``): one valid report per configuration x
scenario under exports/benchmark-report-v0.2/, the same bytes every time, and a missing or corrupt record
named before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmtrial.cli import main
from llmtrial.export.br_validate import validate_report
from llmtrial.export.exports import FORMAT_DIR, export_trial

DEMO = Path(__file__).parents[1] / "data" / "records" / "demo-default"
EXPECTED = ["tp1/c1.json", "tp1/c4.json", "tp2/c1.json", "tp2/c4.json"]


@pytest.fixture
def results(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "demo"
    shutil.copytree(DEMO, folder)
    return folder


def files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*.json"))}


def test_the_cli_writes_one_valid_report_per_configuration_and_scenario_under_the_results(results, capsys):
    assert main(["export", str(results)]) == 0
    written = files(results / "exports" / FORMAT_DIR)
    assert list(written) == EXPECTED
    for name, text in written.items():
        report = validate_report(json.loads(text), source=name)
        assert report.version == "0.2"
        assert report.scenario.stack[0].metadata.label == name.split("/")[0]
    printed = capsys.readouterr().out
    assert f"{results / 'exports' / FORMAT_DIR / 'tp2' / 'c4.json'}: Benchmark Report v0.2 of tp2 x c4" in printed


def test_out_elsewhere_gives_the_same_bytes_and_a_rerun_removes_what_it_no_longer_writes(results, tmp_path):
    export_trial(results)
    stale = tmp_path / "elsewhere" / FORMAT_DIR / "tp9" / "c1.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    assert main(["export", str(results), "--out", str(tmp_path / "elsewhere")]) == 0
    assert files(tmp_path / "elsewhere" / FORMAT_DIR) == files(results / "exports" / FORMAT_DIR)
    assert not stale.exists() and not stale.parent.exists()


def test_a_configuration_the_planner_rejected_has_no_report_and_says_why(results):
    record = json.loads((results / "configs" / "tp2" / "record.json").read_text())
    record |= {"status": "skipped", "scenarios": []}
    (results / "configs" / "tp2" / "record.json").write_text(json.dumps(record))
    lines = export_trial(results)
    assert "tp2: no Benchmark Report: the planner rejected it and it was not launched" in lines
    assert list(files(results / "exports" / FORMAT_DIR)) == ["tp1/c1.json", "tp1/c4.json"]


def test_a_trial_where_no_configuration_ran_a_scenario_leaves_an_empty_folder_and_says_why(results):
    export_trial(results)
    for name in ("tp1", "tp2"):
        path = results / "configs" / name / "record.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"status": "skipped", "scenarios": []}))
    lines = export_trial(results)
    assert lines == [f"{name}: no Benchmark Report: the planner rejected it and it was not launched"
                     for name in ("tp1", "tp2")]
    folder = results / "exports" / FORMAT_DIR
    assert folder.is_dir() and list(folder.iterdir()) == []


@pytest.mark.parametrize("damage,message", [
    (lambda p: p.unlink(), "configs/tp2/record.json: missing (configuration tp2 of the trial)"),
    (lambda p: p.write_text('{"trial": '), "configs/tp2/record.json is not valid JSON"),
    (lambda p: p.write_text(json.dumps(json.loads(p.read_text()) | {"status": "done"})),
     "configuration record {results}/configs/tp2/record.json does not match its schema:\n  status:"),
])
def test_a_missing_or_corrupt_record_is_named_and_nothing_is_written(results, capsys, damage, message):
    damage(results / "configs" / "tp2" / "record.json")
    assert main(["export", str(results)]) == 2
    assert message.format(results=results) in capsys.readouterr().err
    assert not (results / "exports").exists()
