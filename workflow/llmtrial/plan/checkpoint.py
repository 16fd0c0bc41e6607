"""What a checkpoint weighs before it is downloaded: parameters by part, bytes by quantization.

The planner gates launches, so the weight figure it plans on says where it came from
(:class:`WeightsSize`): the bytes of staged files or of the Hub's file listing first
(``measured``), a size a person gave (``given``), and only then an estimate from config.json
(``estimated``), which counts the parameters of each part of the model by its architecture
and prices each part by the checkpoint's ``quantization_config``. An architecture or a
quantization method this module does not know gives ``unknown`` with the reason, never a
silent bf16 guess.

Parts: ``embed`` (token embeddings), ``lm_head`` (the output head; none when tied),
``attention`` (q/k/v/o and MLA projections), ``linear_attention`` (projections of
linear-attention layers), ``mlp`` (dense feed-forward), ``experts`` (routed MoE experts),
``shared_experts``, ``router`` (MoE gates), ``norms``, ``other`` (biases, attention sinks,
convolution and decay parameters) and ``vision`` (a multimodal model's vision tower and projector). Quantization methods convert linear layers; embeddings, norms,
routers and ``other`` stay at the model's dtype, and so does whatever the config lists as
not converted (``modules_to_not_convert``, ``ignored_layers``, compressed-tensors'
``ignore``, bitsandbytes' ``llm_int8_skip_modules``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmtrial.plan.hf_config import HFConfig, QuantizationConfig, VisionConfig, first_set, need
from llmtrial.plan.shape import DTYPE_BYTES, layer_kinds

#: Parts a quantization method converts (linear layers), unless the config lists them as not converted.
#: The output head is not among them: FP8, AWQ, GPTQ, bitsandbytes and MXFP4 checkpoints keep it
#: at the model's dtype unless their config says otherwise (GPTQ's ``lm_head: true``).
LINEAR_PARTS = ("attention", "linear_attention", "mlp", "experts", "shared_experts")
#: Parts a tensor-parallel rank holds a full copy of (everything else is split over the ranks).
REPLICATED_PARTS = ("router", "norms", "other")
#: Module-name fragments that name each part in a list of modules not converted.
PART_NAMES = {
    "lm_head": ("lm_head", "output_layer"),
    "embed": ("embed_tokens", "wte", "embeddings"),
    "attention": ("self_attn", "attn", "attention"),
    "linear_attention": ("linear_attn",),
    "experts": ("experts",),
    "shared_experts": ("shared_expert", "shared_experts"),
    "mlp": ("mlp",),
    "router": ("gate", "router"),
}


class UnknownCheckpoint(ValueError):
    """config.json does not say enough to size the checkpoint; the message says why."""


@dataclass(frozen=True)
class WeightsSize:
    """The weight bytes a plan rests on, with where the figure came from."""

    bytes: int
    kind: str  # measured, given or estimated
    source: str
    parts: dict[str, int] = field(default_factory=dict)  # bytes per part, for estimates


# --------------------------------------------------------------------------- parameter counts


#: Model types whose output projection carries a bias when ``attention_bias`` is set (Qwen2's and GLM's do not).
O_BIAS_TYPES = ("llama", "gpt_oss", "granite", "granitemoe", "granitemoeshared", "mistral")
#: Model types with four norms a layer (before and after attention and feed-forward).
SANDWICH_NORM_TYPES = ("gemma2", "gemma3_text", "gemma3", "glm4")
#: Model types whose embeddings are tied unless config.json says otherwise (their config classes' defaults).
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text", "gemma3", "granite", "granitemoe", "granitemoeshared")


def _attention(cfg: HFConfig, h: int) -> tuple[int, int, int]:
    """(projection, bias and other, norm) parameters of one standard attention layer."""
    heads = int(need(cfg.num_attention_heads, "num_attention_heads"))
    head_dim = int(first_set(cfg.head_dim, default=h // heads))
    kv = int(first_set(cfg.num_key_value_heads, default=heads))
    q, k = heads * head_dim, kv * head_dim
    kind = cfg.kind
    # Qwen3-Next's gated attention doubles q_proj
    gate = q if first_set(cfg.attn_output_gate, default=kind == "qwen3_next") else 0
    proj = h * (q + gate) + 2 * h * k + q * h
    biased = first_set(cfg.attention_bias, default=kind in ("qwen2", "glm"))
    bias = (q + 2 * k + (h if kind in O_BIAS_TYPES else 0)) if biased else 0
    bias += heads if kind == "gpt_oss" else 0  # gpt-oss's attention sinks, one logit per head
    # q_norm and k_norm (Llama 4's QK norm is an L2 norm without weights)
    qk_norm = kind.startswith(("qwen3", "gemma3")) or (cfg.use_qk_norm and kind != "llama4_text")
    return proj, bias, 2 * head_dim if qk_norm else 0


def _mla(cfg: HFConfig, h: int) -> tuple[int, int]:
    """(projection, norm) parameters of one multi-head latent attention layer (DeepSeek V2/V3)."""
    heads = int(need(cfg.num_attention_heads, "num_attention_heads"))
    nope, rope = int(need(cfg.qk_nope_head_dim, "qk_nope_head_dim")), int(need(cfg.qk_rope_head_dim, "qk_rope_head_dim"))
    v = int(need(cfg.v_head_dim, "v_head_dim"))
    kv_rank, q_rank = int(need(cfg.kv_lora_rank, "kv_lora_rank")), cfg.q_lora_rank
    q = h * int(q_rank) + int(q_rank) * heads * (nope + rope) if q_rank else h * heads * (nope + rope)
    proj = q + h * (kv_rank + rope) + kv_rank * heads * (nope + v) + heads * v * h
    return proj, kv_rank + (int(q_rank) if q_rank else 0)


def _linear_attention(cfg: HFConfig, h: int) -> tuple[int, int, int]:
    """(projection, other, norm) parameters of one gated DeltaNet layer (Qwen3-Next)."""
    k_heads = int(need(cfg.linear_num_key_heads, "linear_num_key_heads"))
    v_heads = int(need(cfg.linear_num_value_heads, "linear_num_value_heads"))
    key = k_heads * int(need(cfg.linear_key_head_dim, "linear_key_head_dim"))
    value = v_heads * int(need(cfg.linear_value_head_dim, "linear_value_head_dim"))
    proj = h * (2 * key + 2 * value) + h * 2 * v_heads + value * h  # in_proj_qkvz, in_proj_ba, out_proj
    other = (2 * key + value) * int(first_set(cfg.linear_conv_kernel_dim, default=4)) + 2 * v_heads  # conv1d, A_log, dt_bias
    return proj, other, int(need(cfg.linear_value_head_dim, "linear_value_head_dim"))


def _is_moe_layer(cfg: HFConfig, i: int) -> bool:
    if cfg.first_k_dense_replace is not None:  # DeepSeek, GLM-4.5
        step = int(first_set(cfg.moe_layer_freq, default=1))
        return i >= int(cfg.first_k_dense_replace) and i % step == 0
    if cfg.moe_layers is not None:  # Llama 4
        return i in cfg.moe_layers
    if i in (cfg.mlp_only_layers or []):
        return False
    step = int(first_set(cfg.decoder_sparse_step, cfg.interleave_moe_layer_step, default=1))
    return step > 0 and (i + 1) % step == 0


def _layer_kinds(cfg: HFConfig, layers: int) -> list[str]:
    return ["linear" if k == "state" else "attention" for k in layer_kinds(cfg, layers)]


def _add(parts: dict[str, int], **counts: int) -> None:
    for k, v in counts.items():
        parts[k] = parts.get(k, 0) + int(v)


def _moe(cfg: HFConfig, h: int) -> dict[str, int]:
    """Parameters per part of one MoE feed-forward block: routed experts, shared experts, router."""
    kind = cfg.kind
    experts = int(first_set(cfg.num_experts, cfg.n_routed_experts, cfg.num_local_experts))
    inter = int(first_set(cfg.moe_intermediate_size, cfg.intermediate_size, default=0))
    shared = int(first_set(cfg.shared_expert_intermediate_size, cfg.shared_intermediate_size, default=0)) or \
        int(first_set(cfg.n_shared_experts, default=1 if kind == "llama4_text" else 0)) * inter
    out = {"experts": experts * 3 * h * inter, "router": h * experts, "shared_experts": 3 * h * shared, "other": 0}
    if cfg.shared_expert_intermediate_size:  # Qwen's sigmoid gate on the shared expert
        out["router"] += h
    if cfg.topk_method == "noaux_tc" or kind == "glm4_moe":  # e_score_correction_bias
        out["other"] += experts
    if kind == "gpt_oss":  # biases on the router and on every expert's projections
        out["other"] += experts + experts * (2 * inter + h)
    return out


def _decoder(cfg: HFConfig, attention: str) -> dict[str, int]:
    """Parameters per part of a decoder-only transformer: dense, MoE, MLA or hybrid."""
    h, layers = int(need(cfg.hidden_size, "hidden_size")), int(need(cfg.num_hidden_layers, "num_hidden_layers"))
    vocab, kind = int(need(cfg.vocab_size, "vocab_size")), cfg.kind
    tied = first_set(cfg.tie_word_embeddings, default=kind in TIED_BY_DEFAULT)
    parts = {"embed": vocab * h, "lm_head": 0 if tied else vocab * h, "norms": h}
    experts = first_set(cfg.num_experts, cfg.n_routed_experts, cfg.num_local_experts, default=0)
    dense = int(first_set(cfg.intermediate_size_mlp, cfg.intermediate_size, default=0))  # Llama 4's dense width
    norms = 4 if kind in SANDWICH_NORM_TYPES else 2
    kinds = _layer_kinds(cfg, layers)
    for i in range(layers):
        if attention == "mla":
            proj, norm = _mla(cfg, h)
            _add(parts, attention=proj, norms=norm)
        elif kinds[i] == "linear":
            proj, other, norm = _linear_attention(cfg, h)
            _add(parts, linear_attention=proj, other=other, norms=norm)
        else:
            proj, bias, norm = _attention(cfg, h)
            _add(parts, attention=proj, other=bias, norms=norm)
        _add(parts, norms=norms * h)
        if experts and _is_moe_layer(cfg, i):
            _add(parts, **_moe(cfg, h))
        else:
            _add(parts, mlp=3 * h * dense, other=(2 * dense + h) if cfg.mlp_bias else 0)
    return parts


def _phi(cfg: HFConfig) -> dict[str, int]:
    """Phi-1/Phi-2: one LayerNorm a layer feeding attention and MLP in parallel, biases on every
    projection and on the head, a two-matrix GELU MLP."""
    try:  # transformers' keys, or the older phi-msft ones
        h, layers = int(first_set(cfg.hidden_size, cfg.n_embd)), int(first_set(cfg.num_hidden_layers, cfg.n_layer))
        heads = int(first_set(cfg.num_attention_heads, cfg.n_head))
    except TypeError:
        raise KeyError("hidden_size, num_hidden_layers or num_attention_heads") from None
    vocab, inter = int(need(cfg.vocab_size, "vocab_size")), int(first_set(cfg.intermediate_size, cfg.n_inner, default=4 * h))
    head_dim = h // heads
    k = int(first_set(cfg.num_key_value_heads, cfg.n_head_kv, default=heads)) * head_dim
    qk_norm = 4 * head_dim if cfg.qk_layernorm else 0
    per = {"attention": h * h + 2 * h * k + h * h, "mlp": 2 * h * inter, "norms": 2 * h + qk_norm,
           "other": h + 2 * k + h + inter + h}  # q/k/v/dense, fc1 and fc2 biases
    parts = {p: n * layers for p, n in per.items()}
    _add(parts, embed=vocab * h, lm_head=0 if cfg.tie_word_embeddings else vocab * h, other=vocab, norms=2 * h)
    return parts


def _qwen3_5_vision(vc: VisionConfig) -> int:
    """Parameters of Qwen3.5's vision tower (transformers' ``Qwen3_5MoeVisionModel``): a Conv3d patch embedding
    with a bias, learned positions, ``depth`` blocks (two LayerNorms, a fused qkv and an output projection, a
    two-matrix MLP, every linear with a bias), and the merger of ``spatial_merge_size``² patches (a LayerNorm,
    then two linears with biases into the language model's width, ``out_hidden_size``)."""
    h, inter = int(need(vc.hidden_size, "hidden_size")), int(need(vc.intermediate_size, "intermediate_size"))
    patch, frames = int(need(vc.patch_size, "patch_size")), int(need(vc.temporal_patch_size, "temporal_patch_size"))
    merged = h * int(need(vc.spatial_merge_size, "spatial_merge_size")) ** 2
    out = int(need(vc.out_hidden_size, "out_hidden_size"))
    embed = int(vc.in_channels or 3) * frames * patch * patch * h + h + int(
        need(vc.num_position_embeddings, "num_position_embeddings")) * h
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * inter + inter) + (inter * h + h)
    merger = 2 * h + (merged * merged + merged) + (merged * out + out)
    return embed + int(need(vc.depth, "depth")) * block + merger


