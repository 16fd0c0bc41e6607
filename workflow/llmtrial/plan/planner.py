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
size a person gave (``given``), and only then from config.json (:mod:`llmtrial.plan.checkpoint`,
which knows the checkpoint's quantization); a GPU plan without any is ``unknown``. The GPU
budget follows vLLM's own accounting term by term (:mod:`llmtrial.plan.budget`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmtrial.core.configuration_spec import ServingSpec
from llmtrial.core.preflight_model import Gpus, Probes
from llmtrial.core.record_models import Hardware as PlannedHardware
from llmtrial.core.record_models import ModelShape, PlanRecord
from llmtrial.core.records import fact
from llmtrial.core.trial_config import HardwareBlock, PlanBlock
from llmtrial.core.units import GiB
from llmtrial.plan import budget, checkpoint
from llmtrial.plan.budget import MemoryTerms
from llmtrial.plan.ceiling import plan_ceiling
from llmtrial.plan.checkpoint import WeightsSize
from llmtrial.plan.hf_config import HFConfig, first_set
from llmtrial.plan.launch_checks import configuration_checks, refusals
from llmtrial.plan.plan_inputs import HardwareInputs, ServingArgs
from llmtrial.plan.shape import (
    CACHED_KINDS,
    DEFAULT_CPU_BLOCK_SIZE,
    DEFAULT_GPU_BLOCK_SIZE,
    DTYPE_BYTES,
    ConfigShape,
    PlanError,
    kv_bytes_per_token_per_layer,
    kv_heads_per_rank,
    kv_layer_slots,
    model_shape,
    predict_kv_tokens,
    recommend_partition,
    rope_cache_bytes,
    split_layers,
)

#: KV space per worker the plan assumes on a CPU host when none is configured.
ASSUMED_CPU_KV_GIB = 4.0


# --------------------------------------------------------------------------- inputs


@dataclass
class Extras:
    """What lives on the first or last pipeline stage only, beyond the layers."""

    last_stage_bytes: int = 0  # e.g. a speculative-decoding draft module
    pinned_last_layers: int = 0  # layers that must sit on the last stage (the model's tail)


@dataclass
class Plan:
    """The planner's answer: verdict, reasons, figures as facts (with their kinds) and as plain data."""

    verdict: str
    reasons: list[str]
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- arithmetic


@dataclass(frozen=True)
class Layout:
    """Where the weights sit: bytes of the embeddings, the head on the last stage, and per layer
    the part split over TP ranks, the part every rank holds, and the routed experts."""

    embed: float
    head: float
    layer_split: float
    layer_replicated: float
    layer_experts: float | None  # None when the architecture's parts are not known

    def stage_bytes(self, layers: int, first: bool, last: bool, tp: int, last_extra: float = 0.0, ep: int = 0) -> float:
        """Bytes one rank of a stage holds; ``ep``: the expert parallel size the routed experts are split
        over instead of TP (data x tensor parallel with expert parallel on), 0 for none."""
        experts = (self.layer_experts or 0.0) if ep else 0.0
        out = layers * ((self.layer_split - experts) / tp + experts / max(1, ep) + self.layer_replicated)
        return out + (self.embed / tp if first else 0.0) + ((self.head + last_extra) / tp if last else 0.0)


def layout(config: HFConfig, shape: ConfigShape, total: int, pp: int) -> Layout:
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


def _weights(config: HFConfig, weights: WeightsSize | None, args: ServingArgs,
             reasons: list[str]) -> WeightsSize:
    """The weights to plan on, as vLLM holds them: those given, else the estimate from config.json
    (raises :class:`checkpoint.UnknownCheckpoint` with the reason when there is none); where
    ``--dtype`` or ``--quantization`` changes them on the GPU, the estimate as served (a size given
    or measured on disk is scaled by the estimates' ratio)."""
    stored = weights if weights is not None else checkpoint.estimate(config)
    as_served, what = checkpoint.served(config, dtype=args.dtype, quantization=args.quantization)
    if as_served is None:
        if what:
            reasons.append(f"Weights: {what}; planned at the checkpoint's size.")
        return stored
    try:
        est = checkpoint.estimate(as_served)
        ratio = est.bytes / max(1, checkpoint.estimate(config).bytes) if weights is not None else 1.0
    except checkpoint.UnknownCheckpoint as exc:
        reasons.append(f"Weights: served with {what}, which the planner cannot size ({exc}); planned at the "
                       "checkpoint's size.")
        return stored
    if weights is None:
        return WeightsSize(est.bytes, "estimated", f"{est.source}, served with {what}", parts=est.parts)
    return WeightsSize(int(stored.bytes * ratio), "estimated",
                       f"{stored.source} ({stored.kind}), times {ratio:.4f} for {what} (the estimates' ratio)")


def _kv_per_token(shape: ConfigShape, args: ServingArgs, stages: list[int], reasons: list[str]) -> tuple[int, list[int]]:
    """KV bytes one token costs: (whole model, per rank of each stage)."""
    kv_dtype = shape.dtype_bytes if args.kv_cache_dtype == "auto" else DTYPE_BYTES.get(args.kv_cache_dtype)
    if kv_dtype is None:
        raise PlanError(f"unknown kv_cache_dtype {args.kv_cache_dtype!r}")
    layer_whole, layer_rank = kv_bytes_per_token_per_layer(shape, args.tensor_parallel_size, kv_dtype)
    slots, grouped = kv_layer_slots(shape.layer_kinds)
    per_token_whole = slots * layer_whole
    bounds = [sum(stages[:i]) for i in range(len(stages) + 1)]
    per_token_rank = [kv_layer_slots(shape.layer_kinds[bounds[i]:bounds[i + 1]])[0] * layer_rank
                      for i in range(len(stages))]
    sliding = shape.layer_kinds.count("sliding_attention")
    state = shape.layer_kinds.count("state")
    if grouped and slots > sum(1 for k in shape.layer_kinds if k in CACHED_KINDS):
        reasons.append(f"vLLM's hybrid KV cache manager holds {grouped}: a token costs {slots} layers' KV, and "
                       "the KV cache tokens vLLM logs are those of one group.")
    if sliding:
        reasons.append(f"{sliding} sliding-window layers (window {shape.sliding_window}) hold at most "
                       "the window per sequence; capacity is counted on all attention layers (a lower bound).")
    if state:
        reasons.append(f"{state} linear-attention/Mamba layers keep state per sequence "
                       f"({shape.state_bytes_per_layer or 'unknown'} B per layer), not per token.")
    return per_token_whole, per_token_rank


def moe_workspace_per_token(config: HFConfig, shape: ConfigShape, moe_tp: int) -> int:
    """Bytes per batched token of the fused-MoE workspace vLLM 0.19 allocates in its profiling run and
    keeps (``FusedMoEModularKernel._allocate_buffers`` through the persistent ``WorkspaceManager``,
    one buffer for all layers), for the Triton experts its unquantized backend takes on CUDA
    (``TritonExperts.workspace_shapes``, ``fused_moe.py``): M tokens x top-k x max(I, H) for the
    activation's output (shared with the M x H output, never larger) and M x top-k x max(2I, H) for
    the gate/up output and then the down projection's, I the experts' width over ``moe_tp`` (the TP
    size, 1 under expert parallel), H the hidden size, in the model's dtype; each part is rounded up
    to 256 B, nothing at a multiple of 128 tokens. 0 for MXFP4 experts: on Hopper and Blackwell vLLM
    prefers monolithic kernels for them (``OAITritonMxfp4ExpertsMonolithic`` on Hopper, FlashInfer's
    TRT-LLM one on Blackwell), which take no workspace from the manager. Other kernels (DeepGEMM,
    CUTLASS, Marlin) and data parallel's gathered tokens are not derived: the Triton figure stands
    for them."""
    cfg = config.text()
    topk = first_set(cfg.num_experts_per_tok, cfg.moe_topk, cfg.top_k_experts)
    inter = shape.moe_intermediate_size or (shape.intermediate_size if shape.num_experts else None)
    quant = config.quantization()
    if not shape.num_experts or not topk or not inter or (quant and quant.quant_method == "mxfp4"):
        return 0
    width, hidden = int(inter) // moe_tp, shape.hidden_size
    return int(topk) * (max(width, hidden) + max(2 * width, hidden)) * shape.dtype_bytes


def _custom_all_reduce(hardware: HardwareInputs, args: ServingArgs) -> bool | None:
    """Whether vLLM's custom all-reduce runs (and allocates its buffers): TP of 2, 4, 6 or 8 over GPUs
    with peer access, unless disabled; None where peer access is not known."""
    if args.disable_custom_all_reduce or args.tensor_parallel_size not in (2, 4, 6, 8):
        return False
    return hardware.peer_access


def _kv_memory(hardware: HardwareInputs, args: ServingArgs, shape: ConfigShape, weights_per_rank: list[float],
               weights_kind: str, available_kv_gib: float | None, memory: MemoryTerms,
               facts: dict[str, dict[str, Any]], *, moe_per_token: int = 0,
               vllm_version: str | None = None, layers_per_rank: int = 0) -> tuple[list[float], str, str]:
    """KV memory per rank of each stage, its kind and its source; GPU terms go into ``facts``."""
    pp = len(weights_per_rank)
    if available_kv_gib is not None:
        return [available_kv_gib * GiB] * pp, "measured", "given (vLLM's logged Available KV cache memory)"
    cpu_env = hardware.is_cpu and hardware.cpu_kv_space_gib is not None and not hardware.cpu_kv_space_assumed
    if args.kv_cache_memory_bytes is not None and not cpu_env:
        return [float(args.kv_cache_memory_bytes)] * pp, "predicted", "kv_cache_memory_bytes per worker"
    if hardware.is_cpu:  # vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE override kv_cache_memory_bytes
        if hardware.cpu_kv_space_gib is None:
            raise PlanError("a CPU plan needs the KV space per worker (VLLM_CPU_KVCACHE_SPACE)")
        source = f"VLLM_CPU_KVCACHE_SPACE={hardware.cpu_kv_space_gib:g} GiB per worker" + (
            " (assumed)" if hardware.cpu_kv_space_assumed else "")
        return ([hardware.cpu_kv_space_gib * GiB] * pp, "estimated" if hardware.cpu_kv_space_assumed else "predicted",
                source)
    if hardware.gpu_memory_gib is None:
        raise PlanError("a GPU plan needs the usable memory per GPU")
    gpu = budget.terms(gpu_memory_gib=hardware.gpu_memory_gib, utilization=args.gpu_memory_utilization,
                       tp=args.tensor_parallel_size, pp=args.pipeline_parallel_size, hidden_size=shape.hidden_size,
                       vocab_size=shape.vocab_size, dtype_bytes=shape.dtype_bytes,
                       max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                       enforce_eager=args.enforce_eager, cudagraphs_in_budget=args.cudagraphs_in_budget, given=memory,
                       moe_workspace_per_token=moe_per_token,
                       mlp_intermediate_size=0 if shape.num_experts else shape.intermediate_size or 0,
                       vllm_version=vllm_version,
                       custom_all_reduce=_custom_all_reduce(hardware, args), layers_per_rank=layers_per_rank)
    facts.update(gpu)
    lost = budget.overhead(gpu)
    avail = [gpu["gpu_budget_bytes"]["value"] - w - lost for w in weights_per_rank]
    kind = budget.derived_kind(weights_kind, *(gpu[k]["kind"] for k in budget.BUDGET_TERMS))
    return avail, kind, "gpu_budget_bytes - weights per rank - non_torch_bytes - peak_activation_bytes - cuda_graph_bytes"


def _beyond_gpus(size: WeightsSize, hardware: HardwareInputs, args: ServingArgs) -> str:
    """Where the checkpoint's weights are more than the memory of all the configuration's GPUs together (data x
    tensor x pipeline parallel of them, each with the usable memory given), a sentence saying how many times:
    no split fits them. "" where they are not, or on a CPU host."""
    gpus = args.gpus_asked
    whole = gpus * (hardware.gpu_memory_gib or 0.0) * GiB
    if hardware.is_cpu or not whole or size.bytes <= whole:
        return ""
    return (f" The checkpoint's {size.bytes / GiB:,.2f} GiB of weights are {size.bytes / whole:.2f}x the memory of the "
            f"{gpus} GPU{'s' if gpus > 1 else ''} ({gpus} x {hardware.gpu_memory_gib:g} GiB = {whole / GiB:,.2f} GiB): "
            "no split fits them without offloading weights to CPU memory (cpu_offload_gb; cpu_offload_params experts "
            "keeps every other weight on the GPUs) or a smaller quantization.")


def _shortfall(facts: dict[str, dict[str, Any]], weights_per_rank: list[float], avail: list[float],
               beyond: str = "") -> str:
    """Why no memory is left for the KV cache, on the stage that lacks the most; ``beyond``: the sentence of
    :func:`_beyond_gpus`, appended."""
    worst = min(range(len(avail)), key=lambda i: avail[i])
    if "gpu_budget_bytes" not in facts:
        return f"No memory left for the KV cache on stage {worst}.{beyond}"
    total = facts["gpu_budget_bytes"]
    lost = budget.overhead(facts)
    return (f"No memory left for the KV cache on stage {worst}: {weights_per_rank[worst] / GiB:.2f} GiB of weights per "
            f"rank and {lost / GiB:.2f} GiB of non-torch memory, activations and CUDA graphs exceed the budget of "
            f"{total['value'] / GiB:.2f} GiB ({total['source']}) by {-avail[worst] / GiB:.2f} GiB; add GPUs (TP/PP), "
            f"quantize, or offload with cpu_offload_gb.{beyond}")


def _partition(shape: ConfigShape, pp: int, tp: int, lay: Layout, extras: Extras, reasons: list[str]) -> list[int] | None:
    """The balanced pipeline split to recommend (None with PP 1, or with the reason when none exists)."""
    if pp == 1:
        return None
    try:
        return recommend_partition(shape.num_layers, pp, lay.layer_split / tp + lay.layer_replicated,
                                   first_extra=lay.embed / tp, last_extra=(lay.head + extras.last_stage_bytes) / tp,
                                   pinned_last_layers=extras.pinned_last_layers)
    except PlanError as exc:
        reasons.append(str(exc))
        return None


def _block_size(shape: ConfigShape, hardware: HardwareInputs, args: ServingArgs) -> int:
    """vLLM's KV block size: 16 for MLA on CPU, else the configuration's, else 128 tokens on CPU
    and 16 on GPU."""
    if hardware.is_cpu and shape.mla_kv_dim is not None:
        return 16
    return args.block_size or (DEFAULT_CPU_BLOCK_SIZE if hardware.is_cpu else DEFAULT_GPU_BLOCK_SIZE)


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


def _placement(config: HFConfig, shape: ConfigShape, size: WeightsSize, args: ServingArgs, stages: list[int],
               extras: Extras, reasons: list[str], rope: int = 0) -> tuple[Layout, list[float], list[float]]:
    """Where the weights sit: their layout, the bytes each rank offloads, and the bytes each rank holds
    (the routed experts over data x tensor parallel ranks with expert parallel, the rest over TP), with
    the ``rope`` cache every rank builds beside them."""
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    lay = layout(config, shape, size.bytes, pp)
    ep = tp * args.data_parallel_size if args.enable_expert_parallel and lay.layer_experts else 0
    stage_bytes = [lay.stage_bytes(n, i == 0, i == pp - 1, tp, extras.last_stage_bytes, ep) + rope
                   for i, n in enumerate(stages)]
    offload = _offload(args, lay, stages, stage_bytes, reasons)
    if args.draft_model and not extras.last_stage_bytes:
        reasons.append(f"speculative_config's draft model {args.draft_model} is not counted (its weights and KV sit "
                       "beside the target's): give its size as plan.last_stage_extra_gib.")
    return lay, offload, [max(0.0, b - o) for b, o in zip(stage_bytes, offload, strict=True)]


def _capacity(avail: list[float], per_token_rank: list[int], block_size: int, max_len: int, blocking: list[str],
              shortfall: Callable[[], str]) -> tuple[int, int, float]:
    """KV blocks, tokens and concurrency; a reason in ``blocking`` where no memory is left or one
    request at max_model_len does not fit."""
    if min(avail) <= 0:
        blocking.append(shortfall())
        return 0, 0, 0.0
    blocks, tokens, concurrency = predict_kv_tokens(avail, per_token_rank, block_size, max_len)
    if concurrency < 1:
        blocking.append(f"The KV cache holds {tokens:,} tokens, less than one request at max_model_len {max_len:,}: "
                        f"lower max_model_len to at most {blocks * block_size:,} or free memory.")
    return blocks, tokens, concurrency


def _stages(shape: ConfigShape, args: ServingArgs, blocking: list[str]) -> list[int]:
    """Layers per pipeline stage: as ``VLLM_PP_LAYER_PARTITION`` asks, else vLLM's even split (a
    partition vLLM would refuse is a blocking reason)."""
    try:
        return split_layers(shape.num_layers, args.pipeline_parallel_size, args.pp_layer_partition)
    except PlanError as exc:
        blocking.append(str(exc))
        return split_layers(shape.num_layers, args.pipeline_parallel_size)


def _verdict(blocking: list[str], hardware: HardwareInputs, offload: list[float], reasons: list[str]) -> str:
    if blocking:
        return "does_not_fit"
    if not hardware.is_cpu and any(offload):
        reasons.append(f"Fits with {max(offload) / GiB:.2f} GiB per GPU offloaded to CPU memory (slower: weights "
                       "cross the host link on every step).")
        return "fits_with_offload"
    return "fits"


def plan(config: HFConfig | Mapping[str, Any], hardware: HardwareInputs, args: ServingArgs, *,
         weights: WeightsSize | None = None, available_kv_gib: float | None = None, contexts: list[int] | None = None,
         extras: Extras | None = None, memory: MemoryTerms | None = None, vllm_version: str | None = None) -> Plan:
    """Plan one configuration; see the module docstring for what comes out. ``vllm_version``: the
    vLLM that will serve it, whose accounting the GPU budget follows (:mod:`llmtrial.plan.budget`)."""
    config = HFConfig.of(config)
    extras = extras or Extras()
    shape = model_shape(config, dtype=args.dtype)
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    blocking, reasons = refusals(shape, config, hardware, args)
    stages = _stages(shape, args, blocking)
    try:
        size = _weights(config, weights, args, reasons)
    except checkpoint.UnknownCheckpoint as exc:
        if not hardware.is_cpu:
            return Plan("does_not_fit" if blocking else "unknown", blocking + [f"Weights: {exc}"],
                        facts={"weights_bytes": fact(None, str(exc), kind="unknown", unit="B")})
        size = WeightsSize(0, "unknown", str(exc))  # a CPU KV space does not depend on the weights
    rope, rope_source = rope_cache_bytes(config, shape)
    lay, offload, weights_per_rank = _placement(config, shape, size, args, stages, extras, reasons, rope)
    per_token_whole, per_token_rank = _kv_per_token(shape, args, stages, reasons)
    facts: dict[str, dict[str, Any]] = {"weights_bytes": fact(size.bytes, size.source, kind=size.kind, unit="B"),
                                        "rope_cache_bytes": fact(rope, rope_source, kind="predicted", unit="B")}
    avail, avail_kind, avail_source = _kv_memory(hardware, args, shape, weights_per_rank, size.kind, available_kv_gib,
                                                 memory or MemoryTerms(), facts, vllm_version=vllm_version,
                                                 moe_per_token=moe_workspace_per_token(
                                                     config, shape, 1 if args.enable_expert_parallel else tp),
                                                 layers_per_rank=max(stages))
    if warning := budget.headroom_warning(facts, hardware.gpu_memory_gib or 0.0, args.gpu_memory_utilization):
        reasons.append(warning)
    block_size = _block_size(shape, hardware, args)
    max_len = args.max_model_len or shape.max_position_embeddings
    beyond = _beyond_gpus(size, hardware, args)
    blocks, tokens, concurrency = _capacity(avail, per_token_rank, block_size, max_len, blocking,
                                            lambda: _shortfall(facts, weights_per_rank, avail, beyond))
    verdict = _verdict(blocking, hardware, offload, reasons)
    recommended = _partition(shape, pp, tp, lay, extras, reasons)
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
        "data_parallel_size": args.data_parallel_size,
        "kv_heads_per_rank": None if shape.mla_kv_dim is not None else kv_heads_per_rank(shape.num_kv_heads, tp),
    }
    return Plan(verdict=verdict, reasons=blocking + reasons, facts=facts, data=data)


