"""The workflow without running vLLM: DAG shape, config validation, lint."""

from __future__ import annotations

import pytest

from workflow_helpers import NO_VLLM, default_config, job_counts, snakemake, write_config


@pytest.mark.workflow
def test_dry_run_has_one_trial_job_per_configuration(tmp_path):
    config = default_config()
    config["configurations"]["tp4"] = {"args": {"tensor_parallel_size": 4}}
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "-n")
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == {
        "preflight": 1, "plan": 3, "stage_model": 1, "quiet": 1, "patch": 1, "trial": 3, "cleanup_trial": 1, "report": 1, "export": 1, "all": 1}
    for name in ("tp1", "tp2", "tp4"):
        assert f"results/demo/configs/{name}/record.json" in out.stdout


@pytest.mark.workflow
def test_one_configuration_can_be_asked_for_alone(tmp_path):
    write_config(tmp_path, default_config())
    out = snakemake(tmp_path, "-n", "results/demo/configs/tp2/record.json")
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == {"preflight": 1, "plan": 1, "stage_model": 1, "quiet": 1, "patch": 1, "trial": 1}


@pytest.mark.workflow
def test_an_unknown_key_fails_the_dry_run_naming_it(tmp_path):
    config = default_config()
    config["serving"]["startup_timeout"] = 5
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "-n")
    assert out.returncode != 0
    assert "serving.startup_timeout" in out.stdout + out.stderr


@pytest.mark.workflow
def test_a_wrong_type_fails_the_dry_run_naming_the_key(tmp_path):
    config = default_config()
    config["scenarios"]["c4"]["concurrency"] = "four"
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "-n")
    assert out.returncode != 0
    assert "scenarios.c4.concurrency" in out.stdout + out.stderr


@pytest.mark.workflow
def test_lint_passes():
    from conftest import REPO

    out = snakemake(REPO, "--lint")
    assert out.returncode == 0, out.stdout + out.stderr


def test_python_code_passes_ruff():
    import subprocess
    import sys
    from pathlib import Path

    from conftest import REPO

    ruff = Path(sys.executable).parent / "ruff"
    out = subprocess.run([str(ruff), "check", "workflow", "tests", "benchmarks"], cwd=REPO,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout


@pytest.mark.workflow
def test_a_failing_stage_stops_the_run_and_onerror_cleans_up(tmp_path, monkeypatch):
    import json

    config = default_config()
    config["model"]["source"] = {"kind": "hub", "repo_id": "org/model"}
    base = config["serving"]["base_port"]  # the test's own (default_config): cleanup checks them closed
    write_config(tmp_path, config)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no Hub, no staged copy, no archive: the stage fails
    out = snakemake(tmp_path, "--cores", "1")
    assert out.returncode != 0
    assert "llmtrial cleanup after error: host restored" in out.stdout + out.stderr
    record = json.loads((tmp_path / "results/demo/cleanup/on-error.json").read_text())
    assert record["restored"] and {p["port"] for p in record["ports"]} == {base, base + 1}
    log = (tmp_path / "results/demo/logs/stage_model.log").read_text()
    assert "cannot stage org/model@main: HF_HUB_OFFLINE is set, and there is no verified copy" in log


@pytest.mark.workflow
def test_snakemake_cleanup_stops_what_a_killed_run_left(tmp_path, free_port):
    import json

    from conftest import fake_server
    from llmtrial.core.ledger import Ledger
    from llmtrial.host.process_groups import group_members, port_open

    config = default_config()
    config["serving"]["base_port"] = free_port
    write_config(tmp_path, config)
    results = tmp_path / "results" / "demo"
    server = fake_server(tmp_path, free_port, ledger=Ledger(results / "ledger.jsonl"))
    server.start()
    server.wait_ready(timeout=60, poll=0.1)
    out = snakemake(tmp_path, "cleanup", "--cores", "1")
    server.proc.poll()
    assert out.returncode == 0, out.stdout + out.stderr
    record = json.loads((results / "cleanup" / "on-demand.json").read_text())
    # the killed run's server, stopped by this (on-demand) run: left behind, not this run's own
    assert record["restored"] and record["servers"] == [] and record["left_behind"]["servers"][0]["action"] == "stopped"
    assert group_members(server.pgid) == [] and not port_open("127.0.0.1", free_port)
    assert not (results / "configs").exists()  # no trial ran first


@pytest.mark.workflow
def test_short_disk_stops_the_trial_before_staging(tmp_path):
    config = default_config()
    config["disk"] = {"reserve_min_gib": 10**7}
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "--cores", "1")
    assert out.returncode != 0
    log = (tmp_path / "results/demo/logs/preflight.log").read_text()
    assert "not enough disk for the weights" in log and "(staging): needs" in log and "free of" in log
    assert not (tmp_path / "staging").exists() and not (tmp_path / "results/demo/model").exists()


