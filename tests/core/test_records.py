"""Records: atomic writes, provenance, schema checks, readable errors."""

from __future__ import annotations

import json

import pytest

import synthetic
from conftest import DATA
from llmtrial.core.records import check_record, fact, read_record, write_record


def test_fact_carries_value_kind_source_and_unit():
    assert fact(1.5, "server.log:3", unit="s") == {"value": 1.5, "kind": "measured", "source": "server.log:3", "unit": "s"}
    assert fact(7, "planner", kind="predicted") == {"value": 7, "kind": "predicted", "source": "planner"}


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    path = write_record(tmp_path / "a" / "r.json", {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    write_record(path, {"x": 2})
    assert read_record(path) == {"x": 2}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_record(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        read_record(bad)


@pytest.mark.parametrize("name", ["tp1", "tp2"])
def test_real_configuration_records_match_their_schema(name):
    check_record(read_record(DATA / "demo" / f"{name}.json"), "configuration")


def test_a_malformed_record_is_refused_naming_each_field(tmp_path):
    record = read_record(DATA / "demo" / "tp1.json")
    record["status"] = "maybe"
    del record["server"]["argv"]
    record["startup"]["kv_cache_tokens"].pop("source")
    with pytest.raises(ValueError) as err:
        write_record(tmp_path / "r.json", record, schema="configuration")
    msg = str(err.value)
    assert "status: 'maybe'" in msg and "server: 'argv'" in msg and "startup.kv_cache_tokens: 'source'" in msg
    assert not (tmp_path / "r.json").exists()


def test_records_with_sweeps_warm_ups_repetition_and_goodput_match_the_schema_and_their_mistakes_are_named():
    for record in synthetic.records():
        check_record(record, "configuration")
    record = synthetic.records()[0]
    record["scenarios"][2]["kind"] = "ramp"
    record["scenarios"][1]["repetition"]["stopped"] = "tired"
    record["scenarios"][1]["pass_results"][0]["summary"]["goodput"]["met"] = "yes"
    with pytest.raises(ValueError) as err:
        check_record(record, "configuration")
    msg = str(err.value)
    assert "scenarios.2.kind: 'ramp'" in msg and "scenarios.1.repetition.stopped: 'tired'" in msg
    assert "scenarios.1.pass_results.0.summary.goodput.met: 'yes'" in msg