def _vision(config: HFConfig, text_h: int) -> int:
    """Parameters of the vision tower vLLM loads with the language model, and of its projector:
    Llama 4's (class token, patch linear, pixel-shuffle adapter into the text model's width), Gemma 3's
    SigLIP (no pooling head) and Qwen3.5's (:func:`_qwen3_5_vision`)."""
    vc = need(config.vision_config, "vision_config")
    if vc.model_type == "qwen3_5_moe":
        return _qwen3_5_vision(vc)
    vh, inter = int(need(vc.hidden_size, "hidden_size")), int(need(vc.intermediate_size, "intermediate_size"))
    layers, patch = int(need(vc.num_hidden_layers, "num_hidden_layers")), int(need(vc.patch_size, "patch_size"))
    image, channels = int(need(vc.image_size, "image_size")), int(vc.num_channels)
    patches = (image // patch) ** 2
    body = layers * (4 * (vh * vh + vh) + vh * inter + inter + inter * vh + vh + 4 * vh)  # attention, MLP, 2 LayerNorms
    if vc.model_type == "llama4_vision_model":  # vision_model.* and multi_modal_projector
        shuffled = int(vh / float(need(vc.pixel_shuffle_ratio, "pixel_shuffle_ratio")) ** 2)
        projector_in = int(need(vc.projector_input_dim, "projector_input_dim"))
        adapter = shuffled * projector_in + projector_in * int(need(vc.projector_output_dim, "projector_output_dim"))
        embed = vh + (patches + 1) * vh + channels * patch * patch * vh + 4 * vh  # class, positions, patches, norms
        return body + embed + adapter + int(need(vc.vision_output_dim, "vision_output_dim")) * text_h
    if vc.model_type == "siglip_vision_model" and not vc.vision_use_head:
        # Gemma 3: patch convolution with bias, positions, post-LayerNorm; the projector's matrix and RMSNorm
        embed = channels * patch * patch * vh + vh + patches * vh + 2 * vh
        return body + embed + vh * text_h + vh
    raise UnknownCheckpoint(f"vision tower {vc.model_type!r} is not one the planner can count")


def _multimodal(config: HFConfig) -> dict[str, int]:
    """The language model of a multimodal config.json, and the vision tower vLLM loads with it."""
    cfg = config.text()
    if cfg.tie_word_embeddings is None and config.tie_word_embeddings is not None:
        cfg = cfg.model_copy(update={"tie_word_embeddings": config.tie_word_embeddings})
    parts = _decoder(cfg, "standard")
    parts["vision"] = _vision(config, int(need(cfg.hidden_size, "hidden_size")))
    return parts


#: Architectures whose parameters :func:`parameter_parts` counts, by ``architectures[0]``.
ARCHITECTURES: dict[str, Callable[[HFConfig], dict[str, int]]] = {
    **{a: (lambda c: _decoder(c, "standard")) for a in (
        "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
        "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen3NextForCausalLM",
        "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "GptOssForCausalLM", "Llama4ForCausalLM",
        "GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM",
        "GlmForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM")},
    **{a: (lambda c: _decoder(c, "mla")) for a in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")},
    "PhiForCausalLM": _phi,
}
#: Multimodal architectures, counted from the whole config.json: language model and vision tower.
MULTIMODAL: dict[str, Callable[[HFConfig], dict[str, int]]] = {
    a: _multimodal for a in ("Llama4ForConditionalGeneration", "Gemma3ForConditionalGeneration",
                             "Qwen3_5MoeForConditionalGeneration")}


def parameter_parts(config: HFConfig | Mapping[str, Any]) -> dict[str, int]:
    """Parameters per part of the model vLLM loads (a DeepSeek or GLM-4.5 checkpoint's MTP layers
    are not counted: vLLM skips them unless they serve speculative decoding). A multimodal model's
    vision tower and projector, which vLLM loads too, are the part ``vision``."""
    config = HFConfig.of(config)
    archs = config.architectures or []
    arch = archs[0] if archs else None
    if arch not in ARCHITECTURES and arch not in MULTIMODAL:
        raise UnknownCheckpoint(f"architecture {arch or '(none in config.json)'} is not one the planner can count "
                                f"parameters for (known: {', '.join(sorted({*ARCHITECTURES, *MULTIMODAL}))}); give "
                                "the weight size (--weights-gib, or stage the weights first)")
    try:
        return MULTIMODAL[arch](config) if arch in MULTIMODAL else ARCHITECTURES[arch](config.text())
    except UnknownCheckpoint as exc:
        raise UnknownCheckpoint(f"{arch}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise UnknownCheckpoint(f"{arch}: config.json lacks {exc} needed to count parameters") from None


# --------------------------------------------------------------------------- bytes per parameter


def _scale_bytes(bits: float, group: int, *, scale: int = 2, zero: bool = False) -> float:
    """Bytes per parameter of a group-wise quantized weight: packed values, one scale (and one
    packed zero point) per ``group`` parameters; a group of -1 or 0 is one per output channel,
    which is negligible here."""
    per = bits / 8
    if group and group > 0:
        per += scale / group + (bits / 8 / group if zero else 0.0)
    return per


def _fp8(q: QuantizationConfig) -> tuple[float, list[str], str]:
    block = q.weight_block_size
    per = 1.0 + (4 / (int(block[0]) * int(block[1])) if block else 0.0)  # one fp32 scale per block
    what = f"FP8 ({'block ' + 'x'.join(map(str, block)) + ' scales' if block else 'per-tensor scales'})"
    return per, list(q.modules_to_not_convert or q.ignored_layers or []), what


def _awq(q: QuantizationConfig) -> tuple[float, list[str], str]:
    bits, group = int(first_set(q.bits, q.w_bit, default=4)), int(first_set(q.group_size, q.q_group_size, default=128))
    zero = bool(q.zero_point)
    return (_scale_bytes(bits, group, zero=zero), list(q.modules_to_not_convert or []),
            f"AWQ {bits}-bit, group {group}{', zero points' if zero else ''}")


def _gptq(q: QuantizationConfig) -> tuple[float, list[str], str]:
    bits, group = int(first_set(q.bits, default=4)), int(first_set(q.group_size, default=128))
    # GPTQ checkpoints store packed zero points even when symmetric
    return (_scale_bytes(bits, group, zero=True), list(q.modules_to_not_convert or []),
            f"GPTQ {bits}-bit, group {group}{', act-order' if q.desc_act else ''}")


def _compressed_tensors(q: QuantizationConfig) -> tuple[float, list[str], str]:
    groups = [g.weights for g in (q.config_groups or {}).values() if g.weights is not None]
    if not groups:
        raise UnknownCheckpoint("compressed-tensors config without weight quantization groups")
    w = groups[0]
    bits, strategy = int(w.num_bits), str(w.strategy)
    group = int(w.group_size or 0)
    if strategy == "block" and w.block_structure:
        group = int(w.block_structure[0]) * int(w.block_structure[1])
    fmt = q.format or ""
    scale = 1 if "nvfp4" in fmt else 2  # NVFP4 keeps one FP8 scale per 16 values
    per = _scale_bytes(bits, group if strategy in ("group", "tensor_group", "block") else 0, scale=scale,
                       zero=not w.symmetric)
    return per, list(q.ignore or []), f"compressed-tensors {fmt or w.type or ''} {bits}-bit {strategy}"


def _bitsandbytes(q: QuantizationConfig) -> tuple[float, list[str], str]:
    skip = list(q.llm_int8_skip_modules or [])
    if q.load_in_4bit or q.load_in_4bit_stored:
        double = bool(q.bnb_4bit_use_double_quant)
        # blocks of 64: an fp32 absmax each, or with double quantization a byte each and an fp32 per 256 blocks
        per = 0.5 + (1 / 64 + 4 / (64 * 256) if double else 4 / 64)
        return per, skip, f"bitsandbytes 4-bit {q.bnb_4bit_quant_type}{' double-quant' if double else ''}"
    return 1.0, skip, "bitsandbytes 8-bit"


def _mxfp4(q: QuantizationConfig) -> tuple[float, list[str], str]:
    return 0.5 + 1 / 32, list(q.modules_to_not_convert or []), "MXFP4 (E8M0 scale per 32 values)"


#: Quantization methods by ``quant_method``: bytes per converted parameter, modules not converted, a label.
METHODS: dict[str, Callable[[QuantizationConfig], tuple[float, list[str], str]]] = {
    "fp8": _fp8, "awq": _awq, "gptq": _gptq, "compressed-tensors": _compressed_tensors,
    "compressed_tensors": _compressed_tensors, "bitsandbytes": _bitsandbytes, "mxfp4": _mxfp4,
}


def _not_converted(patterns: list[str]) -> set[str]:
    """The parts a list of modules not converted names: by a module's last name
    (``model.layers.0.mlp.gate`` is a router, ``lm_head`` the head, ``model.layers.*.self_attn``
    attention) or by a ``re:`` pattern. A part named for some layers only is counted as kept in
    every layer: the estimate errs on the heavy side."""
    out = set()
    for raw in patterns:
        words = re.findall(r"[A-Za-z_]+", str(raw).removeprefix("re:"))
        for part, names in PART_NAMES.items():
            if words and words[-1] in names:
                out.add(part)
    return out


def quantization(config: HFConfig | Mapping[str, Any]) -> tuple[float | None, set[str], str]:
    """(bytes per converted parameter, the parts converted, a label); None bytes and no parts
    when the checkpoint is not quantized."""
    q = HFConfig.of(config).quantization()
    if q is None:
        return None, set(), "not quantized"
    method = (q.quant_method or "").lower()
    if method not in METHODS:
        raise UnknownCheckpoint(f"quantization method {method or '(none)'!r} is not one the planner can size "
                                f"(known: {', '.join(sorted(METHODS))}); give the weight size instead")
    per, patterns, label = METHODS[method](q)
    converted = set(LINEAR_PARTS) - _not_converted(patterns)
    if method == "mxfp4":  # gpt-oss: only the experts are MXFP4
        converted &= {"experts"}
    if q.lm_head is True:
        converted.add("lm_head")
    return per, converted, label


def dtype_bytes(config: HFConfig) -> int:
    text = config.text()
    name = str(first_set(text.torch_dtype, text.dtype, config.torch_dtype, default="bfloat16"))
    name = name.replace("torch.", "")
    if DTYPE_BYTES.get(name, 0) < 2:  # fp8 and int8 name quantized weights, not a model's dtype
        raise UnknownCheckpoint(f"config.json's dtype {name!r} is not a floating-point dtype the planner knows")
    return DTYPE_BYTES[name]


def part_bytes(config: HFConfig) -> tuple[dict[str, int], str]:
    """Estimated bytes per part of the checkpoint, and how they were priced."""
    params = parameter_parts(config)
    base = dtype_bytes(config)
    per, converted, label = quantization(config)
    out = {part: int(round(n * (per if per is not None and part in converted else base))) for part, n in params.items()}
    how = f"{sum(params.values()):,} parameters; {label}"
    if per is not None:
        how += f" at {per:.4f} B per converted parameter; kept at {base} B: " + \
            ", ".join(sorted(p for p in params if p not in converted))
    return out, how


def estimate(config: HFConfig | Mapping[str, Any]) -> WeightsSize:
    """The checkpoint's bytes from config.json alone (raises :class:`UnknownCheckpoint`)."""
    parts, how = part_bytes(HFConfig.of(config))
    return WeightsSize(sum(parts.values()), "estimated", f"estimate from parameters and quantization ({how})",
                       parts=parts)


def served(config: HFConfig, *, dtype: str | None = None, quantization: str | None = None
           ) -> tuple[HFConfig | None, str]:
    """config.json as vLLM holds the model on the GPU under ``--dtype`` and ``--quantization``: the
    model's dtype replaced, and an unquantized checkpoint quantized online to FP8 (vLLM's linear and
    MoE layers take FP8 weights with per-tensor scales; embeddings and the head stay at the dtype).
    (None, "") when the args change nothing; (None, why) when they change what the planner cannot size."""
    quantized = config.quantization() is not None
    changed: dict[str, str | HFConfig | QuantizationConfig] = {}
    said = []
    if dtype and dtype != "auto" and (config.torch_dtype or "").replace("torch.", "") != dtype:
        changed["torch_dtype"] = dtype
        if config.text_config is not None:
            changed["text_config"] = config.text_config.model_copy(update={"torch_dtype": dtype})
        said.append(f"dtype {dtype}")
    if quantization and not quantized:
        if quantization != "fp8":
            return None, (f"quantization {quantization} of an unquantized checkpoint is not one the planner can size "
                          "(it knows online fp8)")
        changed["quantization_config"] = QuantizationConfig(quant_method="fp8")
        said.append("quantization fp8 (online, per-tensor scales)")
    return (config.model_copy(update=changed), ", ".join(said)) if said else (None, "")
