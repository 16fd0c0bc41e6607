"""Record kinds: one typed model each, its JSON Schema generated from it (the committed schema
files the same), checked before every write; the cleanup record's weights always one shape."""

from __future__ import annotations

import copy
import json
import re
import subprocess

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from conftest import DATA, REPO, written
from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.record_models import (
    CONFIG_SCHEMA,
    KINDS,
    PATCH_SCHEMA,
    REGENERATE,
    ManifestRecord,
    main,
    record_schema,
    schema_file,
    schema_text,
    stale_schemas,
    write_schemas,
)
from llmtrial.core.records import check_record, load_record, read_record, write_record
from llmtrial.core.resources import SCHEMAS
from llmtrial.core.scenario_model import Pass, PassSummary, Step

DEMO = {"preflight": ["preflight"], "plan": ["plan-tp1", "plan-tp2"], "manifest": ["manifest"],
        "configuration": ["tp1", "tp2"], "cleanup": ["cleanup"]}
HASH = "sha256=" + "A" * 43


def demo(name: str) -> dict:
    return read_record(DATA / "demo" / f"{name}.json")


# --------------------------------------------------------------------------- the schemas are generated


def test_there_are_ten_record_kinds_and_each_committed_schema_is_what_its_model_generates():
    assert set(KINDS) == {"preflight", "plan", "manifest", "quiet", "patches", "configuration", "cleanup", "provenance",
                          "comparison", "prompts"}
    stale = stale_schemas()
    assert not stale, (f"schema files differ from their models: {[p.name for p in stale]}; "
                       f"regenerate them with `.venv/bin/{REGENERATE}`")
    assert sorted(p.name for p in SCHEMAS.glob("*.record.schema.*")) == sorted(f"{k}.record.schema.json" for k in KINDS)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_schema_is_a_valid_json_schema_stable_from_run_to_run_and_describes_every_object(kind):
    text = schema_text(kind)
    assert text == schema_text(kind) and text.endswith("}\n") and json.loads(text) == record_schema(kind)
    schema = record_schema(kind)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["title"].endswith(("record", "manifest"))
    undescribed = [name for name, d in {kind: schema, **schema.get("$defs", {})}.items() if not d.get("description")]
    assert undescribed == []
    assert set(schema["required"]) == {n for n, f in KINDS[kind].model_fields.items() if f.is_required()}