# --------------------------------------------------------------------------- the plan record


def _hardware(hardware: HardwareBlock, gpus: Gpus | None, env: Mapping[str, str]) -> HardwareInputs:
    """The hardware a plan assumes: the trial file's figures, else the GPUs preflight found."""
    count = hardware.gpus
    selected = gpus.selected if gpus is not None else None
    devices = [d for d in (gpus.devices if gpus is not None else None) or [] if selected is None or d.index in selected]
    if count is None or isinstance(count, list):
        count = len(selected) if selected is not None else (gpus.count if gpus is not None else 0)
    memory = hardware.gpu_memory_gib
    sizes = [d.memory_total_bytes for d in devices if d.memory_total_bytes]
    if memory is None and sizes:
        memory = min(sizes) / GiB
    kv_space = env.get("VLLM_CPU_KVCACHE_SPACE")
    ids = {str(d.index) for d in devices}
    peer_access = (gpus.peer_access if gpus is not None else None) or {}
    pairs = [ok for pair, ok in peer_access.items() if set(pair.split("-")) <= ids]
    peer = False if False in pairs else (True if pairs and all(pairs) else None)
    return HardwareInputs(gpus=int(count), gpu_memory_gib=memory, peer_access=peer,
                    cpu_kv_space_gib=float(kv_space) if kv_space else (ASSUMED_CPU_KV_GIB if not count else None),
                    cpu_kv_space_assumed=not kv_space)


