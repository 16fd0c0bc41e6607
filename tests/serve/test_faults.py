"""Fault injection with real vLLM: the host is always given back.

Each test runs a one-configuration trial with a resident demo service and breaks it: a
server crash mid-benchmark, SIGTERM to snakemake mid-trial, ``kill -9`` of snakemake
followed by ``snakemake cleanup``. Each must end with the service restored and healthy
and no trial process left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import SNAKEFILE, free_ports, wait_until
from llmtrial.core.ledger import Entry, Ledger
from llmtrial.host.process_groups import group_members, port_open
from llmtrial.patch.patching import revert_patches, verify_files
from llmtrial.serve.telemetry import read_samples
from workflow_helpers import SNAKEMAKE, default_config, demo_service, snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.workflow]


@pytest.fixture
def small_trial(tmp_path):
    """A one-configuration trial and a running demo service; the service is stopped after."""
    server_port, demo_port = free_ports(2)
    config = default_config()
    config["configurations"] = {"tp1": config["configurations"]["tp1"]}
    config["scenarios"] = {"c1": {"concurrency": 1, "num_prompts": 200, "input_len": 64, "output_len": 64, "passes": 1}}
    config["serving"]["base_port"] = server_port
    config["serving"]["args"]["enforce_eager"] = True  # no torch.compile at start-up: these tests are about faults
    config["services"] = {"demo-web": demo_service(tmp_path / "demo", demo_port)}
    subprocess.run(config["services"]["demo-web"]["start"], check=True, timeout=60)
    write_config(tmp_path, config)
    yield {"work": tmp_path, "results": tmp_path / "results" / "demo", "config": config, "demo_port": demo_port,
           "server_port": server_port}
    subprocess.run(config["services"]["demo-web"]["stop"], timeout=60)
    revert_patches(Ledger(tmp_path / "results" / "demo" / "ledger.jsonl"))  # never leave vLLM patched


def start_workflow(trial) -> subprocess.Popen:
    """snakemake in the background, its output in <work>/snakemake.out for a failure's message."""
    out = open(trial["work"] / "snakemake.out", "w")  # noqa: SIM115 - the child writes it; closed with the test's tmp
    proc = subprocess.Popen([SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(trial["work"]),
                             "--cores", "all"], stdout=out, stderr=subprocess.STDOUT)
    proc.output_path = trial["work"] / "snakemake.out"  # type: ignore[attr-defined]
    return proc


def wait_for(predicate, timeout: float, what: str, wf: subprocess.Popen | None = None) -> None:
    """Poll ``predicate`` until it holds; fail at once, with snakemake's output, if ``wf`` ends first."""

    def held() -> bool:
        if predicate():
            return True
        if wf is not None and wf.poll() is not None:
            out = wf.output_path.read_text()[-3000:]  # type: ignore[attr-defined]
            raise AssertionError(f"snakemake exited ({wf.returncode}) before {what}:\n{out}")
        return False

    wait_until(held, what, timeout=timeout, poll=0.5)


def ledger_entries(trial) -> list[Entry]:
    return Ledger(trial["results"] / "ledger.jsonl").entries()


def started(trial, action: str) -> Entry | None:
    return next((e for e in ledger_entries(trial) if e.action == action), None)


def patched_files(trial) -> list[str]:
    """The vLLM files the trial's demo patch (mode file, from the default trial) changed."""
    return sorted({e.path for e in ledger_entries(trial) if e.action == "patch_file"})


def assert_host_given_back(trial) -> None:
    assert patched_files(trial), "the demo patch was never applied"
    assert all(f["matches"] for f in verify_files(patched_files(trial))), "vLLM left patched"
    status = subprocess.run(trial["config"]["services"]["demo-web"]["status"], timeout=30)
    assert status.returncode == 0 and port_open("127.0.0.1", trial["demo_port"]), "demo service not restored"
    server = started(trial, "server_started")
    assert group_members(server.pgid, not_before=server.launched_at) == [], "a trial server survived"
    assert not port_open("127.0.0.1", trial["server_port"])
    for job in (e for e in ledger_entries(trial) if e.action == "job_started"):
        try:
            import psutil

            proc = psutil.Process(job.pid)
            alive = abs(proc.create_time() - job.create_time) < 1 and proc.status() != psutil.STATUS_ZOMBIE
        except Exception:
            alive = False
        assert not alive, f"configuration job {job.pid} survived"


