"""Record kinds: one typed model and one schema each, checked before every write; the cleanup
record's weights always one shape."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from conftest import DATA, REPO
from llmtrial.core.record_models import KINDS
from llmtrial.core.records import SCHEMAS, check_record, load_record, read_record, write_record

DEMO = {"preflight": ["preflight"], "plan": ["plan-tp1", "plan-tp2"], "manifest": ["manifest"],
        "configuration": ["tp1", "tp2"], "cleanup": ["cleanup"]}


def _schema(kind: str) -> dict:
    return yaml.safe_load((SCHEMAS / f"{kind}.record.schema.yaml").read_text())


def test_there_are_eight_record_kinds_each_with_a_schema_requiring_what_its_model_requires():
    assert set(KINDS) == {"preflight", "plan", "manifest", "quiet", "patches", "configuration", "cleanup", "provenance"}
    for kind, model in KINDS.items():
        required = {name for name, f in model.model_fields.items() if f.is_required()}
        assert set(_schema(kind)["required"]) == required, kind


@pytest.mark.parametrize("kind,name", [(k, n) for k, names in DEMO.items() for n in names])
def test_the_default_trials_records_match_their_schema_and_model(kind, name):
    check_record(read_record(DATA / "demo" / f"{name}.json"), kind)
    load_record(DATA / "demo" / f"{name}.json", kind)


def test_a_record_that_does_not_match_is_not_written_and_each_field_at_fault_is_named(tmp_path):
    record = read_record(DATA / "demo" / "plan-tp1.json")
    record["verdict"] = "maybe"
    record["force"] = "no"
    del record["facts"]
    with pytest.raises(ValueError) as err:
        write_record(tmp_path / "plan.json", record, schema="plan")
    assert "verdict" in str(err.value) and "force" in str(err.value) and "'facts' is a required" in str(err.value)
    assert not (tmp_path / "plan.json").exists()


def test_a_record_model_is_written_as_its_json(tmp_path):
    model = load_record(DATA / "demo" / "manifest.json", "manifest")
    path = write_record(tmp_path / "manifest.json", model, schema="manifest")
    assert read_record(path) == read_record(DATA / "demo" / "manifest.json")


def test_every_record_the_workflow_writes_names_its_kind():
    calls = [(p, line) for p in (REPO / "workflow").rglob("*.py") for line in p.read_text().splitlines()
             if re.search(r"\bwrite_record\(", line) and "def write_record" not in line]
    assert len(calls) >= 11
    for path, line in calls:
        m = re.search(r'schema="(\w+)"', line)
        assert m and m[1] in KINDS, f"{path}: {line.strip()}"


def test_the_cleanup_records_weights_is_always_an_object(tmp_path):
    from llmtrial.borrow.cleanup import cleanup_with_record

    kept = cleanup_with_record(tmp_path, tmp_path / "a.json", weights=False)["weights"]
    assert kept["applied"] is False and "did not finish" in kept["reason"] and kept["folders"] == []
    applied = cleanup_with_record(tmp_path, tmp_path / "b.json", weights=True)["weights"]
    assert applied["applied"] is True and applied["reason"] is None and applied["freed_bytes"] == 0
    for name in ("a.json", "b.json"):
        assert load_record(tmp_path / name, "cleanup").weights.applied is (name == "b.json")


def test_the_quiet_record_matches_its_schema_with_an_earlier_runs_cleanup_inside(tmp_path, free_port):
    from llmtrial.borrow.cleanup import restore_first
    from llmtrial.core.ledger import Ledger
    from llmtrial.host.services import quiet_host
    from workflow_helpers import demo_service

    svc = demo_service(tmp_path / "demo", free_port)
    subprocess.run(svc["start"], check=True, timeout=30)
    try:
        Ledger(tmp_path / "ledger.jsonl", run="crashed").append("service_quiet", service={
            "name": "gone", "kind": "command", "status": ["true"], "start": ["true"], "stop": ["true"]},
            was_running=True, state_seen="running")
        record = quiet_host(tmp_path, {"demo": svc}, restored_first=restore_first(tmp_path))
        check_record(record, "quiet")
        assert record["restored_first"] is not None and record["services"][0]["action"] == "stopped"
    finally:
        from llmtrial.borrow.cleanup import run_cleanup

        run_cleanup(tmp_path)
        subprocess.run(svc["stop"], timeout=30)


def test_a_configuration_record_carries_the_engines_warnings_and_a_wrong_one_is_named(tmp_path):
    record = read_record(DATA / "demo" / "tp2.json")
    record["engine_warnings"] = [{
        "name": "p2p_unsupported", "source": "server.log:41", "process": "Worker_TP0", "count": 2, "kind": "measured",
        "line": "Custom allreduce is disabled because your platform lacks GPU P2P capability.",
        "summary": "vLLM found no GPU peer-to-peer access and disabled its custom all-reduce",
        "advice": "Measure the split before trusting it."}]
    check_record(record, "configuration")
    assert load_record(write_record(tmp_path / "r.json", record, schema="configuration"),
                       "configuration").engine_warnings[0].count == 2
    record["engine_warnings"][0]["kind"] = "predicted"
    del record["engine_warnings"][0]["line"]
    with pytest.raises(ValueError) as err:
        check_record(record, "configuration")
    assert "engine_warnings.0" in str(err.value) and "'line' is a required" in str(err.value)