def test_the_schema_files_are_written_and_checked_by_the_command(tmp_path, capsys):
    assert main(["--check", "--folder", str(tmp_path)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main(["--write", "--folder", str(tmp_path)]) == 0
    assert main(["--check", "--folder", str(tmp_path)]) == 0 and stale_schemas(tmp_path) == []
    assert [p.read_text() for p in write_schemas(tmp_path)] == [
        *(schema_file(k).read_text() for k in KINDS), (SCHEMAS / CONFIG_SCHEMA).read_text(),
        (SCHEMAS / PATCH_SCHEMA).read_text()]
    schema_file("plan", tmp_path).write_text("{}\n")
    assert stale_schemas(tmp_path) == [schema_file("plan", tmp_path)]


# --------------------------------------------------------------------------- real records, broken records


@pytest.mark.parametrize("kind,name", [(k, n) for k, names in DEMO.items() for n in names])
def test_the_default_trials_records_match_their_schema_and_model(kind, name):
    check_record(demo(name), kind)
    assert isinstance(load_record(DATA / "demo" / f"{name}.json", kind), KINDS[kind])


def fake_job_record() -> dict:
    """tests/data/records/fake-job-cold-start-failure.json with the values it stores as their type's name
    (what differs between runs) given back a value of that type."""
    def fill(value):
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return {"int": 1, "float": 1.0, "list": [], "dict": {}}.get(value, value) if isinstance(value, str) else value

    record = fill(read_record(DATA / "records" / "fake-job-cold-start-failure.json"))
    record["timing"] = {"job_start": 1.0, "job_end": 2.0, "wall_s": 1.0, "startup_s": 1.0}
    return record


def test_the_fake_jobs_failed_record_matches_and_reads_as_its_typed_parts(tmp_path):
    record = fake_job_record()
    check_record(record, "configuration")
    model = load_record(write_record(tmp_path / "r.json", record, schema="configuration"), "configuration")
    assert isinstance(model, ConfigurationRecord) and model.failure.phase == "cold_start"
    assert model.failure.error_line is None and model.cold_start.ready_seconds.unit == "s"
    assert model.patches.plugin_dir is None and model.gpu_census.held_failed == [] and model.gpu_health is None
    assert model.server.stop.port_closed is True and model.server.pid == 1  # a field the model does not name, kept


def test_the_demo_configuration_record_reads_as_passes_with_their_summaries():
    model = load_record(DATA / "demo" / "tp1.json", "configuration")
    first = model.scenarios[0].pass_results[0]
    assert type(first) is Pass and first.pass_ == demo("tp1")["scenarios"][0]["pass_results"][0]["pass"]
    assert first.status in ("ok", "failed") and model.plan.verdict == demo("tp1")["plan"]["verdict"]


def test_a_pass_summary_holds_the_percentiles_the_trial_named_and_refuses_any_other_key():
    summary = demo("tp1")["scenarios"][0]["pass_results"][0]["summary"]
    model = PassSummary.model_validate(summary)
    # p50 and p90 are the trial's (bench.percentiles), not fields: held by name, written where they were read
    assert model.percentiles["p50_ttft_ms"] == summary["p50_ttft_ms"] and "p90_itl_ms" in model.percentiles
    assert "p50_ttft_ms" not in PassSummary.model_fields and written(model) == summary
    with pytest.raises(ValidationError, match="nor a latency percentile .*: p90_ttft, tpot_p50"):
        PassSummary.model_validate({**summary, "p90_ttft": 1.0, "tpot_p50": 2.0})
    with pytest.raises(ValidationError, match="p95_ttft_ms"):
        PassSummary.model_validate({**summary, "p95_ttft_ms": "fast"})


def quiet_record() -> dict:
    return {"restored_first": demo("cleanup"), "quieted_at": 2.0, "gpu": None, "residues": [],
            "services": [{"name": "demo", "kind": "command", "was_running": True, "state_seen": "running",
                          "action": "stopped", "stopped_at": 1.0, "stop_exit": 0, "down_after_s": 0.2, "seen": "stopped"}]}


def patches_record(tmp_path) -> dict:
    """The patch stage's record with no patch enabled (as the stage writes it), and one patch in mode file."""
    from llmtrial.core.ledger import Ledger
    from llmtrial.patch.patching import apply_patches

    record = written(apply_patches({}, ledger=Ledger(tmp_path / "ledger.jsonl", run="r"), work_dir=tmp_path))
    check_record(record, "patches")
    record["vllm"] = {"distribution": "vllm", "version": "0.32.0", "site_packages": "/sp"}
    record["patches"] = [{"name": "demo-worker-log", "mode": "file", "description": "d", "vllm_range": ">=0.1",
                          "flag": "LLMTRIAL_DEMO", "evidence": "demo", "applied_at": 1.0, "plugin": None,
                          "files": [{"path": "vllm/x.py", "file": "/sp/vllm/x.py", "backup": "/b/x.py", "record_hash": HASH,
                                     "before_hash": HASH, "after_hash": HASH, "hunks": [{"line": 3, "offset": 0}]}]}]
    return record


def provenance_record(tmp_path) -> dict:
    from llmtrial.provenance import collect
    from workflow_helpers import default_config

    return written(collect(default_config(), configfiles=[REPO / "config" / "config.yaml", tmp_path / "gone.yaml"],
                           command=["snakemake", "--cores", "1"], repo=tmp_path))


def _del(*path):
    def breaker(record):
        node = record
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return breaker


def _set(value, *path):
    def breaker(record):
        node = record
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return breaker


#: kind: (a real record, how to break it, what the refusal says)
BROKEN = {
    "preflight": (lambda _: demo("preflight"), _del("environment", "gpus", "count"),
                  "environment.gpus: 'count' is a required property"),
    "plan": (lambda _: demo("plan-tp1"), _set("maybe", "verdict"), "verdict: 'maybe' is not one of"),
    "manifest": (lambda _: demo("manifest"), _set("xyz", "files", 0, "sha256"), "files.0.sha256: 'xyz' does not match"),
    "quiet": (lambda _: quiet_record(), _set("cron", "services", 0, "kind"), "services.0.kind: 'cron' is not one of"),
    "patches": (patches_record, _set("md5=x", "patches", 0, "files", 0, "before_hash"),
                "patches.0.files.0.before_hash: 'md5=x' does not match"),
    "configuration": (lambda _: demo("tp1"), _del("timing", "wall_s"), "timing: 'wall_s' is a required property"),
    "cleanup": (lambda _: demo("cleanup"), _set(-1, "weights", "freed_bytes"),
                "weights.freed_bytes: -1 is less than the minimum of 0"),
    "provenance": (provenance_record, _set("abc", "config_sha256"), "config_sha256: 'abc' does not match"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_real_record_of_each_kind_is_accepted_and_a_broken_one_refused_naming_the_field(kind, tmp_path):
    build, breaker, message = BROKEN[kind]
    record = build(tmp_path)
    check_record(record, kind)
    assert isinstance(load_record(write_record(tmp_path / "ok.json", record, schema=kind), kind), KINDS[kind])
    breaker(record)
    with pytest.raises(ValueError, match=f"^{kind} record does not match its schema:\n") as err:
        check_record(record, kind)
    assert f"\n  {message}" in str(err.value)
    with pytest.raises(ValueError, match=re.escape(message)):
        write_record(tmp_path / "broken.json", record, schema=kind)
    assert not (tmp_path / "broken.json").exists()
    (tmp_path / "broken.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"{kind} record {tmp_path / 'broken.json'} does not match"):
        load_record(tmp_path / "broken.json", kind)


def test_a_field_that_may_be_absent_is_never_null_and_one_that_may_be_null_is():
    record = demo("tp1")
    fact = next(iter(record["startup"].values()))
    fact.pop("unit", None)
    check_record(record, "configuration")  # absent: fine
    fact["unit"] = None
    with pytest.raises(ValueError, match=r"startup\.\w+\.unit: None is not of type 'string'"):
        check_record(record, "configuration")
    fact["unit"] = "s"
    record["failure"] = None  # required, and null when the configuration did not fail
    record["timing"]["startup_s"] = None
    check_record(record, "configuration")
    del record["failure"]
    with pytest.raises(ValueError, match="'failure' is a required property"):
        check_record(record, "configuration")


def test_a_record_that_does_not_match_is_not_written_and_each_field_at_fault_is_named(tmp_path):
    record = demo("plan-tp1")
    record["verdict"] = "maybe"
    record["force"] = "no"
    del record["facts"]
    with pytest.raises(ValueError) as err:
        write_record(tmp_path / "plan.json", record, schema="plan")
    assert "verdict" in str(err.value) and "force" in str(err.value) and "'facts' is a required" in str(err.value)
    assert not (tmp_path / "plan.json").exists()


# --------------------------------------------------------------------------- writing a dict, writing a model


@pytest.mark.parametrize("kind,name", [(k, n) for k, names in DEMO.items() for n in names])
def test_a_dict_is_written_as_it_is_and_a_model_as_the_fields_it_was_given(kind, name, tmp_path):
    record = demo(name)
    written = write_record(tmp_path / "dict.json", record, schema=kind)
    assert written.read_text() == json.dumps(record, indent=2, sort_keys=False, default=str) + "\n"
    model = load_record(written, kind)
    assert read_record(write_record(tmp_path / "model.json", model, schema=kind)) == record
    assert read_record(write_record(tmp_path / "inferred.json", model)) == record  # the kind is the model's


def test_a_model_the_stage_builds_is_written_without_the_defaults_it_did_not_set(tmp_path):
    record = demo("tp1")
    record.pop("engine_warnings", None)
    record.pop("throughput_bound", None)
    model = ConfigurationRecord.model_validate(record)
    assert model.engine_warnings == [] and model.throughput_bound == []
    out = read_record(write_record(tmp_path / "r.json", model))
    assert "engine_warnings" not in out and "throughput_bound" not in out and out == record
    broken = ManifestRecord.model_construct(model_dir="m", source={}, files=[], total_bytes=-1, created="now")
    with pytest.raises(ValueError, match="manifest record does not match its schema:\n  total_bytes: -1"):
        write_record(tmp_path / "m.json", broken)


def test_a_sweep_step_reads_as_a_step_with_its_pass_number():
    import synthetic

    [sweep] = [s for r in synthetic.records() for s in r["scenarios"] if s.get("kind") == "sweep"][:1]
    record = copy.deepcopy(synthetic.records()[0])
    record["scenarios"] = [sweep]
    model = ConfigurationRecord.model_validate(record)
    step = model.scenarios[0].steps[0]
    assert type(step) is Step and step.step == 1 and step.pass_ == sweep["steps"][0]["pass"]
    assert model.model_dump(mode="json", exclude_unset=True)["scenarios"][0]["steps"][0]["pass"] == step.pass_


# --------------------------------------------------------------------------- the stages


def test_every_record_the_workflow_writes_names_its_kind():
    calls = [(p, line) for p in (REPO / "workflow").rglob("*.py") for line in p.read_text().splitlines()
             if re.search(r"\bwrite_record\(", line) and "def write_record" not in line]
    assert len(calls) >= 11
    for path, line in calls:
        m = re.search(r'schema="(\w+)"', line)
        assert m and m[1] in KINDS, f"{path}: {line.strip()}"


def test_the_cleanup_records_weights_is_always_an_object(tmp_path):
    from llmtrial.lifecycle.cleanup import cleanup_with_record

    kept = cleanup_with_record(tmp_path, tmp_path / "a.json", weights=False).weights
    assert kept.applied is False and "did not finish" in kept.reason and kept.folders == []
    applied = cleanup_with_record(tmp_path, tmp_path / "b.json", weights=True).weights
    assert applied.applied is True and applied.reason is None and applied.freed_bytes == 0
    for name in ("a.json", "b.json"):
        assert load_record(tmp_path / name, "cleanup").weights.applied is (name == "b.json")


def test_the_quiet_record_matches_its_schema_with_an_earlier_runs_cleanup_inside(tmp_path, free_port):
    from llmtrial.core.ledger import Ledger
    from llmtrial.host.services import quiet_host
    from llmtrial.lifecycle.cleanup import restore_first
    from workflow_helpers import demo_service

    svc = demo_service(tmp_path / "demo", free_port)
    subprocess.run(svc["start"], check=True, timeout=30)
    try:
        Ledger(tmp_path / "ledger.jsonl", run="crashed").append("service_quiet", service={
            "name": "gone", "kind": "command", "status": ["true"], "start": ["true"], "stop": ["true"]},
            was_running=True, state_seen="running")
        record = quiet_host(tmp_path, {"demo": svc}, restored_first=restore_first(tmp_path))
        check_record(record, "quiet")
        assert record.restored_first is not None and record.services[0].action == "stopped"
        model = load_record(write_record(tmp_path / "quiet.json", record, schema="quiet"), "quiet")
        assert model.restored_first.run == record.restored_first.run and model.services[0].kind == "command"
        assert written(model) == written(record)
    finally:
        from llmtrial.lifecycle.cleanup import run_cleanup

        run_cleanup(tmp_path)
        subprocess.run(svc["stop"], timeout=30)


def test_a_configuration_record_carries_the_engines_warnings_and_a_wrong_one_is_named(tmp_path):
    record = demo("tp2")
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