@pytest.mark.workflow
def test_a_service_that_will_not_restart_fails_the_run_with_a_residue(tmp_path):
    import json

    from llmtrial.core.ledger import Ledger
    from llmtrial.host.services import Service

    config = default_config()
    write_config(tmp_path, config)
    broken = Service.from_config("tts", {"kind": "command", "status": ["false"], "stop": ["true"], "start": ["false"],
                                         "timeouts": {"health_s": 1}})
    ledger = Ledger(tmp_path / "results/demo/ledger.jsonl")
    ledger.append("service_quiet", service=broken.to_json(), was_running=True)  # quieted by a run that then died
    out = snakemake(tmp_path, "cleanup", "--cores", "1")
    assert out.returncode != 0
    assert "not fully restored" in out.stdout + out.stderr
    record = json.loads((tmp_path / "results/demo/cleanup/on-demand.json").read_text())
    assert not record["restored"] and [r["what"] for r in record["residues"]] == ["tts"]


@pytest.mark.workflow
@pytest.mark.hostwide  # reads the installed vLLM's patch target, which the e2e trials patch
def test_a_service_whose_state_is_unknown_stops_the_trial_before_any_server(tmp_path):
    """A `command` service whose status executable is missing: the quiet stage stops nothing,
    names the service and quotes what it saw; no server starts, no patch is applied."""
    import json

    from llmtrial.core.ledger import Ledger
    from llmtrial.patch.patching import verify_files

    config = default_config()
    missing = str(tmp_path / "bin" / "tts-status")
    config["services"] = {"tts": {"kind": "command", "status": [missing], "stop": ["true"], "start": ["true"]}}
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "--cores", "1", timeout=600)
    assert out.returncode != 0
    log = (tmp_path / "results/demo/logs/quiet.log").read_text()
    assert "service tts (command): state unknown:" in log and f"`{missing}` could not run: FileNotFoundError" in log
    actions = [e.action for e in Ledger(tmp_path / "results/demo/ledger.jsonl").entries()]
    assert not {"service_quiet", "service_stopped", "patch_file", "server_launch", "job_started"} & set(actions)
    assert not (tmp_path / "results/demo/configs").exists() and not (tmp_path / "results/demo/patches").exists()
    assert all(v["matches"] for v in verify_files(["vllm/v1/worker/cpu_worker.py"]))  # the demo patch's target
    record = json.loads((tmp_path / "results/demo/cleanup/on-error.json").read_text())
    assert record["restored"] and record["services"] == []


@pytest.mark.workflow
def test_snakemake_report_bundles_every_record_of_a_trial_with_a_failed_and_a_skipped_configuration(tmp_path):
    import json

    from conftest import free_ports
    from llmtrial.host.process_groups import port_open
    from workflow_helpers import assert_snakemake_report_bundles

    config = default_config()
    config.update(services={}, patches={}, configurations=NO_VLLM)
    config["serving"]["base_port"] = next(p for p in free_ports(8) if not port_open("127.0.0.1", p + 1))
    write_config(tmp_path, config)
    run = snakemake(tmp_path, "--cores", "2", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = tmp_path / "results" / "demo"
    statuses = {name: json.loads((results / "configs" / name / "record.json").read_text())["status"] for name in NO_VLLM}
    assert statuses == {"noenc": "failed", "tp3": "skipped"}
    out = snakemake(tmp_path, "--cores", "1", "--report", "results/demo/snakemake-report.zip")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    bundled = assert_snakemake_report_bundles(tmp_path, results / "snakemake-report.zip", "demo", list(NO_VLLM))
    caption = bundled["results"]["results/demo/configs/noenc/record.json"]["caption"]
    assert "The outcome of configuration" in caption and "noenc" in caption
