"""A model's shape and the KV arithmetic vLLM applies to it.

From a Hugging Face ``config.json``: layers, heads, KV heads and head size, MLA latent size,
sliding-window and state layers (:func:`model_shape`); KV bytes one token costs per layer and
rank, vLLM's pipeline layer split and a balanced one, and KV blocks, tokens and concurrency
as vLLM's v1 ``kv_cache_utils`` counts them (:func:`predict_kv_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.records import read_record
from llmtrial.plan.hf_config import HFConfig, PlanError, RopeScaling, first_set

#: Bytes per element by dtype name (config.json ``torch_dtype``/``dtype``, or ``kv_cache_dtype``).
DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_ds_mla": 1, "float8_e4m3fn": 1, "int8": 1,
}
#: Layer kinds whose state is per sequence, not per token.
STATE_LAYER_KINDS = ("mamba", "mamba2", "linear_attention", "linear", "gated_deltanet", "ssm", "conv")
SLIDING_LAYER_KINDS = ("sliding_attention", "sliding_window", "local_attention", "chunked_attention")
DEFAULT_GPU_BLOCK_SIZE = 16
DEFAULT_CPU_BLOCK_SIZE = 128


@dataclass(frozen=True)
class ConfigShape:
    """What the memory arithmetic needs from a model's config.json."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    dtype_bytes: int
    tie_word_embeddings: bool
    layer_kinds: tuple[str, ...]
    sliding_window: int | None = None
    mla_kv_dim: int | None = None
    num_experts: int | None = None
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    state_bytes_per_layer: int | None = None
    max_position_embeddings: int = 2048


def layer_kinds(cfg: HFConfig, num_layers: int, sliding_window: int | None = None) -> tuple[str, ...]:
    """Each layer's cache kind: ``full_attention``, ``sliding_attention``, ``state`` (linear
    attention or SSM, per sequence) or ``none``, from ``layer_types``, a hybrid pattern or
    ``full_attention_interval`` (Qwen3-Next: full attention every n-th layer, linear between)."""
    kinds = cfg.layer_types or cfg.layers_block_type
    if kinds:
        out = []
        for k in kinds[:num_layers]:
            k = str(k).lower()
            if k in ("attention", "full_attention", "global_attention"):
                out.append("full_attention")
            elif k in SLIDING_LAYER_KINDS:
                out.append("sliding_attention")
            elif any(k.startswith(s) for s in STATE_LAYER_KINDS) or k in STATE_LAYER_KINDS:
                out.append("state")
            else:  # an MLP/MoE-only block keeps no cache
                out.append("none")
        return tuple(out)
    pattern = cfg.hybrid_override_pattern
    if pattern is not None and len(pattern) >= num_layers:
        return tuple("full_attention" if c == "*" else ("state" if c == "M" else "none") for c in pattern[:num_layers])
    interval = cfg.full_attention_interval
    if interval:
        return tuple("full_attention" if (i + 1) % int(interval) == 0 else "state" for i in range(num_layers))
    interleaved = _interleaved_sliding(cfg, num_layers)
    if interleaved:
        return interleaved
    if sliding_window and cfg.use_sliding_window is not False:
        window_from = cfg.max_window_layers
        if window_from is not None and cfg.use_sliding_window is True:
            return tuple("full_attention" if i < window_from else "sliding_attention" for i in range(num_layers))
        if cfg.use_sliding_window is None and window_from is None:
            return ("sliding_attention",) * num_layers
    return ("full_attention",) * num_layers


