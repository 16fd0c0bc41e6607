"""The planner against the field reports' numbers and vLLM's own logs on this machine."""

from __future__ import annotations

import json
import time

import pytest

from conftest import DATA
from llmtrial.cli import main as cli_main
from llmtrial.logs import parse_startup, read_log
from llmtrial.plan import (
    Extras,
    GiB,
    Hardware,
    PlanError,
    ServingArgs,
    kv_bytes_per_token_per_layer,
    model_shape,
    plan,
    predict_kv_tokens,
    recommend_partition,
    split_layers,
)
from llmtrial.staging import model_config_for

#: Seed 003: Qwen3-235B-A22B-Instruct-2507-FP8 as its runbook describes it.
SEED_003 = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 94, "num_attention_heads": 64,
            "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096, "vocab_size": 151936,
            "torch_dtype": "bfloat16", "num_experts": 128, "moe_intermediate_size": 1536,
            "max_position_embeddings": 262144}
TINY = model_config_for({"kind": "tiny"})


def logged(name: str) -> dict:
    return parse_startup(read_log(DATA / name))


class TestSeed003:
    def test_kv_bytes_per_token_whole_and_per_gpu_at_tp4(self):
        p = plan(SEED_003, Hardware(gpus=4, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=4, max_model_len=32768),
                 weights_bytes=int(220 * GiB))
        assert p.data["kv_cache_bytes_per_token"] == 192_512
        assert p.data["kv_cache_bytes_per_token_per_rank"] == 48_128

    def test_token_count_from_the_logged_available_memory(self):
        p = plan(SEED_003, Hardware(gpus=4, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=4, max_model_len=32768),
                 available_kv_gib=27.85)
        assert abs(p.data["predicted_kv_cache_tokens"] - 621_392) / 621_392 < 0.001
        assert abs(p.data["max_concurrency"] - 18.96) < 0.02
        assert p.facts["predicted_kv_cache_tokens"]["kind"] == "predicted"

    def test_tp3_is_rejected_for_head_divisibility_in_under_a_second(self):
        t0 = time.perf_counter()
        p = plan(SEED_003, Hardware(gpus=3, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=3, max_model_len=32768),
                 weights_bytes=int(220 * GiB))
        assert time.perf_counter() - t0 < 1.0
        assert p.verdict == "does_not_fit"
        assert "Total number of attention heads (64) must be divisible by tensor parallel size (3)" in p.reasons[0]

    def test_estimated_memory_is_labelled_as_an_estimate(self):
        p = plan(SEED_003, Hardware(gpus=4, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=4, max_model_len=32768),
                 weights_bytes=int(220 * GiB))
        assert p.facts["available_kv_bytes_per_rank"]["kind"] == "estimated"
        assert p.facts["predicted_kv_cache_tokens"]["kind"] == "estimated"
        assert p.facts["weights_bytes"]["kind"] == "measured"
        assert abs(p.data["weights_bytes_per_rank"][0] - 55 * GiB) < 2**20


class TestSeed002:
    def test_last_stage_gets_no_more_than_12_layers(self):
        # 43 layers of about 3.33 GiB, a 12 GiB draft module on the last stage, layers 40-42 pinned there
        split = recommend_partition(43, 3, 3.33 * GiB, last_extra=12 * GiB, pinned_last_layers=3)
        assert sum(split) == 43 and split[-1] <= 12 and split[-1] >= 3
        heaviest = max(e + n * 3.33 for e, n in zip((0, 0, 12), split))
        assert heaviest <= 16 * 3.33 + 1e-9  # no worse than the field report's 16,16,11 / 15,16,12

    def test_planner_recommends_it_from_the_extras(self):
        cfg = {"num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
               "hidden_size": 4096, "vocab_size": 0, "torch_dtype": "bfloat16"}
        p = plan(cfg, Hardware(gpus=3, gpu_memory_gib=63.5), ServingArgs(pipeline_parallel_size=3, max_model_len=4096),
                 weights_bytes=int(43 * 3.33 * GiB), extras=Extras(last_stage_bytes=12 * GiB, pinned_last_layers=3))
        parts = [int(x) for x in p.data["pp_layer_partition"].split(",")]
        assert sum(parts) == 43 and parts[-1] <= 12


