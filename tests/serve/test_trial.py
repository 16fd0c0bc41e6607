"""Pieces of the configuration job that need no vLLM: pass agreement, SIGTERM handling, the job's
phases against a double of the server."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, SERVER_SCRIPT, wait_until, written
from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.core.ledger import Ledger
from llmtrial.core.paths import JobPaths, TrialPaths
from llmtrial.core.record_models import Hardware, ManifestFile, ManifestRecord, PlanRecord
from llmtrial.core.records import check_record, read_record
from llmtrial.core.trial_config import BenchBlock, ColdStartBlock, ScenarioBlock
from llmtrial.host.process_groups import group_members, port_open
from llmtrial.serve.datasets import JobScenario
from llmtrial.serve.measure import Workload
from llmtrial.serve.scenarios import spread_of as agreement
from llmtrial.serve.trial import TrialJob


def test_agreement_is_the_spread_over_the_mean():
    assert agreement([100.0, 102.0]) == 2.0 / 101.0
    assert agreement([5.0]) is None and agreement([]) is None
    assert agreement([0.0, 0.0]) is None


JOB = r"""
import sys, time
from llmtrial.core.paths import JobPaths, TrialPaths
from llmtrial.core.records import check_record, read_record
from llmtrial.serve.server import ServerProcess
from llmtrial.serve.measure import sigterm_as_exit
script, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = ServerProcess([sys.executable, script, str(port), "0.2", "0"], host="127.0.0.1", port=port, log_path=log)
with sigterm_as_exit():
    try:
        server.start()
        server.wait_ready(60, poll=0.1)
        print(server.pgid, flush=True)
        time.sleep(600)
    finally:
        server.stop()