def plan_record(*, spec: ServingSpec, model_config: HFConfig | Mapping[str, Any] | None, weights: WeightsSize | None,
                gpus: Gpus | None, hardware: HardwareBlock, settings: PlanBlock,
                contexts: list[int] | None = None, available_kv_gib: float | None = None,
                no_config: str = "the model's config.json could not be had before staging",
                probes: Probes | None = None, vllm_version: str | None = None) -> PlanRecord:
    """One configuration's plan record: the planner's verdict, figures and reasons, and the
    checks that depend on the configuration. The plan rule and ``llmtrial plan`` both call it.

    ``spec`` is the configuration (name, args, env, force); ``gpus`` preflight's GPU inventory (None where
    none was taken: the command line's plan); ``hardware`` the trial file's; ``settings`` the trial file's
    ``plan`` block; ``probes`` preflight's probes, for the decode throughput bound
    (:mod:`llmtrial.plan.ceiling`, the fact ``decode_tok_s_ceiling``); ``vllm_version`` the installed vLLM
    preflight recorded. Without a readable config.json
    the verdict is ``unknown`` with the reason."""
    head = {"configuration": spec.name, "force": spec.force}
    unreadable, config = None, None
    if model_config is not None:
        try:
            config = HFConfig.of(model_config)
            model_shape(config)
        except PlanError as exc:  # vLLM may well serve a model the planner cannot read
            unreadable = f"the planner cannot read the model's config.json: {exc}"
    env = dict(spec.env)
    hw = _hardware(hardware, gpus, env)
    hardware_planned = PlannedHardware(gpus=hw.gpus, gpu_memory_gib=hw.gpu_memory_gib, cpu_kv_space_gib=hw.cpu_kv_space_gib,
                                       selected_gpus=list(gpus.selected_gpus or []) if gpus is not None else [])
    if config is None or unreadable:
        return PlanRecord(**head, verdict="unknown", reasons=[unreadable or no_config], checks=[],
                          hardware=hardware_planned, plan={}, facts={})
    args = ServingArgs.from_config(spec.args, env)
    result = plan(config, hw, args, weights=weights, contexts=contexts, available_kv_gib=available_kv_gib,
                  extras=Extras(last_stage_bytes=int(float(settings.last_stage_extra_gib) * GiB),
                                pinned_last_layers=settings.pinned_last_layers),
                  memory=MemoryTerms(non_torch_gib=settings.non_torch_gib, peak_activation_gib=settings.peak_activation_gib,
                                     cuda_graph_gib=settings.cuda_graph_gib),
                  vllm_version=vllm_version)
    nodes_env = {name: dict(block.env) for name, block in spec.nodes.items()}
    checks = configuration_checks(args=args, env=env, gpus=gpus, model_config=config, is_cpu=hw.is_cpu,
                                  name=spec.name,
                                  nodes_env=nodes_env or None)
    failed = [c.detail for c in checks if c.status == "fail"]
    reasons = failed + list(result.reasons)
    if hw.is_cpu and hw.cpu_kv_space_assumed and args.kv_cache_memory_bytes is None:
        reasons.append(f"VLLM_CPU_KVCACHE_SPACE is not set: vLLM sizes the KV cache from free memory at start-up; "
                       f"the plan assumes {ASSUMED_CPU_KV_GIB:g} GiB per worker (an estimate).")
    model = model_summary(config)
    if result.data:
        result.facts["decode_tok_s_ceiling"] = plan_ceiling(result.data, result.facts, model, probes, is_cpu=hw.is_cpu,
                                                            hosts=len(nodes_env) or 1)
    return PlanRecord(**head, verdict="does_not_fit" if failed else result.verdict, reasons=reasons, checks=checks,
                      hardware=hardware_planned, plan=result.data, facts=result.facts, model=model)


def model_summary(model_config: HFConfig | Mapping[str, Any]) -> ModelShape:
    """The model's shape as the planner read it from config.json, for the report."""
    config = HFConfig.of(model_config)
    s = model_shape(config)
    try:
        quant = checkpoint.quantization(config)[2]
    except checkpoint.UnknownCheckpoint as exc:
        quant = f"unknown ({exc})"
    kinds: dict[str, int] = {}
    for kind in s.layer_kinds:
        kinds[kind] = kinds.get(kind, 0) + 1
    return ModelShape(architecture=(config.architectures or [None])[0], layers=s.num_layers,
                      attention_heads=s.num_heads, kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                      hidden_size=s.hidden_size, vocab_size=s.vocab_size, experts=s.num_experts,
                      dtype_bytes=s.dtype_bytes, quantization=quant, layer_kinds=kinds,
                      mla_kv_dim=s.mla_kv_dim, sliding_window=s.sliding_window)