def _interleaved_sliding(cfg: HFConfig, num_layers: int) -> tuple[str, ...] | None:
    """Sliding-window layers interleaved with global ones, where config.json gives no ``layer_types``:
    Gemma 2 (every other layer, layer 0 sliding), a ``sliding_window_pattern`` n (Gemma 3, Cohere 2:
    every n-th layer global, the others sliding), Llama 4's chunked attention (on the RoPE layers of
    ``no_rope_layers``; the NoPE layers, every fourth, attend globally)."""
    pattern = cfg.sliding_window_pattern or (2 if cfg.kind == "gemma2" else None)
    if pattern and first_set(cfg.sliding_window, cfg.sliding_window_size):
        return tuple("sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(num_layers))
    if cfg.attention_chunk_size:
        rope = cfg.no_rope_layers or [
            int((i + 1) % int(first_set(cfg.no_rope_layer_interval, default=4)) != 0) for i in range(num_layers)]
        return tuple("sliding_attention" if rope[i] else "full_attention" for i in range(num_layers))
    return None


def model_shape(config: HFConfig | Mapping[str, Any], *, dtype: str | None = None) -> ConfigShape:
    """Read a Hugging Face ``config.json`` (text part of a multimodal one) into a ConfigShape."""
    config = HFConfig.of(config)
    cfg = config.text()
    try:
        num_layers = int(first_set(cfg.num_hidden_layers, cfg.n_layer, cfg.num_layers))
        hidden = int(first_set(cfg.hidden_size, cfg.d_model, cfg.n_embd))
        heads = int(first_set(cfg.num_attention_heads, cfg.n_head))
    except TypeError:
        raise PlanError("config.json lacks num_hidden_layers, hidden_size or num_attention_heads") from None
    kv_heads = int(first_set(cfg.num_key_value_heads, cfg.num_kv_heads, cfg.multi_query_group_num, default=heads))
    head_dim = int(first_set(cfg.head_dim, default=hidden // heads))
    dtype_name = str(dtype or first_set(cfg.torch_dtype, cfg.dtype, config.torch_dtype, default="bfloat16"))
    dtype_name = dtype_name.replace("torch.", "")
    if dtype_name not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {dtype_name!r} in config.json")
    sliding = first_set(cfg.sliding_window, cfg.attention_window_size, cfg.attention_chunk_size)
    sliding = int(sliding) if sliding else None
    mla = None
    if cfg.kv_lora_rank:
        mla = int(cfg.kv_lora_rank) + int(first_set(cfg.qk_rope_head_dim, default=0))
    experts = first_set(cfg.num_experts, cfg.n_routed_experts, cfg.num_local_experts)
    state = None
    if cfg.mamba_d_state or cfg.ssm_state_size or cfg.state_size:
        d_state = int(first_set(cfg.mamba_d_state, cfg.ssm_state_size, cfg.state_size))
        expand = int(first_set(cfg.mamba_expand, cfg.expand, default=2))
        d_conv = int(first_set(cfg.mamba_d_conv, cfg.conv_kernel, cfg.d_conv, default=4))
        inner = expand * hidden
        state = (inner * d_state + inner * d_conv) * DTYPE_BYTES[dtype_name]
    return ConfigShape(
        num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        hidden_size=hidden, vocab_size=int(first_set(cfg.vocab_size, config.vocab_size, default=0)),
        dtype_bytes=DTYPE_BYTES[dtype_name],
        tie_word_embeddings=bool(first_set(config.tie_word_embeddings, cfg.tie_word_embeddings, default=False)),
        layer_kinds=layer_kinds(cfg, num_layers, sliding), sliding_window=sliding, mla_kv_dim=mla,
        num_experts=int(experts) if experts else None,
        intermediate_size=first_set(cfg.intermediate_size, cfg.ffn_hidden_size),
        moe_intermediate_size=cfg.moe_intermediate_size,
        state_bytes_per_layer=state,
        max_position_embeddings=int(first_set(cfg.max_position_embeddings, default=2048)),
    )


#: RoPE types whose factor vLLM does not apply to the length (their max_position_embeddings already counts it).
_UNSCALED_ROPE = ("su", "longrope", "llama3", "default", "mrope")


def derived_max_model_len(config: HFConfig | Mapping[str, Any]) -> tuple[int | None, str]:
    """The longest max_model_len vLLM accepts for the model without VLLM_ALLOW_LONG_MAX_MODEL_LEN, as
    its ``_get_and_verify_max_len`` derives it from config.json: the smallest of the lengths it gives
    (:meth:`HFConfig.lengths`), times the RoPE scaling factor (from ``original_max_position_embeddings``
    for yarn), and the config fields it came from in words. None when config.json sets none of them."""
    cfg = HFConfig.of(config).text()
    lengths = cfg.lengths()
    found = {k: n for k, n in lengths.items() if n is not None and n > 0}
    if not found:
        return None, "config.json sets none of " + ", ".join(lengths)
    key = min(found, key=lambda k: found[k])
    length, where = float(found[key]), f"{key}={found[key]:g}"
    rope = cfg.rope_scaling or RopeScaling()
    kind, factor = rope.kind, rope.factor
    if factor and kind not in _UNSCALED_ROPE and "gemma3" not in cfg.kind:
        if kind == "yarn" and rope.original_max_position_embeddings:
            length = float(rope.original_max_position_embeddings)
        length *= float(factor)
        where += f", rope_scaling {kind} factor {factor:g}"
    return int(length), where


#: RoPE types whose cached positions are the original length times the factor, and those whose are
#: max_position_embeddings times it (vLLM's ``get_rope``: YaRN and DeepSeek's YaRN, linear and dynamic NTK).
_ROPE_FROM_ORIGINAL = ("yarn", "deepseek_yarn")
_ROPE_SCALED = ("linear", "dynamic")


def rope_cache_bytes(config: HFConfig | Mapping[str, Any], shape: ConfigShape) -> tuple[int, str]:
    """The cos/sin cache vLLM's rotary embedding registers on every rank when it builds the model (part
    of the memory its "Model loading took" line reports): positions x rotary dimensions x dtype, one
    cache per distinct RoPE (Gemma 3 keeps a local and a global one), and how it was counted. 0 for a
    model without RoPE."""
    cfg = HFConfig.of(config).text()
    given = cfg.rope_scaling or cfg.rope_parameters
    if cfg.rope_theta is None and given is None and cfg.qk_rope_head_dim is None:
        return 0, "no RoPE in config.json"
    rope = given or RopeScaling()
    dim = int(cfg.qk_rope_head_dim or cfg.rotary_dim
              or shape.head_dim * float(cfg.partial_rotary_factor or cfg.rotary_pct or 1.0))
    positions = int(first_set(cfg.max_position_embeddings, cfg.n_positions, default=2048))
    kind, factor = rope.kind, float(rope.factor or 1.0)
    original = int(rope.original_max_position_embeddings or positions)
    if kind in _ROPE_FROM_ORIGINAL:
        positions = int(original * factor)
    elif kind in _ROPE_SCALED:
        positions = int(positions * factor)
    elif kind in ("longrope", "su"):
        positions += original  # the short and the long cache side by side
    caches = 2 if cfg.kind.startswith("gemma3") else 1
    width = 4 if cfg.kind == "gpt_oss" else shape.dtype_bytes  # gpt-oss builds its RoPE in float32
    return caches * positions * dim * width, (f"{caches} x {positions:,} positions x rotary dim {dim} x {width} B "
                                              "(vLLM's rotary cos/sin cache on every rank)")


#: The layer kinds whose KV cache grows with the tokens.
CACHED_KINDS = ("full_attention", "sliding_attention")


def kv_layer_slots(kinds: Sequence[str]) -> tuple[int, str | None]:
    """The layers a token's KV costs under vLLM's hybrid KV cache manager, and how, in words (None
    when every cached layer is of one kind): layers of each attention kind are split into groups of
    the smallest kind's count (the largest's where it is under 1.5 times the smallest), the last
    group of each kind padded, and every group costs a group's layers a token
    (``kv_cache_utils._get_kv_cache_groups_uniform_page_size``)."""
    counts = {k: sum(1 for x in kinds if x == k) for k in CACHED_KINDS}
    counts = {k: n for k, n in counts.items() if n}
    if len(counts) < 2:
        return sum(counts.values()), None
    lo, hi = min(counts.values()), max(counts.values())
    size = hi if hi < 1.5 * lo else lo
    groups = sum(-(-n // size) for n in counts.values())
    padding = size * groups - sum(counts.values())
    return size * groups, (", ".join(f"{n} {k.replace('_', '-')}" for k, n in counts.items()) +
                           f" layers in {groups} KV cache groups of {size}" +
                           (f" ({padding} padding layers)" if padding else ""))


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads each TP rank caches: split when they divide, replicated when TP exceeds them."""
    return max(1, num_kv_heads // tp)


def kv_bytes_per_token_per_layer(shape: ConfigShape, tp: int, kv_dtype_bytes: int) -> tuple[int, int]:
    """(whole model, one rank) bytes one token costs in one attention layer."""
    if shape.mla_kv_dim is not None:  # MLA caches one latent vector per token, replicated on every TP rank
        b = shape.mla_kv_dim * kv_dtype_bytes
        return b, b
    whole = 2 * shape.num_kv_heads * shape.head_dim * kv_dtype_bytes
    per_rank = 2 * kv_heads_per_rank(shape.num_kv_heads, tp) * shape.head_dim * kv_dtype_bytes
    return whole, per_rank


def split_layers(num_layers: int, pp: int, partition: list[int] | None = None) -> list[int]:
    """Layers per PP stage: the given partition, else vLLM's even split (remainder on the last stages)."""
    if partition is not None:
        if len(partition) != pp or sum(partition) != num_layers or min(partition) < 1:
            raise PlanError(f"VLLM_PP_LAYER_PARTITION {partition} must have {pp} positive parts summing to {num_layers}")
        return list(partition)
    base, rem = divmod(num_layers, pp)
    # vLLM's get_pp_indices gives the extra layers to the last stages
    return [base + (1 if i >= pp - rem else 0) for i in range(pp)]


def recommend_partition(num_layers: int, pp: int, layer_bytes: float, *, first_extra: float = 0.0,
                        last_extra: float = 0.0, pinned_last_layers: int = 0) -> list[int]:
    """Contiguous split of ``num_layers`` over ``pp`` stages minimising the heaviest stage.

    Stage memory is ``extra + layers * layer_bytes``; the first stage carries
    ``first_extra`` (embeddings), the last ``last_extra`` (output head, draft module), and
    the last stage holds at least ``pinned_last_layers``.
    """
    if pp == 1:
        return [num_layers]
    if num_layers < pp or pinned_last_layers > num_layers - (pp - 1):
        raise PlanError(f"{num_layers} layers cannot be split over {pp} stages with {pinned_last_layers} pinned last")
    extras = [0.0] * pp
    extras[0] += first_extra
    extras[-1] += last_extra

    def counts(cap: float) -> list[int]:
        return [max(0, int(math.floor((cap - e) / layer_bytes + 1e-9))) for e in extras]

    lo, hi = 0.0, max(extras) + num_layers * layer_bytes
    for _ in range(200):  # bisection on the heaviest stage's memory
        mid = (lo + hi) / 2
        c = counts(mid)
        ok = sum(c) >= num_layers and c[-1] >= pinned_last_layers and min(c) >= 1
        lo, hi = (lo, mid) if ok else (mid, hi)
    cap_counts = counts(hi)
    # take the surplus back, from the stages with the most room left, never below the pins
    out = list(cap_counts)
    surplus = sum(out) - num_layers
    while surplus > 0:
        order = sorted(range(pp), key=lambda i: (extras[i] + out[i] * layer_bytes, i), reverse=True)
        for i in order:
            floor = pinned_last_layers if i == pp - 1 else 1
            if out[i] > floor:
                out[i] -= 1
                surplus -= 1
                break
        else:
            break
    return out


def predict_kv_tokens(available_bytes_per_rank: list[float], bytes_per_token_per_rank: list[int],
                      block_size: int, max_model_len: int) -> tuple[int, int, float]:
    """vLLM's KV capacity: (num_blocks, tokens it logs, max concurrency at max_model_len)."""
    blocks = min(int(avail // (block_size * per_token)) for avail, per_token in
                 zip(available_bytes_per_rank, bytes_per_token_per_rank, strict=True) if per_token > 0)
    per_request = math.ceil(max_model_len / block_size)
    concurrency = blocks / per_request
    return blocks, int(concurrency * max_model_len), concurrency


def read_model_config(path: str | Path) -> HFConfig:
    """A config.json, or a model folder holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        return HFConfig.of(read_record(p))
    except (FileNotFoundError, ValueError) as exc:
        raise PlanError(f"model config: {exc}") from None