def sampled_in_pass(trial, stem: str) -> bool:
    """Whether the pass ``stem`` is in flight (its window opened and not closed) and a /metrics sample was taken
    since it opened: what the record's account of a server found down reads (its gauges are what they happened
    to be: at concurrency 1 a sample can fall between two requests, and vLLM's running gauge read 0 in every
    sample of one such pass)."""
    telemetry = trial["results"] / "configs" / "tp1" / "telemetry.csv"
    if not telemetry.exists():
        return False
    df = read_samples(telemetry)  # a line the sampler is still writing reads as NaN
    windows = df[df["source"] == "window"]
    starts = windows[windows["metric"] == f"{stem}:start"]
    if starts.empty or (windows["metric"] == f"{stem}:end").any():
        return False
    sampled = df[(df["source"] == "metrics") & (df["metric"] == "running") & (df["t"] >= starts["t"].max())
                 & df["value"].notna()]
    return not sampled.empty


def test_a_server_crash_mid_benchmark_is_a_result_and_the_host_is_restored(small_trial):
    # 5,000 requests of 64 tokens one at a time: the pass cannot end before the kill, whatever the speed; the kill
    # follows a /metrics sample inside the pass's window
    small_trial["config"]["scenarios"]["c1"]["num_prompts"] = 5000
    write_config(small_trial["work"], small_trial["config"])
    wf = start_workflow(small_trial)
    try:
        wait_for(lambda: sampled_in_pass(small_trial, "c1-pass1"), 600, "a /metrics sample of the first pass", wf)
        server = started(small_trial, "server_started")
        os.killpg(server.pgid, signal.SIGKILL)  # the server dies mid-benchmark
        assert wf.wait(timeout=600) == 0  # a failed configuration is a result: the workflow finishes
    finally:
        if wf.poll() is None:
            wf.kill()
    record = json.loads((small_trial["results"] / "configs" / "tp1" / "record.json").read_text())
    assert record["status"] == "failed" and record["failure"]["phase"] == "benchmark"
    assert "during scenario c1 (c1-pass1)" in record["failure"]["message"]  # the pass it was killed in
    down = record["failure"]["down"]  # a pass was sending: not idle, whatever the gauge read between two requests
    assert down["idle"] is False and down["pass_in_flight"] == "c1-pass1"
    assert ("tp1&#39;s server died under load, while pass c1-pass1 was sending requests (its last /metrics sample "
            "showed") in (small_trial["results"] / "report.html").read_text()
    assert (small_trial["results"] / "report.html").exists()
    assert json.loads((small_trial["results"] / "cleanup" / "record.json").read_text())["restored"]
    assert_host_given_back(small_trial)


def test_sigterm_to_snakemake_mid_trial_gives_the_host_back(small_trial):
    # Snakemake lets a running job finish after SIGTERM: a short pass keeps that wait short
    small_trial["config"]["scenarios"]["c1"]["num_prompts"] = 8
    write_config(small_trial["work"], small_trial["config"])
    wf = start_workflow(small_trial)
    try:
        wait_for(lambda: started(small_trial, "server_started") is not None, 600, "the trial server", wf)
        time.sleep(2)
        wf.send_signal(signal.SIGTERM)
        assert wf.wait(timeout=600) != 0  # only a guard against hanging: snakemake lets the job finish
    finally:
        if wf.poll() is None:
            wf.kill()
    assert_host_given_back(small_trial)
    assert json.loads((small_trial["results"] / "cleanup" / "on-error.json").read_text())["restored"]


def test_kill_9_of_snakemake_then_snakemake_cleanup_gives_the_host_back(small_trial):
    wf = start_workflow(small_trial)
    try:
        wait_for(lambda: started(small_trial, "server_started") is not None, 600, "the trial server", wf)
        time.sleep(2)
        wf.kill()  # SIGKILL: no onerror, the job and its server are orphaned
        wf.wait(timeout=60)
    finally:
        if wf.poll() is None:
            wf.kill()
    assert not port_open("127.0.0.1", small_trial["demo_port"])  # still quieted
    assert not any(f["matches"] for f in verify_files(patched_files(small_trial)))  # still patched
    out = snakemake(small_trial["work"], "cleanup", "--cores", "1", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    record = json.loads((small_trial["results"] / "cleanup" / "on-demand.json").read_text())
    assert record["restored"], record["residues"]
    # the on-demand run changed nothing itself: all it undid, the killed run left behind
    left = record["left_behind"]
    assert record["services"] == [] and record["patches"] == [] and record["jobs"] == []
    assert [s["name"] for s in left["services"]] == ["demo-web"] and left["services"][0]["restored_by_run"] == record["run"]
    assert [p["reverted_by_run"] for p in left["patches"]] == [record["run"]]
    assert [j["action"] for j in left["jobs"]] == ["stopped"]
    assert_host_given_back(small_trial)
