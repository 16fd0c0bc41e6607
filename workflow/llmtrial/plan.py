"""Will it fit? The planner: memory arithmetic for a model on given hardware, before launch.

From a model's ``config.json`` (and the weights' size where known), the hardware (GPUs and
usable memory per GPU, or the CPU KV space per worker) and a configuration's vLLM args, the
planner states what vLLM will report: weights per rank, KV cache bytes per token, KV cache
tokens and maximum concurrency at max_model_len, how many concurrent requests of a given
context fit, a balanced pipeline split, and a verdict with reasons a person can act on.

KV cache tokens follow vLLM's own arithmetic (v1 ``kv_cache_utils``): per rank,
``num_blocks = available_bytes // (block_size * kv_bytes_per_token_on_rank)``, the engine
takes the smallest ``num_blocks`` over ranks, and logs
``int(num_blocks / cdiv(max_model_len, block_size) * max_model_len)`` tokens.

Every figure is labelled: ``predicted`` when it follows from the inputs by vLLM's rules,
``estimated`` when it rests on an assumption (a parameter count, a memory term's rule). The
weights come first from real bytes (staged files, the Hub's file sizes: ``measured``), or a
size a person gave (``given``), and only then from config.json (:mod:`llmtrial.checkpoint`,
which knows the checkpoint's quantization); a GPU plan without any is ``unknown``. The GPU
budget follows vLLM's own accounting term by term (:mod:`llmtrial.budget`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from llmtrial import budget, checkpoint
from llmtrial.budget import MemoryTerms
from llmtrial.checkpoint import WeightsSize
from llmtrial.records import fact, read_record

GiB = 1024**3

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


class PlanError(ValueError):
    """The inputs cannot be planned (a missing config key, a bad argument)."""


@dataclass(frozen=True)
class ModelShape:
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


def _first(cfg: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _layer_kinds(cfg: Mapping[str, Any], num_layers: int, sliding_window: int | None) -> tuple[str, ...]:
    kinds = cfg.get("layer_types") or cfg.get("layers_block_type")
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
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) >= num_layers:
        return tuple("full_attention" if c == "*" else ("state" if c == "M" else "none") for c in pattern[:num_layers])
    if sliding_window and cfg.get("use_sliding_window", True) is not False:
        window_from = cfg.get("max_window_layers")
        if window_from is not None and cfg.get("use_sliding_window") is True:
            return tuple("full_attention" if i < window_from else "sliding_attention" for i in range(num_layers))
        if cfg.get("use_sliding_window") is None and "max_window_layers" not in cfg:
            return ("sliding_attention",) * num_layers
    return ("full_attention",) * num_layers


def model_shape(config: Mapping[str, Any], *, dtype: str | None = None) -> ModelShape:
    """Read a Hugging Face ``config.json`` (text part of a multimodal one) into a ModelShape."""
    cfg = config.get("text_config") or config.get("llm_config") or config
    try:
        num_layers = int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        hidden = int(_first(cfg, "hidden_size", "d_model", "n_embd"))
        heads = int(_first(cfg, "num_attention_heads", "n_head"))
    except TypeError:
        raise PlanError("config.json lacks num_hidden_layers, hidden_size or num_attention_heads") from None
    kv_heads = int(_first(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num", default=heads))
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    dtype_name = str(dtype or _first(cfg, "torch_dtype", "dtype", default=config.get("torch_dtype", "bfloat16")))
    dtype_name = dtype_name.replace("torch.", "")
    if dtype_name not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {dtype_name!r} in config.json")
    sliding = _first(cfg, "sliding_window", "attention_window_size")
    sliding = int(sliding) if isinstance(sliding, (int, float)) and sliding else None
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0))
    experts = _first(cfg, "num_experts", "n_routed_experts", "num_local_experts")
    state = None
    if cfg.get("mamba_d_state") or cfg.get("ssm_state_size") or cfg.get("state_size"):
        d_state = int(_first(cfg, "mamba_d_state", "ssm_state_size", "state_size"))
        expand = int(_first(cfg, "mamba_expand", "expand", default=2))
        d_conv = int(_first(cfg, "mamba_d_conv", "conv_kernel", "d_conv", default=4))
        inner = expand * hidden
        state = (inner * d_state + inner * d_conv) * DTYPE_BYTES[dtype_name]
    return ModelShape(
        num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        hidden_size=hidden, vocab_size=int(_first(cfg, "vocab_size", default=config.get("vocab_size", 0))),
        dtype_bytes=DTYPE_BYTES[dtype_name],
        tie_word_embeddings=bool(_first(config, "tie_word_embeddings", default=cfg.get("tie_word_embeddings", False))),
        layer_kinds=_layer_kinds(cfg, num_layers, sliding), sliding_window=sliding, mla_kv_dim=mla,
        num_experts=int(experts) if experts else None,
        intermediate_size=_first(cfg, "intermediate_size", "ffn_hidden_size"),
        moe_intermediate_size=cfg.get("moe_intermediate_size"),
        state_bytes_per_layer=state,
    )


# --------------------------------------------------------------------------- inputs


@dataclass
class Hardware:
    """Where the model runs: GPUs and usable memory each, or a CPU KV space per worker."""

    gpus: int = 0
    gpu_memory_gib: float | None = None
    cpu_kv_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE
    cpu_kv_space_assumed: bool = False  # True when the KV space is a guess, not the configured value

    @property
    def is_cpu(self) -> bool:
        return self.gpus == 0


def _flag(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes", "")


@dataclass
class ServingArgs:
    """The vLLM arguments that change memory, from a configuration's args and env."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    cpu_offload_gb: float = 0.0
    cpu_offload_params: tuple[str, ...] = ()
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None
    pp_layer_partition: list[int] | None = None
    dtype: str | None = None
    enforce_eager: bool = False
    cudagraphs_in_budget: bool = True  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (vLLM >= 0.21)

    @classmethod
    def from_config(cls, args: Mapping[str, Any], env: Mapping[str, str] | None = None) -> "ServingArgs":
        """From a configuration's ``args`` mapping (dashes or underscores) and ``env``."""
        norm = {str(k).lstrip("-").replace("-", "_"): v for k, v in args.items()}
        norm.setdefault("kv_cache_memory_bytes", norm.get("kv_cache_memory"))
        out = cls()
        for name, conv in (("tensor_parallel_size", int), ("pipeline_parallel_size", int),
                           ("gpu_memory_utilization", float), ("max_model_len", int), ("max_num_seqs", int),
                           ("max_num_batched_tokens", int), ("cpu_offload_gb", float), ("block_size", int),
                           ("kv_cache_memory_bytes", int)):
            if norm.get(name) is not None:
                setattr(out, name, conv(norm[name]))
        for short, name in (("tp", "tensor_parallel_size"), ("pp", "pipeline_parallel_size")):
            if norm.get(short) is not None:
                setattr(out, name, int(norm[short]))
        if norm.get("kv_cache_dtype"):
            out.kv_cache_dtype = str(norm["kv_cache_dtype"])
        if norm.get("dtype") and str(norm["dtype"]) != "auto":
            out.dtype = str(norm["dtype"])
        params = norm.get("cpu_offload_params")
        if params:
            out.cpu_offload_params = tuple(params if isinstance(params, (list, tuple)) else str(params).split(","))
        out.enable_expert_parallel = "enable_expert_parallel" in norm and _flag(norm["enable_expert_parallel"])
        out.enforce_eager = "enforce_eager" in norm and _flag(norm["enforce_eager"])
        env = env or {}
        out.cudagraphs_in_budget = str(env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1")) != "0"
        partition = env.get("VLLM_PP_LAYER_PARTITION")
        if partition:
            try:
                out.pp_layer_partition = [int(x) for x in str(partition).split(",")]
            except ValueError:
                raise PlanError(f"VLLM_PP_LAYER_PARTITION {partition!r} is not a comma-separated list of integers") from None
        return out


@dataclass
class Extras:
    """What lives on the first or last pipeline stage only, beyond the layers."""

    last_stage_bytes: int = 0  # e.g. a speculative-decoding draft module
    pinned_last_layers: int = 0  # layers that must sit on the last stage (the model's tail)


@dataclass
class Plan:
    verdict: str
    reasons: list[str]
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": self.reasons, **self.data, "facts": self.facts}


# --------------------------------------------------------------------------- arithmetic


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads each TP rank caches: split when they divide, replicated when TP exceeds them."""
    return max(1, num_kv_heads // tp)


def kv_bytes_per_token_per_layer(shape: ModelShape, tp: int, kv_dtype_bytes: int) -> tuple[int, int]:
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
                 zip(available_bytes_per_rank, bytes_per_token_per_rank) if per_token > 0)
    per_request = math.ceil(max_model_len / block_size)
    concurrency = blocks / per_request
    return blocks, int(concurrency * max_model_len), concurrency


def _blocking(shape: ModelShape, hardware: Hardware, args: ServingArgs) -> tuple[list[str], list[str]]:
    """(reasons vLLM would refuse the configuration for in a second, other remarks)."""
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    blocking: list[str] = []
    reasons: list[str] = []
    if not hardware.is_cpu and tp * pp > hardware.gpus:
        blocking.append(f"TP x PP = {tp * pp} GPUs asked, {hardware.gpus} available.")
    if shape.num_heads % tp:
        blocking.append(f"Total number of attention heads ({shape.num_heads}) must be divisible by tensor parallel "
                        f"size ({tp}): pick a TP size that divides {shape.num_heads}.")
    if shape.mla_kv_dim is None and tp > shape.num_kv_heads and tp % shape.num_kv_heads:
        blocking.append(f"TP {tp} exceeds the {shape.num_kv_heads} KV heads and is not a multiple of them.")
    elif shape.mla_kv_dim is None and tp <= shape.num_kv_heads and shape.num_kv_heads % tp:
        blocking.append(f"KV heads ({shape.num_kv_heads}) must be divisible by tensor parallel size ({tp}).")
    if shape.mla_kv_dim is None and tp > shape.num_kv_heads and not blocking:
        reasons.append(f"TP {tp} exceeds the {shape.num_kv_heads} KV heads: each rank replicates one KV head, "
                       "so KV memory does not shrink further with TP.")
    if shape.num_experts and args.enable_expert_parallel and shape.num_experts % tp:
        blocking.append(f"{shape.num_experts} experts cannot be split evenly over an expert parallel size of {tp}.")
    if pp > shape.num_layers:
        blocking.append(f"Pipeline parallel size {pp} exceeds the {shape.num_layers} layers.")
    return blocking, reasons


@dataclass(frozen=True)
class Layout:
    """Where the weights sit: bytes of the embeddings, the head on the last stage, and per layer
    the part split over TP ranks, the part every rank holds, and the routed experts."""

    embed: float
    head: float
    layer_split: float
    layer_replicated: float
    layer_experts: float | None  # None when the architecture's parts are not known

    def stage_bytes(self, layers: int, first: bool, last: bool, tp: int, last_extra: float = 0.0) -> float:
        out = layers * (self.layer_split / tp + self.layer_replicated)
        return out + (self.embed / tp if first else 0.0) + ((self.head + last_extra) / tp if last else 0.0)


def layout(config: Mapping[str, Any], shape: ModelShape, total: int, pp: int) -> Layout:
    """Split ``total`` weight bytes into the parts that place them: in the proportions of the
    parts' estimated bytes when the architecture is known, else embeddings at the model's dtype
    and the rest evenly over the layers."""
    try:
        parts, _ = checkpoint.part_bytes(config)
    except checkpoint.UnknownCheckpoint:
        parts = None
    if parts and total:
        scale = total / max(1, sum(parts.values()))
        embed, head_file = parts["embed"] * scale, parts.get("lm_head", 0) * scale
    else:
        embed = float(shape.vocab_size * shape.hidden_size * shape.dtype_bytes)
        head_file = 0.0 if shape.tie_word_embeddings else embed
    body = max(0.0, total - embed - head_file)
    head = head_file if head_file else (embed if pp > 1 else 0.0)  # a tied head is a copy on the last stage
    if not parts or not total:
        return Layout(embed, head, body / shape.num_layers, 0.0, None)
    per_layer = scale / shape.num_layers
    replicated = sum(parts.get(k, 0) for k in checkpoint.REPLICATED_PARTS) * per_layer
    return Layout(embed, head, body / shape.num_layers - replicated, replicated, parts.get("experts", 0) * per_layer)


def _offload(args: ServingArgs, lay: Layout, stages: list[int], stage_bytes: list[float],
             reasons: list[str]) -> list[float]:
    """Bytes each rank offloads to CPU memory: ``cpu_offload_gb``, at most what the targeted
    parameters (``cpu_offload_params``, such as ``experts``) weigh on that rank."""
    want = args.cpu_offload_gb * GiB
    if want <= 0:
        return [0.0] * len(stages)
    if not args.cpu_offload_params:
        return [min(want, b) for b in stage_bytes]
    if "experts" not in args.cpu_offload_params or lay.layer_experts is None:
        reasons.append(f"cpu_offload_params {','.join(args.cpu_offload_params)}: the planner cannot size those "
                       f"parameters, so it assumes all {args.cpu_offload_gb:g} GiB per GPU can be offloaded.")
        return [min(want, b) for b in stage_bytes]
    tp = args.tensor_parallel_size
    out = [min(want, n * lay.layer_experts / tp) for n in stages]
    short = [i for i, o in enumerate(out) if o < want]
    if short:
        reasons.append(f"Expert weights on stage {short[0]} weigh {out[short[0]] / GiB:.2f} GiB per rank, less than "
                       f"cpu_offload_gb {args.cpu_offload_gb:g}: only they are offloaded.")
    return out


def _weights(config: Mapping[str, Any], weights: WeightsSize | None) -> WeightsSize:
    """The weights to plan on: those given, else the estimate from config.json (raises
    :class:`checkpoint.UnknownCheckpoint` with the reason when there is none)."""
    return weights if weights is not None else checkpoint.estimate(config)


def _kv_per_token(shape: ModelShape, args: ServingArgs, stages: list[int], reasons: list[str]) -> tuple[int, list[int]]:
    """KV bytes one token costs: (whole model, per rank of each stage)."""
    kv_dtype = shape.dtype_bytes if args.kv_cache_dtype == "auto" else DTYPE_BYTES.get(args.kv_cache_dtype)
    if kv_dtype is None:
        raise PlanError(f"unknown kv_cache_dtype {args.kv_cache_dtype!r}")
    layer_whole, layer_rank = kv_bytes_per_token_per_layer(shape, args.tensor_parallel_size, kv_dtype)
    cached = ("full_attention", "sliding_attention")
    per_token_whole = sum(1 for k in shape.layer_kinds if k in cached) * layer_whole
    bounds = [sum(stages[:i]) for i in range(len(stages) + 1)]
    per_token_rank = [sum(layer_rank for j in range(bounds[i], bounds[i + 1]) if shape.layer_kinds[j] in cached)
                      for i in range(len(stages))]
    sliding = shape.layer_kinds.count("sliding_attention")
    state = shape.layer_kinds.count("state")
    if sliding:
        reasons.append(f"{sliding} sliding-window layers (window {shape.sliding_window}) hold at most "
                       "the window per sequence; capacity is counted on all attention layers (a lower bound).")
    if state:
        reasons.append(f"{state} linear-attention/Mamba layers keep state per sequence "
                       f"({shape.state_bytes_per_layer or 'unknown'} B per layer), not per token.")
    return per_token_whole, per_token_rank


def _kv_memory(hardware: Hardware, args: ServingArgs, shape: ModelShape, weights_per_rank: list[float],
               weights_kind: str, available_kv_gib: float | None, memory: MemoryTerms,
               facts: dict[str, dict[str, Any]]) -> tuple[list[float], str, str]:
    """KV memory per rank of each stage, its kind and its source; GPU terms go into ``facts``."""
    pp = len(weights_per_rank)
    if available_kv_gib is not None:
        return [available_kv_gib * GiB] * pp, "measured", "given (vLLM's logged Available KV cache memory)"
    if args.kv_cache_memory_bytes is not None:
        return [float(args.kv_cache_memory_bytes)] * pp, "predicted", "kv_cache_memory_bytes per worker"
    if hardware.is_cpu:
        if hardware.cpu_kv_space_gib is None:
            raise PlanError("a CPU plan needs the KV space per worker (VLLM_CPU_KVCACHE_SPACE)")
        source = f"VLLM_CPU_KVCACHE_SPACE={hardware.cpu_kv_space_gib:g} GiB per worker" + (
            " (assumed)" if hardware.cpu_kv_space_assumed else "")
        return ([hardware.cpu_kv_space_gib * GiB] * pp, "estimated" if hardware.cpu_kv_space_assumed else "predicted",
                source)
    if hardware.gpu_memory_gib is None:
        raise PlanError("a GPU plan needs the usable memory per GPU")
    gpu = budget.terms(gpu_memory_gib=hardware.gpu_memory_gib, utilization=args.gpu_memory_utilization,
                       workers=args.tensor_parallel_size * args.pipeline_parallel_size, hidden_size=shape.hidden_size,
                       vocab_size=shape.vocab_size, dtype_bytes=shape.dtype_bytes,
                       max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                       enforce_eager=args.enforce_eager, cudagraphs_in_budget=args.cudagraphs_in_budget, given=memory)
    facts.update(gpu)
    lost = budget.overhead(gpu)
    avail = [gpu["gpu_budget_bytes"]["value"] - w - lost for w in weights_per_rank]
    kind = budget.derived_kind(weights_kind, *(f["kind"] for f in gpu.values()))
    return avail, kind, "gpu_budget_bytes - weights per rank - non_torch_bytes - peak_activation_bytes - cuda_graph_bytes"


def _shortfall(facts: dict[str, dict[str, Any]], weights_per_rank: list[float], avail: list[float]) -> str:
    worst = min(range(len(avail)), key=lambda i: avail[i])
    if "gpu_budget_bytes" not in facts:
        return f"No memory left for the KV cache on stage {worst}."
    total = facts["gpu_budget_bytes"]
    lost = budget.overhead(facts)
    return (f"No memory left for the KV cache on stage {worst}: {weights_per_rank[worst] / GiB:.2f} GiB of weights per "
            f"rank and {lost / GiB:.2f} GiB of non-torch memory, activations and CUDA graphs exceed the budget of "
            f"{total['value'] / GiB:.2f} GiB ({total['source']}) by {-avail[worst] / GiB:.2f} GiB; add GPUs (TP/PP), "
            "quantize, or offload with cpu_offload_gb.")


def _figures(size: WeightsSize, weights_per_rank: list[float], offload: list[float], per_token_whole: int,
             per_token_rank: list[int], avail: list[float], avail_kind: str, avail_source: str, tokens: int,
             concurrency: float) -> dict[str, dict[str, Any]]:
    """The plan's figures as facts, each with its kind."""
    rank_kind = budget.derived_kind(size.kind)
    kv_kind = budget.derived_kind(avail_kind)
    return {
        "weights_bytes_per_rank": fact([int(w) for w in weights_per_rank], "planner", kind=rank_kind, unit="B"),
        "offload_bytes_per_rank": fact([int(o) for o in offload], "planner", kind=rank_kind, unit="B"),
        "kv_cache_bytes_per_token": fact(per_token_whole, "planner", kind="predicted", unit="B"),
        "kv_cache_bytes_per_token_per_rank": fact(per_token_rank, "planner", kind="predicted", unit="B"),
        "available_kv_bytes_per_rank": fact([int(a) for a in avail], avail_source, kind=avail_kind, unit="B"),
        "predicted_kv_cache_tokens": fact(tokens, "planner", kind=kv_kind, unit="tokens"),
        "max_concurrency": fact(round(concurrency, 2), "planner", kind=kv_kind, unit="x"),
    }


def plan(config: Mapping[str, Any], hardware: Hardware, args: ServingArgs, *, weights: WeightsSize | None = None,
         available_kv_gib: float | None = None, contexts: list[int] | None = None, extras: Extras | None = None,
         memory: MemoryTerms | None = None) -> Plan:
    """Plan one configuration; see the module docstring for what comes out."""
    extras = extras or Extras()
    shape = model_shape(config, dtype=args.dtype)
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    blocking, reasons = _blocking(shape, hardware, args)
    try:
        stages = split_layers(shape.num_layers, pp, args.pp_layer_partition)
    except PlanError as exc:
        blocking.append(str(exc))
        stages = split_layers(shape.num_layers, pp)
    try:
        size = _weights(config, weights)
    except checkpoint.UnknownCheckpoint as exc:
        if not hardware.is_cpu:
            return Plan("does_not_fit" if blocking else "unknown", blocking + [f"Weights: {exc}"],
                        facts={"weights_bytes": fact(None, str(exc), kind="unknown", unit="B")})
        size = WeightsSize(0, "unknown", str(exc))  # a CPU KV space does not depend on the weights
    lay = layout(config, shape, size.bytes, pp)
    stage_bytes = [lay.stage_bytes(n, i == 0, i == pp - 1, tp, extras.last_stage_bytes) for i, n in enumerate(stages)]
    offload = _offload(args, lay, stages, stage_bytes, reasons)
    weights_per_rank = [max(0.0, b - o) for b, o in zip(stage_bytes, offload)]
    per_token_whole, per_token_rank = _kv_per_token(shape, args, stages, reasons)
    facts: dict[str, dict[str, Any]] = {"weights_bytes": size.fact()}
    avail, avail_kind, avail_source = _kv_memory(hardware, args, shape, weights_per_rank, size.kind, available_kv_gib,
                                                 memory or MemoryTerms(), facts)
    block_size = args.block_size or (DEFAULT_CPU_BLOCK_SIZE if hardware.is_cpu else DEFAULT_GPU_BLOCK_SIZE)
    if shape.mla_kv_dim is not None and hardware.is_cpu:
        block_size = 16
    max_len = args.max_model_len or int(_first(config.get("text_config") or config, "max_position_embeddings", default=2048))
    blocks = tokens = 0
    concurrency = 0.0
    if min(avail) <= 0:
        blocking.append(_shortfall(facts, weights_per_rank, avail))
    else:
        blocks, tokens, concurrency = predict_kv_tokens(avail, per_token_rank, block_size, max_len)
        if concurrency < 1:
            blocking.append(f"The KV cache holds {tokens:,} tokens, less than one request at max_model_len {max_len:,}: "
                            f"lower max_model_len to at most {blocks * block_size:,} or free memory.")
    verdict = "does_not_fit" if blocking else "fits"
    if not blocking and not hardware.is_cpu and any(offload):
        verdict = "fits_with_offload"
        reasons.append(f"Fits with {max(offload) / GiB:.2f} GiB per GPU offloaded to CPU memory (slower: weights "
                       "cross the host link on every step).")
    recommended = None
    if pp > 1:
        try:
            recommended = recommend_partition(shape.num_layers, pp, lay.layer_split / tp + lay.layer_replicated,
                                              first_extra=lay.embed / tp, last_extra=(lay.head + extras.last_stage_bytes) / tp,
                                              pinned_last_layers=extras.pinned_last_layers)
        except PlanError as exc:
            reasons.append(str(exc))
    facts.update(_figures(size, weights_per_rank, offload, per_token_whole, per_token_rank, avail, avail_kind,
                          avail_source, tokens, concurrency))
    data = {
        "kv_cache_bytes_per_token": per_token_whole,
        "kv_cache_bytes_per_token_per_rank": per_token_rank[0] if pp == 1 else per_token_rank,
        "weights_bytes": size.bytes,
        "weights_kind": size.kind,
        "weights_source": size.source,
        "weights_bytes_per_rank": [int(w) for w in weights_per_rank],
        "stage_layers": stages,
        "available_kv_bytes_per_rank": [int(a) for a in avail],
        "block_size": block_size,
        "num_blocks": blocks,
        "predicted_kv_cache_tokens": tokens,
        "max_model_len": max_len,
        "max_concurrency": round(concurrency, 2),
        "preemption_boundary": {str(c): (blocks // math.ceil(c / block_size) if blocks else 0)
                                for c in (contexts or [max_len])},
        "pp_layer_partition": ",".join(map(str, recommended)) if recommended else None,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "kv_heads_per_rank": None if shape.mla_kv_dim is not None else kv_heads_per_rank(shape.num_kv_heads, tp),
    }
    return Plan(verdict=verdict, reasons=blocking + reasons, facts=facts, data=data)


def read_model_config(path: str | Path) -> dict[str, Any]:
    """A config.json, or a model folder holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        return read_record(p)
    except (FileNotFoundError, ValueError) as exc:
        raise PlanError(f"model config: {exc}") from None
