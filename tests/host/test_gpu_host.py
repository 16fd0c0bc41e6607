"""A trial on a GPU host with someone else on the card, and a GPU that fails after a crash.

This machine has no GPU, so the host's GPU stack (NVML, CUDA in a fresh process, the kernel
log) is the test double tests/gpu_double.py; everything else is real: snakemake, the tiny
model, vLLM (the CPU build) refusing a bad flag, the resident demo service, the report.

Three runs in one results folder:
1. NVML lists a tritonserver on the selected GPU that the trial file does not allow: the
   configuration is not launched (no server starts), its record and the report name the
   process, and the demo service is restored.
2. The process is allowed by name; the server fails at start-up; the health check then finds
   the GPU failing (an allocation error, and a new Xid line on its PCI id): the GPU is held
   in the ledger, cleanup leaves the demo service that runs on it stopped (residues naming
   the GPU), and snakemake's exit status says the host was not restored.
3. The GPU is sound again; ``snakemake cleanup`` checks it, clears it and restores the service.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, free_ports
from llmtrial.core.ledger import Ledger
from llmtrial.core.records import read_record
from workflow_helpers import default_config, demo_service, snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.workflow]

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
        config["configurations"]["tp1"]["args"]["no_such_flag"] = 1  # vLLM refuses it at start-up
        write_config(work, config)
        scenario.update(allocation="failed",  # and the Xid once the server ran
                        dmesg_once={"path": str(results / "configs" / "tp1" / "server.log"), "text": "no-such-flag",
                                    "lines": [XID]})
        scenario_path.write_text(json.dumps(scenario))
        runs["crash"] = _run(work, results, config)

        scenario.update(allocation="ok")  # the GPU was reset
        scenario_path.write_text(json.dumps(scenario))
        proc = snakemake(work, "--cores", "all", "cleanup", timeout=300)
        runs["cleanup"] = {"proc": proc, "ledger": Ledger(results / "ledger.jsonl").entries(),
                           "record": read_record(results / "cleanup" / "on-demand.json"),
                           "service_running": service_running(config)}
        yield runs
    finally:
        mp.undo()
        subprocess.run(config["services"]["demo-web"]["stop"], timeout=60)


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
    assert record["status"] == "failed" and record["failure"]["phase"] == "startup", record["failure"]
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


def test_cleanup_clears_a_gpu_that_passes_again_and_restores_its_service(gpu_trial):
    run = gpu_trial["cleanup"]
    assert run["proc"].returncode == 0, run["proc"].stderr[-3000:]
    assert [e.action for e in run["ledger"] if e.action.startswith("gpu_")] == ["gpu_failed", "gpu_cleared"]
    assert run["record"]["restored"] and run["record"]["gpus_held"] == [] and run["service_running"]
