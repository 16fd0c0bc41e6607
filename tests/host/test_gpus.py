"""The GPUs a trial uses: selection, the census before launch, and the health check after a failure.

This machine has no GPU: NVML, CUDA in the fresh process and the kernel log are played by the
test double tests/gpu_double.py (named as such in every record it feeds), except where a test
runs the real health program against this machine's torch, which has no CUDA.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, REPO, written
from llmtrial.core.configuration_spec import ServingSpec
from llmtrial.core.ledger import Action, Ledger, replay
from llmtrial.core.preflight_model import GpuDevice, Gpus, SelectedGpu
from llmtrial.core.trial_config import DiskBlock, HardwareBlock, HealthCheckBlock, PlanBlock, SourceBlock
from llmtrial.host import gpus
from llmtrial.host.gpus import SelectionError, select

DOUBLE = REPO / "tests" / "gpu_double.py"
#: A pid no process of this machine has (above the kernel's default pid_max of 4194304 - 1).
FOREIGN_PID = 4194303
XID_79 = "[ 8123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid=2211, name=python3, GPU has fallen off the bus."


def host(tmp_path, **changes) -> dict:
    """A two-GPU host for the double; returns the scenario (write it again with ``write``)."""
    scenario = {"gpus": [{"uuid": "GPU-7f3e0c1a-0000", "pci": "00000000:17:00.0"},
                         {"uuid": "GPU-7f3e0c1a-0001", "pci": "00000000:18:00.0", "memory_gib": 80}],
                "processes": {}, "allocation": "ok", "dmesg": [], **changes}
    scenario["path"] = str(tmp_path / "scenario.json")
    write(scenario)
    return scenario


def write(scenario: dict) -> None:
    Path(scenario["path"]).write_text(json.dumps(scenario))


@pytest.fixture
def double(tmp_path, monkeypatch):
    scenario = host(tmp_path)
    monkeypatch.setenv(gpus.DOUBLE_ENV, str(DOUBLE))
    monkeypatch.setenv("GPU_DOUBLE_SCENARIO", scenario["path"])
    return scenario


def inventory():
    from llmtrial.lifecycle.preflight import gpu_inventory

    return gpu_inventory()


def inventory_devices() -> list[GpuDevice]:
    return [GpuDevice.model_validate(d) for d in inventory()["devices"]]


# --------------------------------------------------------------------------- selection


def test_the_selection_takes_every_gpu_a_count_or_the_listed_indexes_and_uuids(double):
    devices = inventory_devices()
    assert inventory()["source"] == f"nvml double ({DOUBLE})"
    assert [g.index for g in select(None, devices)] == [0, 1]
    assert [g.index for g in select(1, devices)] == [0]
    assert [g.index for g in select(["GPU-7f3e0c1a-0001", 0], devices)] == [1, 0]
    assert select([1], devices)[0].model_dump() == {"index": 1, "uuid": "GPU-7f3e0c1a-0001", "name": "NVIDIA H200",
                                       "pci_bus_id": "0000:18:00.0"}
    assert select(4, []) == []  # a count on a host NVML shows no GPU: the planner's assumption only


@pytest.mark.parametrize(("setting", "message"), [
    ([0, "GPU-nosuch"], "hardware.gpus[1]: no GPU 'GPU-nosuch' on this host (it has 0 (GPU-7f3e0c1a-0000), "
                        "1 (GPU-7f3e0c1a-0001))"),
    ([2], "hardware.gpus[0]: no GPU 2"),
    ([1, "GPU-7f3e0c1a-0001"], "hardware.gpus[1]: GPU 'GPU-7f3e0c1a-0001' is listed twice"),
    (3, "hardware.gpus: 3 GPUs asked for, this host has 2"),
])
def test_a_gpu_the_host_lacks_is_named_with_its_key(double, setting, message):
    with pytest.raises(SelectionError, match=re.escape(message)):
        select(setting, inventory_devices())


def test_preflight_records_the_selection_and_the_kernel_logs_baseline_and_stops_on_a_missing_gpu(double, tmp_path):
    from llmtrial.lifecycle.preflight import PreflightError, run_preflight

    double["dmesg"] = [XID_79]
    write(double)
    disk, tiny = DiskBlock(reserve_fraction=0, reserve_min_gib=0), SourceBlock(kind="tiny")
    record = run_preflight(source=tiny, staging_dir=tmp_path, disk=disk, hardware=HardwareBlock(gpus=[1]))
    assert record.environment.gpus.selected == [1]
    assert record.environment.gpus.selected_gpus[0].uuid == "GPU-7f3e0c1a-0001"
    assert written(record.kernel_log) == {"available": True, "reason": None, "lines": [XID_79], "source": "double"}
    with pytest.raises(PreflightError, match=r"gpu_selection: hardware.gpus\[0\]: no GPU 'GPU-gone'"):
        run_preflight(source=tiny, staging_dir=tmp_path, disk=disk, hardware=HardwareBlock(gpus=["GPU-gone"]))


def test_the_planner_sizes_the_selected_gpus_only(double):
    from llmtrial.plan.planner import plan_record

    selection = Gpus.model_validate({**inventory(), "selected": [1], "selected_gpus": select([1], inventory_devices())})
    config = json.loads((DATA / "configs" / "Meta-Llama-3.1-8B-Instruct.json").read_text())
    record = plan_record(spec=ServingSpec(name="tp1", args={}), model_config=config, weights=None,
                         gpus=selection, hardware=HardwareBlock(gpus=[1]), settings=PlanBlock())
    assert record.hardware.gpus == 1
    assert record.hardware.gpu_memory_gib == 80  # GPU 1's 80 GiB, not GPU 0's 141
    assert [g.uuid for g in record.hardware.selected_gpus] == ["GPU-7f3e0c1a-0001"]


def test_servers_are_pinned_by_uuid_in_pci_order():
    chosen = [SelectedGpu(index=2, uuid="GPU-b"), SelectedGpu(index=0, uuid="GPU-a")]
    assert gpus.visible_devices_env(chosen) == {"CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus.visible_devices_env([]) == {}


def test_telemetry_samples_only_the_selected_gpus(double):
    from llmtrial.host.telemetry_sources import NvmlSource

    source = NvmlSource(gpus=[1])
    sample = source.sample()
    assert source.origin == f"nvml double ({DOUBLE})"
    assert sample["gpu1.mem_total_bytes"] == 80 * 2**30
    assert not any(k.startswith("gpu0.") for k in sample)


# --------------------------------------------------------------------------- census


@pytest.fixture
def local_process():
    """A process of this host's, a child of this test and not the trial's (the test's own pid will not
    do: pytest-xdist's workers rename their command line)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_census_names_a_foreign_process_with_pid_user_command_and_memory(double, tmp_path, local_process):
    double["processes"] = {"1": [{"pid": FOREIGN_PID, "name": "tritonserver", "memory_gib": 8,
                                  "command": "/opt/tritonserver/bin/tritonserver --model-repository /models"}],
                           "0": [{"pid": local_process.pid, "memory_gib": 1}]}
    write(double)
    selected = select(None, inventory_devices())
    found, why = gpus.launch_check(Ledger(tmp_path / "l.jsonl"), selected, allow=[])
    found = found.model_dump()
    assert found["source"] == f"nvml double ({DOUBLE})"
    foreign = {p["pid"]: p for p in found["foreign"]}
    assert set(foreign) == {FOREIGN_PID, local_process.pid}
    assert foreign[FOREIGN_PID]["user"] == "unknown (not in this host's process table)"
    assert foreign[FOREIGN_PID]["memory_bytes"] == 8 * 2**30
    mine = foreign[local_process.pid]
    assert mine["user"] == __import__("getpass").getuser()
    assert mine["command"] == f"{sys.executable} -c import time; time.sleep(60)"
    assert f"pid {FOREIGN_PID} on GPU 1 (user unknown (not in this host's process table), /opt/tritonserver/bin/" \
           f"tritonserver --model-repository /models, 8.00 GiB)" in why
    assert "hardware.allow_processes" in why

    found, why = gpus.launch_check(Ledger(tmp_path / "l.jsonl"), selected,
                                   allow=["tritonserver", os.path.basename(sys.executable)])
    found = found.model_dump()
    assert why is None and found["foreign"] == []
    assert [p["allowed_by"] for p in found["processes"]] == [os.path.basename(sys.executable), "tritonserver"]
    only_0, _ = gpus.launch_check(Ledger(tmp_path / "l.jsonl"), select([0], inventory_devices()), allow=[])
    assert [p.pid for p in only_0.processes] == [local_process.pid]  # GPU 1's process is not the trial's business


def test_without_nvml_the_census_says_why_it_read_nothing(monkeypatch):
    monkeypatch.delenv(gpus.DOUBLE_ENV, raising=False)
    found = gpus.census([SelectedGpu(index=0, uuid=None)]).model_dump()
    assert found["processes"] == [] and found["foreign"] == []
    assert found["reason"] in ("nvidia-ml-py (pynvml) is not installed",) or found["reason"].startswith("NVML unavailable")


# --------------------------------------------------------------------------- health


def test_the_health_program_on_a_torch_without_cuda_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.delenv(gpus.DOUBLE_ENV, raising=False)
    result = gpus.allocation_check(SelectedGpu(index=0, uuid=None), nbytes=1024, timeout=120)
    assert result.status == "skipped"
    assert "torch.cuda.is_available() is False" in result.evidence


def test_a_failed_allocation_and_a_new_xid_on_its_pci_id_fail_the_gpu(double, tmp_path):
    baseline = ["[   3.1] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  575.51.03"]
    double.update(allocation="failed", dmesg=[*baseline, XID_79,
                                              "[ 9.0] NVRM: Xid (PCI:0000:99:00): 13, Graphics Exception"])
    write(double)
    ledger = Ledger(tmp_path / "l.jsonl")
    selected = select(None, inventory_devices())
    found = gpus.after_failure(ledger, selected, baseline, label="demo/tp1", settings=HealthCheckBlock(bytes=4096)).model_dump()
    by = {g["index"]: g for g in found["gpus"]}
    assert found["source"] == "double"
    assert by[1]["healthy"] is False and by[1]["xid"] == [XID_79]
    assert "illegal memory access" in by[1]["evidence"] and "GPU has fallen off the bus" in by[1]["evidence"]
    assert by[0]["xid"] == [] and by[0]["healthy"] is False  # the allocation fails on both
    assert "allocating 4096 bytes on GPU-7f3e0c1a-0000" in by[0]["allocation"]["evidence"]  # a process shown only GPU 0
    assert found["xid_other"] == ["[ 9.0] NVRM: Xid (PCI:0000:99:00): 13, Graphics Exception"]
    held = replay(ledger.entries()).open("gpus")
    assert [(e.gpu, e.uuid, e.label) for e in held] == [(0, "GPU-7f3e0c1a-0000", "demo/tp1"),
                                                                 (1, "GPU-7f3e0c1a-0001", "demo/tp1")]


def test_a_held_gpu_keeps_its_service_stopped_until_a_later_check_passes(double, tmp_path):
    from llmtrial.host.services import Service, restore

    flag = tmp_path / "svc-running"
    py = [sys.executable, "-c"]
    svc = Service.from_config("tts", {
        "kind": "command", "gpus": ["GPU-7f3e0c1a-0001"],
        "status": [*py, f"import os, sys; sys.exit(0 if os.path.exists({str(flag)!r}) else 3)"],
        "stop": [*py, f"import os; os.remove({str(flag)!r})"], "start": [*py, f"open({str(flag)!r}, 'w')"],
        "timeouts": {"health_s": 5}})
    ledger = Ledger(tmp_path / "l.jsonl")
    ledger.append(Action.SERVICE_QUIET, service=svc.to_json(), was_running=True, state_seen="running")
    double.update(allocation="failed")
    write(double)
    gpus.after_failure(ledger, select([1], inventory_devices()), [], label="demo/tp1")
    residues: list = []
    held = gpus.recheck_failed(ledger, residues)
    back = restore(ledger.entries(), ledger, held=held)
    assert not flag.exists() and back.services[0].held_by_gpu == 1
    assert [r.kind for r in [*residues, *back.residues]] == ["gpu", "service"]
    assert residues[0].what == "GPU 1 (GPU-7f3e0c1a-0001)" and "illegal memory access" in residues[0].seen
    assert "services.tts.start_on_failed_gpu" in back.residues[0].seen

    double.update(allocation="ok")  # the GPU was reset: the next cleanup checks it again
    write(double)
    held = gpus.recheck_failed(ledger, residues := [])
    back = restore(ledger.entries(), ledger, held=held)
    assert held == [] and residues == [] and back.residues == [] and flag.exists()
    assert replay(ledger.entries()).open("gpus") == []


def test_an_env_that_pins_the_gpus_itself_beside_a_gpu_list_is_refused_naming_the_key():
    from llmtrial.config import ConfigError, validate_config
    from workflow_helpers import default_config

    config = default_config()
    config["hardware"] = {"gpus": ["GPU-7f3e0c1a-0000"]}
    config["configurations"]["tp2"]["env"]["CUDA_VISIBLE_DEVICES"] = "1"
    with pytest.raises(ConfigError, match=r"key 'configurations.tp2.env.CUDA_VISIBLE_DEVICES': hardware.gpus lists"):
        validate_config(config)
    config["hardware"] = {"gpus": 2}  # a count leaves the env's own choice alone
    validate_config(config)
