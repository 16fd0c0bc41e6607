"""Architectures the planner counts beyond Llama/Qwen/Mixtral/DeepSeek: parameter counts from real
config.json files (tests/data/configs, sources in SOURCES.md) against the published counts, and the
sliding-window layers the shape reads from them."""

from __future__ import annotations

import json

import pytest

from conftest import DATA
from llmtrial.plan.checkpoint import UnknownCheckpoint, estimate, parameter_parts
from llmtrial.plan.shape import CACHED_KINDS, kv_layer_slots, model_shape


def config(name: str) -> dict:
    return json.loads((DATA / "configs" / f"{name}.json").read_text())


@pytest.mark.parametrize("name,published,within", [
    # https://huggingface.co/google/gemma-2-9b-it: "Model size 9.24B params"
    ("gemma-2-9b-it", 9.24e9, 0.005e9),
    # https://huggingface.co/microsoft/phi-4: "Model size 14.7B params"
    ("phi-4", 14.7e9, 0.05e9),
    # https://huggingface.co/microsoft/phi-2: "Model size 2.78B params" (the card's text rounds it down to 2.7 billion)
    ("phi-2", 2.78e9, 0.005e9),
    # https://huggingface.co/openai/gpt-oss-20b model card (arXiv 2508.10925, table 1): 20.91B total
    ("gpt-oss-20b", 20.91e9, 0.005e9),
    # https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct: "Model size 8.03B params"
    ("Meta-Llama-3.1-8B-Instruct", 8.03e9, 0.005e9),
    # https://mistral.ai/news/mixtral-of-experts: "46.7B total parameters"
    ("Mixtral-8x7B-v0.1", 46.7e9, 0.05e9),
    # https://huggingface.co/Qwen/Qwen2.5-7B-Instruct: "Number of Parameters: 7.61B"
    ("Qwen2.5-7B-Instruct-AWQ", 7.61e9, 0.01e9),  # parameters as the bf16 model has them
    # https://huggingface.co/Qwen/Qwen3-30B-A3B: "Number of Parameters: 30.5B in total and 3.3B activated"
    ("Qwen3-30B-A3B", 30.5e9, 0.05e9),
    # https://huggingface.co/Qwen/Qwen3-235B-A22B-Instruct-2507-FP8: "Number of Parameters: 235B in total"
    ("Qwen3-235B-A22B-Instruct-2507-FP8", 235e9, 0.5e9),
    # https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct: "Number of Parameters: 80B in total and 3B activated"
    ("Qwen3-Next-80B-A3B-Instruct", 80e9, 0.5e9),
    # DeepSeek-V3 technical report (arXiv 2412.19437): "671B total parameters", the MTP module's 14B apart
    ("DeepSeek-V3", 671e9, 0.5e9),
    # https://huggingface.co/lm-kit/granite-3.1-8b-instruct-gguf: "Model size 8.17B params" (3.3 8B has the same
    # dimensions: 4,096 hidden, 40 layers, 49,159 vocabulary)
    ("granite-3.3-8b-instruct", 8.17e9, 0.005e9),
    # the GLM-4.5-Air card: "106 billion total parameters and 12 billion active parameters" (106.85B without
    # its MTP layer, which vLLM does not load unless it drafts: the card truncates)
    ("GLM-4.5-Air", 106e9, 1e9),
    # Meta's Llama 4 card: "Llama 4 Scout (17Bx16E) ... 17B (Activated) 109B (Total)", the vision tower included
    ("Llama-4-Scout-17B-16E-Instruct", 109e9, 0.5e9),
    # https://huggingface.co/mzwing/DeepSeek-V2-Lite-Chat-GGUF: "Model size 15.7B params"
    ("DeepSeek-V2-Lite", 15.7e9, 0.05e9),
    # https://huggingface.co/syGOAT/Mistral-v0.3-wo-STaR-Like (the v0.3 architecture): "Model size 7.25B params"
    ("Mistral-7B-Instruct-v0.3", 7.25e9, 0.005e9),
    # https://oss.report/models/google/gemma-3-27b-it: 25.6B non-embedding, 1.4B embedding, a ~400M SigLIP tower
    ("gemma-3-27b-it", 27.4e9, 0.05e9),
    # https://docs.sglang.io/cookbook/autoregressive/Qwen/Qwen3.5: "397B total / 17B active" (seed 000: "a
    # 397-billion-parameter mixture-of-experts"), the vision tower included, the MTP layer apart (vLLM drops its
    # weights unless it drafts)
    ("Qwen3.5-397B-A17B", 397e9, 0.5e9),
])
def test_parameter_count_matches_the_published_total(name, published, within):
    assert sum(parameter_parts(config(name)).values()) == pytest.approx(published, abs=within)