class TestThisMachine:
    """Predictions against what vLLM 0.32.0's CPU build logged here (1 GiB KV space per worker)."""

    @pytest.mark.parametrize("tp,log,expected", [(2, "vllm-0.32.0-cpu-tp2-server.log", 1_048_576)])
    def test_tensor_parallel(self, tp, log, expected):
        p = plan(TINY, Hardware(cpu_kv_space_gib=1), ServingArgs(tensor_parallel_size=tp, max_model_len=512))
        measured = logged(log)
        assert measured["kv_cache_tokens"]["value"] == expected
        assert p.data["predicted_kv_cache_tokens"] == expected
        assert p.data["max_concurrency"] == measured["max_concurrency"]["value"]

    def test_uneven_pipeline_split(self):
        args = ServingArgs.from_config({"pipeline_parallel_size": 2, "max_model_len": 512},
                                       {"VLLM_PP_LAYER_PARTITION": "3,1"})
        p = plan(TINY, Hardware(cpu_kv_space_gib=1), args)
        measured = logged("vllm-0.32.0-cpu-pp2-3-1-server.log")
        assert p.data["stage_layers"] == [3, 1]
        assert measured["kv_cache_tokens"]["value"] == 699_008
        assert abs(p.data["predicted_kv_cache_tokens"] - 699_008) / 699_008 < 0.001
        assert p.data["max_concurrency"] == measured["max_concurrency"]["value"]

    def test_tp1(self):
        p = plan(TINY, Hardware(cpu_kv_space_gib=1), ServingArgs(max_model_len=512))
        assert p.data["predicted_kv_cache_tokens"] == 524_288 and p.verdict == "fits"


class TestArithmetic:
    def test_kv_heads_are_replicated_when_tp_exceeds_them(self):
        shape = model_shape(SEED_003)
        assert kv_bytes_per_token_per_layer(shape, 8, 2) == (2048, 512)
        p = plan(SEED_003, Hardware(gpus=8, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=8, max_model_len=4096),
                 weights_bytes=int(220 * GiB))
        assert p.data["kv_heads_per_rank"] == 1
        assert any("replicates" in r for r in p.reasons)

    def test_mla_caches_one_latent_per_token_on_every_rank(self):
        cfg = {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168, "vocab_size": 129280,
               "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
        p = plan(cfg, Hardware(gpus=8, gpu_memory_gib=141), ServingArgs(tensor_parallel_size=8, max_model_len=8192),
                 weights_bytes=int(640 * GiB))
        assert p.data["kv_cache_bytes_per_token"] == 61 * 576 * 2
        assert p.data["kv_cache_bytes_per_token_per_rank"] == 61 * 576 * 2

    def test_fp8_kv_cache_halves_the_bytes(self):
        p = plan(SEED_003, Hardware(gpus=4, gpu_memory_gib=95),
                 ServingArgs(tensor_parallel_size=4, max_model_len=32768, kv_cache_dtype="fp8"), available_kv_gib=27.85)
        assert p.data["kv_cache_bytes_per_token_per_rank"] == 24_064

    def test_hybrid_layers_keep_state_per_sequence(self):
        cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
               "hidden_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16",
               "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}
        p = plan(cfg, Hardware(cpu_kv_space_gib=1), ServingArgs(max_model_len=1024))
        assert p.data["kv_cache_bytes_per_token"] == 1 * 2 * 2 * 64 * 2
        assert any("per sequence" in r for r in p.reasons)

    def test_sliding_window_layers_are_noted(self):
        cfg = {**TINY, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 2}
        p = plan(cfg, Hardware(cpu_kv_space_gib=1), ServingArgs(max_model_len=512))
        assert any("sliding-window" in r for r in p.reasons)

    def test_weights_that_do_not_fit_give_reasons_and_offload_can_rescue(self):
        args = ServingArgs(tensor_parallel_size=1, max_model_len=4096)
        p = plan(SEED_003, Hardware(gpus=1, gpu_memory_gib=95), args, weights_bytes=int(220 * GiB))
        assert p.verdict == "does_not_fit" and any("No memory left for the KV cache" in r for r in p.reasons)
        args.cpu_offload_gb = 180
        p = plan(SEED_003, Hardware(gpus=1, gpu_memory_gib=95), args, weights_bytes=int(220 * GiB))
        assert p.verdict == "fits_with_offload"

    def test_max_model_len_longer_than_the_cache_is_refused(self):
        p = plan(TINY, Hardware(cpu_kv_space_gib=1), ServingArgs(max_model_len=2_000_000))
        assert p.verdict == "does_not_fit" and "less than one request" in p.reasons[0]

    def test_preemption_boundary_counts_requests_of_each_context(self):
        p = plan(TINY, Hardware(cpu_kv_space_gib=1), ServingArgs(max_model_len=512), contexts=[96, 512])
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

    def test_a_missing_model_config_is_named(self, tmp_path, capsys):
        assert cli_main(["plan", "--model-config", str(tmp_path / "nope.json")]) == 2
        assert "nope.json" in capsys.readouterr().err
