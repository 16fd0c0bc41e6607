"""Checkpoint sizes from config.json: parameter counts against published totals, bytes by quantization."""

from __future__ import annotations

import json

import pytest

from conftest import DATA
from llmtrial.plan.checkpoint import UnknownCheckpoint, estimate, parameter_parts, quantization

GB = 1e9
GiB = 2**30


def config(name: str) -> dict:
    """A real model's config.json (tests/data/configs, the fields as the model's repository publishes them)."""
    return json.loads((DATA / "configs" / f"{name}.json").read_text())


@pytest.mark.parametrize("name,published,rel", [
    ("Meta-Llama-3.1-8B-Instruct", 8_030_261_248, 1e-9),      # Meta's exact count
    ("Qwen2.5-7B-Instruct-AWQ", 7.61e9, 1e-3),                 # Qwen2.5-7B: "7.61B"
    ("Qwen3-235B-A22B-Instruct-2507-FP8", 235e9, 2e-3),        # "235B in total, 22B activated"
    ("Qwen3-30B-A3B", 30.5e9, 2e-3),                           # "30.5B in total"
    ("Mixtral-8x7B-v0.1", 46.7e9, 1e-3),                       # "46.7B"
    ("DeepSeek-V3", 671e9, 1e-3),                              # 671B without the 14B multi-token-prediction module
])
def test_parameter_count_matches_the_published_total(name, published, rel):
    """Published totals at the precision they are published with."""
    assert sum(parameter_parts(config(name)).values()) == pytest.approx(published, rel=rel)


def test_hybrid_linear_attention_moe_is_counted_within_one_percent():
    # Qwen3-Next-80B-A3B: "80B in total"; gated DeltaNet in three of four layers, 512 experts
    parts = parameter_parts(config("Qwen3-Next-80B-A3B-Instruct"))
    assert sum(parts.values()) == pytest.approx(80e9, rel=0.01)
    assert parts["linear_attention"] > 0 and parts["attention"] > 0 and parts["shared_experts"] > 0


def test_seed_003_fp8_checkpoint_is_its_download_size():
    # seed 003: "23 shards of exactly 10.00 GB and a 24th holding the remaining 6.45 GB, for 236.45 GB in total"
    size = estimate(config("Qwen3-235B-A22B-Instruct-2507-FP8"))
    assert size.kind == "estimated"
    assert size.bytes / GB == pytest.approx(236.45, rel=0.002)
    assert "FP8 (block 128x128 scales)" in size.source and "lm_head" in size.source


def test_seed_001_awq_model_downloads_5_57_gb_and_loads_5_2_gib():
    size = estimate(config("Qwen2.5-7B-Instruct-AWQ"))
    assert size.bytes / GB == pytest.approx(5.57, rel=0.005)
    assert size.bytes / GiB == pytest.approx(5.2, abs=0.05)
    assert "AWQ 4-bit, group 128, zero points" in size.source


def test_gptq_int4_llama_8b_is_near_its_repository_size():
    # hugging-quants/Meta-Llama-3.1-8B-Instruct-GPTQ-INT4: 5.74 GB of safetensors
    size = estimate(config("Meta-Llama-3.1-8B-Instruct-GPTQ-INT4"))
    assert size.bytes / GB == pytest.approx(5.74, rel=0.02)


def test_bf16_checkpoint_is_two_bytes_a_parameter():
    assert estimate(config("Meta-Llama-3.1-8B-Instruct")).bytes == 2 * 8_030_261_248


def test_modules_not_converted_stay_at_the_model_dtype():
    cfg = config("Qwen3-30B-A3B")
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    plain = estimate({**cfg, "quantization_config": fp8}).parts
    kept = estimate({**cfg, "quantization_config": {**fp8, "modules_to_not_convert": [
        "lm_head", "model.layers.*.self_attn", "re:.*mlp.gate$"]}}).parts
    assert kept["attention"] == 2 * parameter_parts(cfg)["attention"] and plain["attention"] < kept["attention"]
    assert kept["experts"] == plain["experts"]


@pytest.mark.parametrize("qc,per", [
    ({"quant_method": "mxfp4"}, 0.5 + 1 / 32),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, 0.5 + 1 / 64 + 4 / 16384),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 1.0),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
      "ignore": ["lm_head"]}, 1.0),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                                           "symmetric": True}}}, "ignore": ["lm_head"]}, 0.5 + 2 / 128),
])
def test_bytes_per_converted_parameter(qc, per):
    got, converted, _ = quantization({"quantization_config": qc})
    assert got == pytest.approx(per)
    assert "lm_head" not in converted
    if qc["quant_method"] == "mxfp4":  # gpt-oss: MXFP4 experts, everything else at the model's dtype
        assert converted == {"experts"}


def test_an_unknown_quantization_method_is_unknown_not_bf16():
    with pytest.raises(UnknownCheckpoint, match="quantization method 'hqq'"):
        estimate({**config("Qwen3-30B-A3B"), "quantization_config": {"quant_method": "hqq"}})


def test_an_unknown_architecture_is_unknown_with_the_reason():
    with pytest.raises(UnknownCheckpoint, match="architecture Qwen2_5_VLForConditionalGeneration"):
        estimate({"architectures": ["Qwen2_5_VLForConditionalGeneration"], "hidden_size": 2560})