def test_qwen3_5_counts_as_transformers_builds_it():
    """transformers 5.19's Qwen3_5MoeForConditionalGeneration, built from this config.json on the meta device,
    has 396,802,360,816 parameters, 456,010,480 of them in its vision tower (model.visual); its routed experts
    are 60 layers x 512 experts x gate, up and down of 4,096 x 1,024."""
    parts = parameter_parts(config("Qwen3.5-397B-A17B"))
    assert sum(parts.values()) == 396_802_360_816
    assert parts["vision"] == 456_010_480
    assert parts["experts"] == 60 * 512 * 3 * 4096 * 1024
    assert parts["lm_head"] == parts["embed"] == 248_320 * 4096  # tie_word_embeddings false, at the top level


def test_gemma2_ties_its_head_and_has_four_norms_a_layer():
    parts = parameter_parts(config("gemma-2-9b-it"))  # config.json leaves tie_word_embeddings to the default
    assert parts["lm_head"] == 0
    assert parts["norms"] == 42 * 4 * 3584 + 3584


def test_gpt_oss_active_parameters():
    # gpt-oss model card: 3.61B active per token (the unembedding counted, the embedding not), 4 of 32 experts
    cfg = config("gpt-oss-20b")
    parts = parameter_parts(cfg)
    active = sum(parts.values()) - parts["embed"] - parts["experts"] * (1 - cfg["num_experts_per_tok"] / 32)
    assert active == pytest.approx(3.61e9, abs=0.005e9)


def test_gpt_oss_mxfp4_prices_only_the_experts():
    # the Hub's config.json carries this quantization_config; the stored copy does not
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    cfg = {**config("gpt-oss-20b"), "quantization_config": qc, "torch_dtype": "bfloat16"}
    params, size = parameter_parts(cfg), estimate(cfg)
    assert size.parts["experts"] == round(params["experts"] * (0.5 + 1 / 32))
    assert size.parts["attention"] == 2 * params["attention"] and size.parts["other"] == 2 * params["other"]


def test_phi2_in_the_older_phi_msft_spelling_counts_the_same():
    cfg = config("phi-2")
    renamed = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
               "intermediate_size": "n_inner", "num_key_value_heads": "n_head_kv"}
    msft = {renamed.get(k, k): v for k, v in cfg.items()}
    assert parameter_parts(msft) == parameter_parts(cfg)


def test_gemma2_slides_every_other_layer_from_layer_0():
    cfg = config("gemma-2-9b-it")  # no layer_types: Gemma 2's layers alternate, layer 0 sliding
    shape = model_shape(cfg)
    assert shape.layer_kinds == tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(42))
    assert shape.sliding_window == 4096


def test_gpt_oss_layer_kinds_follow_its_layer_types():
    cfg = config("gpt-oss-20b")
    assert model_shape(cfg).layer_kinds == tuple(cfg["layer_types"])
    assert model_shape(cfg).layer_kinds.count("sliding_attention") == 12


def test_phi4_has_no_sliding_layers():
    assert set(model_shape(config("phi-4")).layer_kinds) == {"full_attention"}


