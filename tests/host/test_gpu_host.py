"""A trial on a GPU host with someone else on the card, and a GPU that fails after a crash.

This machine has no GPU, so the host's GPU stack (NVML, CUDA in a fresh process, the kernel
log) is the test double tests/gpu_double.py; everything else is real: snakemake, the tiny
model, vLLM (the CPU build) refusing a bad flag, the resident demo service, the report.

Three runs in one results folder:
1. NVML lists a tritonserver on the selected GPU that the trial file does not allow: the
   configuration is not launched (no server starts), its record and the report name the
   process, and the demo service is restored.
2. The process is allowed by name; the server serves its pass, then dies while the trial holds
   it idle (serving.idle_watch_s; the test kills it once a /metrics sample in the idle window
   shows no request, and the kernel log gains an Xid on the GPU's PCI id): the record calls it
   an idle crash with that Xid, the health check finds the GPU failing (an allocation error,
   the Xid), the GPU is held in the ledger, cleanup leaves the demo service that runs on it
   stopped (residues naming the GPU), and snakemake's exit status says the host was not
   restored.
3. The GPU is sound again; ``snakemake cleanup`` checks it, clears it and restores the service.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, free_ports
from llmtrial.core.ledger import Ledger
from llmtrial.core.records import read_record
from llmtrial.serve.telemetry import read_samples
from workflow_helpers import default_config, demo_service, snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.workflow, pytest.mark.aside]  # no patch, ports and service of its own

DOUBLE = REPO / "tests" / "gpu_double.py"
UUID = "GPU-5d1e0f3a-7c2b-4e11-9a0d-000000000000"
TRITON = {"pid": 4194303, "name": "tritonserver", "memory_gib": 8,
          "command": "/opt/tritonserver/bin/tritonserver --model-repository=/models"}
XID = "[ 9211.004211] NVRM: Xid (PCI:0000:17:00): 79, pid=31337, name=python3, GPU has fallen off the bus."


def service_running(config) -> bool:
    return subprocess.run(config["services"]["demo-web"]["status"], timeout=30).returncode == 0


@pytest.fixture(scope="module")
def gpu_trial(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu-host")
    server_port, demo_port = free_ports(2)
    scenario_path = work / "gpu-host.json"
    scenario = {"gpus": [{"uuid": UUID, "pci": "00000000:17:00.0", "pcie": [5, 5, 16, 16]}],
                "processes": {"0": [TRITON]}, "allocation": "ok", "dmesg": []}
    scenario_path.write_text(json.dumps(scenario))
    config = default_config()
    config["configurations"] = {"tp1": config["configurations"]["tp1"]}
    config["scenarios"] = {"c1": {"concurrency": 1, "num_prompts": 4, "input_len": 32, "output_len": 8, "passes": 1}}
    config["patches"] = {}
    del config["outputs"]  # no task set: the second run is about the server dying idle after its pass
    config["serving"]["args"]["enforce_eager"] = True
    config["telemetry"]["interval_s"] = 0.5
    config["serving"]["base_port"] = server_port
    config["hardware"] = {"gpus": [UUID]}
    config["services"] = {"demo-web": {**demo_service(work / "demo", demo_port), "gpus": [0]}}
    subprocess.run(config["services"]["demo-web"]["start"], check=True, timeout=60)
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMTRIAL_GPU_DOUBLE", str(DOUBLE))
    mp.setenv("GPU_DOUBLE_SCENARIO", str(scenario_path))
    results = work / "results" / "demo"
    runs = {}
    try:
        write_config(work, config)
        runs["foreign"] = _run(work, results, config)

        config["hardware"]["allow_processes"] = ["tritonserver"]
        config["serving"]["idle_watch_s"] = 600  # held idle until the test kills it (the run never waits it out)
        write_config(work, config)
        crash = IdleCrash(results, scenario, scenario_path)
        crash.start()
        try:
            runs["crash"] = _run(work, results, config)
        finally:
            crash.done.set()
            crash.join(timeout=60)
        assert crash.error is None and crash.killed, crash.error or "the server was never seen idle"

        config["serving"]["idle_watch_s"] = 0
        write_config(work, config)

        scenario.update(allocation="ok")  # the GPU was reset
        write_scenario(scenario_path, scenario)
        proc = snakemake(work, "--cores", "all", "cleanup", timeout=300)
        runs["cleanup"] = {"proc": proc, "ledger": Ledger(results / "ledger.jsonl").entries(),
                           "record": read_record(results / "cleanup" / "on-demand.json"),
                           "service_running": service_running(config)}
        yield runs
    finally:
        mp.undo()
        subprocess.run(config["services"]["demo-web"]["stop"], timeout=60)


def write_scenario(path: Path, scenario: dict) -> None:
    """The double's host, replaced whole (the double reads it at every call, from other processes)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(scenario))
    os.replace(tmp, path)