"""


def test_a_job_stopped_with_sigterm_stops_its_server_first(tmp_path, free_port):
    script = tmp_path / "fake_server.py"
    script.write_text(SERVER_SCRIPT)
    job = subprocess.Popen([sys.executable, "-c", JOB, str(script), str(free_port), str(tmp_path / "s.log")],
                           stdout=subprocess.PIPE, text=True)
    pgid = int(job.stdout.readline())
    assert group_members(pgid)
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 128 + signal.SIGTERM
    wait_until(lambda: group_members(pgid) == [], "the server's group gone")
    assert not port_open("127.0.0.1", free_port)


class FakeServerJob(TrialJob):
    """The job with a double of the vLLM server (a loopback /health server): the job's own
    phases run for real, the first completion fails (the double has no /v1/completions)."""

    script: Path | None = None

    def argv(self, prefix_caching: bool = False) -> list[str]:
        return [sys.executable, str(self.script), str(self.spec.port), "0.3", "0"]


def fake_job(tmp_path: Path, port: int, verdict: str = "fits") -> FakeServerJob:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    job = FakeServerJob(
        trial="demo", spec=ConfigurationSpec(name="tp1", description="", host="127.0.0.1", port=port,
                                             startup_timeout_s=120, stop_timeout_s=30),
        manifest=ManifestRecord(model_dir=str(model), source={"kind": "local"}, total_bytes=2, created="2026-12-05",
                                files=[ManifestFile(path="config.json", size=2, sha256=hashlib.sha256(b"{}").hexdigest())]),
        plan=PlanRecord(configuration="tp1", verdict=verdict, reasons=["a reason"], checks=[], hardware=Hardware(),
                        plan={}, facts={}, force=False), services={},
        workload=Workload(served_model_name="m", scenarios={"c1": JobScenario(ScenarioBlock(passes=1))},
                          bench_settings=BenchBlock(seed=0, percentiles=[50]),
                          cold_start=ColdStartBlock(prompt="Hi", max_tokens=2, timeout_s=60), telemetry_interval=0.5),
        paths=JobPaths(TrialPaths.of("demo", tmp_path / "results"), "tp1"))
    job.script = tmp_path / "fake_server.py"
    job.script.write_text(SERVER_SCRIPT)
    return job


def test_a_server_that_cannot_serve_is_a_failure_record_with_each_phase_part(tmp_path, free_port):
    model = fake_job(tmp_path, free_port).run()
    assert isinstance(model, ConfigurationRecord) and model.status == "failed" and model.failure.phase == "cold_start"
    record = written(model)
    assert record["status"] == "failed"
    assert record["failure"]["phase"] == "cold_start" and record["failure"]["reason"] == "request_failed"
    assert record["cold_start"]["ready_seconds"]["value"] > 0 and "first_ttft_s" not in record["cold_start"]
    assert record["scenarios"] == []  # no pass after a failed cold start
    assert record["server"]["launched_at"] <= record["server"]["ready_at"]
    assert record["server"]["stop"]["survivors"] == [] and not port_open("127.0.0.1", free_port)
    assert record["telemetry"]["startup_window"]["start"] == record["server"]["launched_at"]
    assert record["timing"]["startup_s"] == record["cold_start"]["ready_seconds"]["value"]
    assert json.loads((tmp_path / "results/demo/configs/tp1/record.json").read_text()) == record
    actions = [e.action for e in Ledger(tmp_path / "results/demo/ledger.jsonl").entries()]
    assert actions[0] == "job_started" and actions[-1] == "job_finished" and "server_started" in actions


def test_a_configuration_the_planner_rejects_is_skipped_without_a_server(tmp_path, free_port):
    model = fake_job(tmp_path, free_port, verdict="does_not_fit").run()
    assert model.status == "skipped" and model.plan.reasons == ["a reason"]
    record = written(model)
    stored = json.loads((tmp_path / "results/demo/configs/tp1/record.json").read_text())
    assert stored == record and stored == {  # the skipped record as the job wrote it when it was a dict
        "trial": "demo", "configuration": "tp1", "description": "", "status": "skipped", "failure": None,
        "server": {"argv": record["server"]["argv"], "env": {}, "host": "127.0.0.1", "port": free_port,
                   "log": "server.log"},
        "startup": {}, "engine_warnings": [], "cold_start": {}, "scenarios": [], "telemetry": {"file": "telemetry.csv"},
        "timing": {"job_start": model.timing.job_start, "job_end": model.timing.job_end,
                   "wall_s": model.timing.job_end - model.timing.job_start},
        "plan": {"verdict": "does_not_fit", "reasons": ["a reason"], "forced": False}, "prediction": []}
    assert (tmp_path / "results/demo/configs/tp1/telemetry.csv").read_text().count("\n") == 1
    assert not (tmp_path / "results/demo/ledger.jsonl").exists()


def test_the_cold_first_request_records_its_tokens_and_their_rate(tmp_path, completions_server):
    host, port = completions_server
    job = fake_job(tmp_path, port)
    facts = job.measurement().first_request().model_dump(exclude_unset=True)
    source = "first streamed completion after ready"
    assert facts["first_output_tokens"] == {"value": 2, "kind": "measured", "source": source, "unit": "tokens"}
    rate = facts["first_output_tok_s"]
    assert rate["kind"] == "measured" and rate["source"] == source and rate["unit"] == "tok/s"
    assert rate["value"] == round(2 / facts["first_total_s"]["value"], 3)
    record = read_record(DATA / "demo" / "tp1.json")
    record["cold_start"].update(facts)
    check_record(record, "configuration")
    record["cold_start"]["first_output_tokens"]["unit"] = "s"
    with pytest.raises(ValueError, match="first_output_tokens"):
        check_record(record, "configuration")


#: What differs between two runs of one job: clocks, pids, ports, paths, and what the host measured.
VOLATILE = {("cold_start", "ready_seconds", "value"), ("failure", "log_tail"), ("gpu_census", "checked_at"),
            ("server", "argv"), ("server", "launched_at"), ("server", "pid"), ("server", "port"),
            ("server", "ready_at"), ("server", "stop", "stop_seconds"), ("telemetry", "sampler"),
            ("telemetry", "startup_window"), ("timing",)}


def stable(value, path=()):
    """The record with what :data:`VOLATILE` names replaced by its type's name."""
    if path in VOLATILE:
        return type(value).__name__
    if isinstance(value, dict):
        return {k: stable(v, (*path, k)) for k, v in value.items()}
    return [stable(v, path) for v in value] if isinstance(value, list) else value


def test_the_jobs_record_is_the_one_it_wrote_before_its_phases_were_split(tmp_path, free_port):
    """tests/data/records/fake-job-cold-start-failure.json is the record this job wrote before
    it was split into readiness, measurement and comparison, with what differs between runs
    replaced by its type: the record's keys and every stable value are the same, the keys in the
    order of the model's fields (the order write_record writes a model in)."""
    record = written(fake_job(tmp_path, free_port).run())
    stored = json.loads((DATA / "records" / "fake-job-cold-start-failure.json").read_text())
    assert json.loads(json.dumps(stable(record))) == stored
    fields = list(ConfigurationRecord.model_fields)
    assert list(record) == sorted(stored, key=lambda k: fields.index(k) if k in fields else len(fields))
    assert list(json.loads((tmp_path / "results/demo/configs/tp1/record.json").read_text())) == list(record)