def test_what_it_still_cannot_count_stays_unknown_with_the_reason():
    with pytest.raises(UnknownCheckpoint, match="MixFormerSequentialForCausalLM is not one"):
        parameter_parts({**config("phi-2"), "architectures": ["MixFormerSequentialForCausalLM"]})
    odd_vision = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": config("phi-4"),
                  "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                                    "num_hidden_layers": 24, "patch_size": 14, "image_size": 336}}
    with pytest.raises(UnknownCheckpoint, match="vision tower 'clip_vision_model'"):
        parameter_parts(odd_vision)


@pytest.mark.slow  # imports vLLM's KV cache code (about 10 s here)
@pytest.mark.parametrize("name", ["gemma-3-27b-it", "gemma-2-9b-it", "gpt-oss-20b", "Llama-4-Scout-17B-16E-Instruct"])
def test_hybrid_layers_are_grouped_as_vllms_own_kv_cache_code_groups_them(name):
    torch = pytest.importorskip("torch")
    utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    shape = model_shape(config(name))
    common = {"block_size": 16, "num_kv_heads": shape.num_kv_heads, "head_size": shape.head_dim, "dtype": torch.bfloat16}
    specs = {f"layer.{i}": FullAttentionSpec(**common) if kind == "full_attention" else
             SlidingWindowSpec(**common, sliding_window=shape.sliding_window or 8192)
             for i, kind in enumerate(shape.layer_kinds) if kind in CACHED_KINDS}
    groups = utils._get_kv_cache_groups_uniform_page_size(specs)
    size = max(len(g.layer_names) for g in groups)
    slots, how = kv_layer_slots(shape.layer_kinds)
    assert slots == len(groups) * size  # every group costs a group's layers a token
    assert f"in {len(groups)} KV cache groups of {size}" in how


def test_gemma3_pads_its_52_sliding_layers_to_six_groups_of_ten():
    shape = model_shape(config("gemma-3-27b-it"))  # text_config leaves the layer pattern to Gemma3TextConfig
    assert shape.layer_kinds.count("full_attention") == 10 and shape.layer_kinds.count("sliding_attention") == 52
    assert kv_layer_slots(shape.layer_kinds) == (70, "10 full-attention, 52 sliding-attention layers in 7 KV cache "
                                                     "groups of 10 (8 padding layers)")


def test_gemma3_counts_its_text_model_from_the_config_class_defaults_and_its_siglip_tower():
    parts = parameter_parts(config("gemma-3-27b-it"))
    # oss.report: "Non-embedding Parameters 25.6B / Embedding Parameters 1.4B"; the embedding is tied
    assert parts["embed"] == 262208 * 5376 and parts["lm_head"] == 0  # Gemma3TextConfig's vocabulary
    assert parts["attention"] + parts["mlp"] + parts["norms"] == pytest.approx(25.6e9, abs=0.05e9)
    # SigLIP so400m at 896 px (27 layers, 4,096 patches) and the projector into 5,376
    assert parts["vision"] - (1152 * 5376 + 1152) == pytest.approx(417e6, abs=1e6)


@pytest.mark.parametrize("name,positions,dim,width", [
    ("Llama-4-Scout-17B-16E-Instruct", 10485760, 128, 2),  # 10M positions: 2.5 GiB on every rank
    ("gpt-oss-20b", 4096 * 32, 64, 4),  # YaRN: the original 4,096 positions x factor 32, built in float32
    ("phi-2", 2048, 32, 2),  # partial_rotary_factor 0.4 of 80-wide heads
    ("DeepSeek-V2-Lite", 163840, 64, 2),  # MLA ropes qk_rope_head_dim; YaRN 4,096 x 40
])
def test_the_rope_cache_is_what_vllms_rotary_embedding_registers(name, positions, dim, width):
    from llmtrial.plan.shape import rope_cache_bytes
    got, how = rope_cache_bytes(config(name), model_shape(config(name), dtype="bfloat16"))
    assert got == positions * dim * width and f"{positions:,} positions x rotary dim {dim}" in how