class IdleCrash(threading.Thread):
    """While the second run holds tp1's server idle: once a /metrics sample after the idle window's
    start shows no request running or waiting, the GPU fails (an Xid in the kernel log, allocations
    fail) and the server's process group is killed."""

    def __init__(self, results: Path, scenario: dict, scenario_path: Path) -> None:
        super().__init__(daemon=True)
        self.telemetry = results / "configs" / "tp1" / "telemetry.csv"
        self.ledger = Ledger(results / "ledger.jsonl")
        self.scenario, self.scenario_path = scenario, scenario_path
        self.done = threading.Event()
        self.killed = False
        self.error: str | None = None

    def idle_sampled(self) -> bool:
        """A /metrics sample after the idle window's start with no request running or waiting (a line the
        sampler is still writing reads as NaN)."""
        if not self.telemetry.exists():
            return False
        df = read_samples(self.telemetry)
        starts = df[(df["source"] == "window") & (df["metric"] == "idle:start")]
        if starts.empty:
            return False
        after = df[(df["source"] == "metrics") & (df["t"] > starts["t"].max()) & (df["value"] == 0)]
        return bool(set(after[after["metric"] == "running"]["t"]) & set(after[after["metric"] == "waiting"]["t"]))

    def run(self) -> None:
        deadline = time.monotonic() + 900
        try:
            while not self.done.is_set() and time.monotonic() < deadline:
                if self.idle_sampled():
                    self.scenario.update(allocation="failed", dmesg=[XID])
                    write_scenario(self.scenario_path, self.scenario)
                    server = next(e for e in self.ledger.entries() if e.action == "server_started")
                    os.killpg(server.pgid, signal.SIGKILL)
                    self.killed = True
                    return
                time.sleep(0.5)
        except Exception as exc:  # reported by the fixture
            self.error = repr(exc)


def _run(work: Path, results: Path, config: dict) -> dict:
    proc = snakemake(work, "--cores", "all", timeout=900)
    return {"proc": proc, "record": read_record(results / "configs" / "tp1" / "record.json"),
            "cleanup": read_record(results / "cleanup" / "record.json"),
            "ledger": Ledger(results / "ledger.jsonl").entries(),
            "report": (results / "report.html").read_text(), "service_running": service_running(config),
            "preflight": read_record(results / "preflight" / "record.json")}


def test_a_foreign_process_on_the_selected_gpu_keeps_the_configuration_from_launching(gpu_trial):
    run = gpu_trial["foreign"]
    assert run["proc"].returncode == 0, run["proc"].stderr[-3000:]
    record = run["record"]
    assert record["status"] == "failed" and record["failure"]["phase"] == "gpu_check"
    assert record["failure"]["reason"] == "gpu_in_use"
    assert f"pid {TRITON['pid']} on GPU 0 (user unknown (not in this host's process table), {TRITON['command']}, " \
           f"8.00 GiB)" in record["failure"]["message"]
    [proc] = record["gpu_census"]["foreign"]
    assert (proc["pid"], proc["uuid"], proc["memory_bytes"]) == (TRITON["pid"], UUID, 8 * 2**30)
    assert record["gpu_census"]["source"] == f"nvml double ({DOUBLE})"
    assert not any(e.action in ("server_launch", "server_started") for e in run["ledger"]), "a server was started"
    assert run["preflight"]["environment"]["gpus"]["selected"] == [0]
    assert run["preflight"]["environment"]["gpus"]["source"] == f"nvml double ({DOUBLE})"
    assert run["cleanup"]["restored"] and run["service_running"]
    assert "tp1 was not launched: pid 4194303 on GPU 0" in run["report"]
    assert "foreign: not launched" in run["report"] and TRITON["command"] in run["report"]


def test_an_allowed_process_is_shared_and_a_failed_gpu_after_a_crash_holds_its_service(gpu_trial):
    run = gpu_trial["crash"]
    record = run["record"]
    assert record["status"] == "failed" and record["failure"]["phase"] == "idle", record["failure"]
    assert [p["status"] for p in record["scenarios"][0]["pass_results"]] == ["ok"]  # served, then died idle
    assert record["server"]["env"]["CUDA_VISIBLE_DEVICES"] == UUID
    assert record["server"]["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert [p["allowed_by"] for p in record["gpu_census"]["processes"]] == ["tritonserver"]
    assert record["gpu_census"]["foreign"] == []
    [gpu] = record["gpu_health"]["gpus"]
    assert gpu["healthy"] is False and gpu["xid"] == [XID]
    assert gpu["allocation"]["status"] == "failed" and "illegal memory access" in gpu["allocation"]["evidence"]
    held = [e for e in run["ledger"] if e.action == "gpu_failed"]
    assert [(e.gpu, e.uuid, e.label) for e in held] == [(0, UUID, "demo/tp1")]
    kinds = {(r["kind"], r["what"]) for r in run["cleanup"]["residues"]}
    assert kinds == {("gpu", f"GPU 0 ({UUID})"), ("service", "demo-web")}
    assert not run["cleanup"]["restored"] and not run["service_running"]
    assert run["proc"].returncode != 0 and "was not fully restored" in run["proc"].stderr
    assert "After tp1 failed, GPU 0 (" in run["report"] and "GPU has fallen off the bus" in run["report"]
    assert "shared its GPUs with pid 4194303" in run["report"]


def test_a_server_that_dies_while_held_idle_is_an_idle_crash_with_the_xid_of_that_window(gpu_trial):
    run = gpu_trial["crash"]
    failure = run["record"]["failure"]
    assert (failure["reason"], failure["returncode"]) == ("exited", -9)
    assert "while held idle after the passes (no request sent)" in failure["message"]
    down = failure["down"]
    assert (down["idle"], down["running"], down["waiting"]) == (True, 0.0, 0.0)
    assert down["last_sample_at"] < down["found_down_at"]
    assert down["kernel_lines"] == [XID] and down["kernel_log"] is None  # the Xid of that window, once
    assert down["window"]["start"] == down["last_sample_at"] and down["window"]["end"] == down["found_down_at"]
    top = run["report"].split('<h2 id="charts">', 1)[0]
    assert "tp1&#39;s server crashed while idle, no request running or waiting" in top
    why = run["report"].split('<h2 id="why-it-failed">', 1)[1].split("<h2", 1)[0]
    assert ("tp1&#39;s server crashed while idle (its last /metrics sample showed no request running or waiting)"
            in why)
    assert f"The kernel log in that window: {XID}" in why and "The GPU check after it: GPU 0 failed" in why


def test_cleanup_clears_a_gpu_that_passes_again_and_restores_its_service(gpu_trial):
    run = gpu_trial["cleanup"]
    assert run["proc"].returncode == 0, run["proc"].stderr[-3000:]
    assert [e.action for e in run["ledger"] if e.action.startswith("gpu_")] == ["gpu_failed", "gpu_cleared"]
    assert run["record"]["restored"] and run["record"]["gpus_held"] == [] and run["service_running"]
