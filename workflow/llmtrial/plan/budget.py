"""vLLM's GPU memory accounting per rank, term by term, before launch.

vLLM (v1 ``gpu_worker.determine_available_memory``) gives the KV cache what is left of
``gpu_memory_utilization`` x the GPU's total memory after

* the weights the rank holds,
* non-torch memory (NCCL and custom all-reduce buffers, cuBLAS workspaces: what the driver
  shows in use that torch's allocator did not hand out),
* the peak activation of a profiling run with ``max_num_batched_tokens`` tokens (and the
  sampler's logits for ``max_num_seqs`` sequences),
* CUDA graph memory, estimated by capturing graphs once; subtracted since vLLM 0.21 unless
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0``, and zero with ``enforce_eager``.

How vLLM counts these terms differs between releases and GPUs, so a rule is chosen by what the
plan knows (its source says which), and where it does not know, the earlier rule stands:

* non-torch memory: 0.25 GiB on one GPU. With TP > 1, NCCL's buffers: 1.70 GiB (seed 003, vLLM 0.27.1
  on PCIe cards without peer access, where vLLM turns its custom all-reduce off), 2.1 GiB where the
  GPUs reach each other directly and the custom all-reduce allocates its own buffers (vLLM 0.19.0
  logged 2.06-2.13 GiB at TP 2 and 4 on NVLinked H100s). Pipeline stages without TP: 0.07 GiB from
  vLLM 0.19 on (0.19.0 logged it on every stage), 1.70 GiB where the version is unknown or older.
* peak activation: for vLLM 0.19 the terms come from its own code (the 0.19.0 wheel, commit
  2a69949bd; the lines its logs name match), as its ``GPUModelRunner.profile_run`` allocates them:
  ``_dummy_run`` over ``max_num_batched_tokens`` T, whose intermediates are freed when it returns,
  then ``_dummy_sampler_run`` over R = min(``max_num_seqs``, T) rows, so the peak is the larger of
  the two phases, plus what persists across both:

  - the sampler phase: the T x hidden output ``profile_run`` holds, the R last rows and their
    ``torch.rand_like`` (2 x R x hidden), the logits ``compute_logits`` returns in the model's dtype
    over the vocabulary padded to 64 (``VocabParallelEmbedding``, sliced, not copied), their float32
    copy (``Sampler.forward``: ``logits.to(torch.float32)``, none for a float32 model), the float32
    probabilities (``TopKTopPSampler.forward_native``: ``logits.softmax(dtype=torch.float32)``; the
    FlashInfer sampler is off by default) and the exponential noise of the same size
    (``random_sample``: ``torch.empty_like(probs)``): 14 B per row and vocabulary entry in bf16;
    top-k/top-p run in place (``apply_top_k_top_p_triton`` from 8 rows on) with a cached float32
    buffer of min(next power of two of min(SMs, R), SMs) vocabulary rows (132 SMs: an H100 SXM);
  - the forward phase: a dense model's gated MLP holds its gate/up output and activation (3 x the
    intermediate size per rank per token; ``LlamaMLP.forward``: ``gate_up_proj``, then ``act_fn``; a
    plain MLP such as phi-2's holds 2 x, counted as 3 x); the hidden-sized buffers beside them
    depend on torch.compile's buffer reuse, not on vLLM's code: 3.65 of them per token, fitted on
    the two forward-bound start-ups (CodeLlama-7b 0.77 GiB, granite-3.3-8b 0.85 GiB, within 0.01
    GiB); an MoE model's forward counts these buffers and its workspace only;
  - the fused-MoE workspace (``FusedMoEModularKernel._allocate_buffers`` through the persistent
    ``WorkspaceManager``, no chunking in 0.19: ``VLLM_FUSED_MOE_CHUNK_SIZE`` is gone), given per
    batched token by the planner (:func:`llmtrial.plan.planner.moe_workspace_per_token`);
  - 0.036 GiB that vLLM's code does not explain: the median of what the 31 start-ups whose sampler
    phase binds logged beyond the terms above (13 models, dense and MoE, TP 1 to 4: 0.028 to 0.038
    GiB; the logs round to 0.01 GiB). PyTorch's 32 MiB cuBLAS workspace on Hopper, taken through its
    allocator at the first matmul, would account for most of it.

  What the logs show beyond these terms: a pipeline's last stage 0.12 GiB more (the received hidden
  states and residual, ``make_empty_intermediate_tensors``), multimodal models 0.1-0.22 GiB more (the
  encoder profiling's outputs, held in the encoder cache until after the sampler), and Llama-3.1-8B
  served in float32 0.41 GiB more than its forward pass; none of these is counted. Other releases:
  the larger of the fp32 logits and eight hidden-sized buffers per token (seed 003's 0.27.1 logged
  0.76 GiB against 0.58 planned).
* CUDA graph memory: ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` where the configuration sets it;
  else outside the budget before vLLM 0.21 (0.19.0's log says so) and inside from 0.21 on, and for
  an unknown version.

Memory outside the budget must fit in what the utilization leaves free, ``(1 - utilization)`` x
the GPU's memory: vLLM 0.19 captures CUDA graphs there after the KV cache is allocated, then warms
up the sampler over R rows (``Worker.compile_or_warm_up_model``: the hidden states of R tokens, the
R last rows and their random copy, and the sampler's logits, fp32 copy, probabilities and noise;
the top-k/top-p buffer is cached since the profiling run). Two gpt-oss-20b start-ups at utilization
0.95 ran out of memory there (1.84 and 1.55 GiB of graphs, 201,088-entry vocabulary) while one at 0.90
ran. ``headroom_bytes`` is what is left (negative: short); the planner warns when it is short.
CUDA graph memory for it: given, else 0.32 GiB + 0.0177 GiB per layer the rank holds for vLLM
0.19 (fitted on 30 dense start-ups' logged "CUDAGraph memory", largest error 0.21 GiB; MoE models
logged 0-1.1 GiB more), else the 0.32 GiB rule.

Recent vLLM logs these terms in one line per worker ("Free memory on device ... Actual usage
is X GiB for consumed memory (weights + non-torch), Y GiB for peak activation, and Z GiB for
CUDAGraph memory ... Current kv cache memory in use is K GiB"); :mod:`llmtrial.logs.lines` reads
it, so each term here can be put beside the logged one.

A term given in the trial file is ``given``; one this module computes from a rule is
``estimated`` and its source says the rule; zero CUDA graph memory under ``enforce_eager``
is ``predicted``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from llmtrial.core.records import fact
from llmtrial.core.units import GiB

#: Non-torch memory per rank with one GPU, with TP > 1 (NCCL and all-reduce buffers) before vLLM
#: 0.19 (seed 003 logged 56.89 GiB consumed against 55.19 GiB of weights at TP4) and since, and per
#: pipeline stage without TP.
NON_TORCH_SINGLE_GIB = 0.25
NON_TORCH_MULTI_GIB = 1.70
NON_TORCH_TP_GIB = 2.1
NON_TORCH_PP_GIB = 0.07
#: vLLM 0.19's profiling peak (see the module's text): the SMs whose programs each keep a float32
#: vocabulary row for the Triton top-k/top-p (an H100 SXM's), the vocabulary padding of the LM head,
#: the hidden-sized buffers of the forward pass beside a dense MLP's (fitted) and what vLLM's code
#: leaves unexplained (fitted).
TOPK_TOPP_SMS = 132
VOCAB_PADDING = 64
FORWARD_HIDDEN_BUFFERS_019 = 3.65
PROFILE_RESIDUAL_019_GIB = 0.036
#: CUDA graph memory when graphs are captured: seed 003 logged 0.32 GiB at TP4; vLLM 0.19 on H100s:
#: the same base and so much per layer on the rank (see the module's text).
CUDA_GRAPH_GIB = 0.32
CUDA_GRAPH_PER_LAYER_019_GIB = 0.0177
#: Live hidden-sized buffers per token at the profiling run's peak (residual, normed input,
#: attention output, MLP input and output, rotary scratch, and slack).
HIDDEN_BUFFERS = 8


@dataclass(frozen=True)
class MemoryTerms:
    """Terms the trial file may give (GiB per rank); None leaves each to the planner's rule."""

    non_torch_gib: float | None = None
    peak_activation_gib: float | None = None
    cuda_graph_gib: float | None = None


def version_at_least(version: str | None, floor: str) -> bool | None:
    """Whether ``version`` (a vLLM version string) is ``floor`` or later; None when it is unknown."""
    try:
        return Version(version).release >= Version(floor).release if version else None
    except InvalidVersion:
        return None


def _non_torch(tp: int, pp: int, vllm_version: str | None, custom_all_reduce: bool | None) -> tuple[float, str]:
    if tp > 1:
        if custom_all_reduce:
            return NON_TORCH_TP_GIB, (f"rule: {NON_TORCH_TP_GIB:g} GiB for TP {tp} with peer access (NCCL's buffers and "
                                      "vLLM's custom all-reduce)")
        why = "no peer access: custom all-reduce off" if custom_all_reduce is False else "peer access unknown"
        return NON_TORCH_MULTI_GIB, f"rule: {NON_TORCH_MULTI_GIB:g} GiB for TP {tp} (NCCL's buffers; {why})"
    if pp > 1:
        recent = bool(version_at_least(vllm_version, "0.19"))
        gib = NON_TORCH_PP_GIB if recent else NON_TORCH_MULTI_GIB
        return gib, f"rule: {gib:g} GiB for a pipeline stage without TP ({_since(vllm_version, '0.19', recent)})"
    return NON_TORCH_SINGLE_GIB, f"rule: {NON_TORCH_SINGLE_GIB:g} GiB for one GPU"


def _since(version: str | None, floor: str, recent: bool) -> str:
    """How a version-dependent rule was chosen, in words."""
    if version is None:
        return f"vLLM's version unknown: the rule before {floor}"
    return f"vLLM {version}: the rule of {floor} and later" if recent else f"vLLM {version}: the rule before {floor}"


def sampler_bytes(rows: int, vocab: int, dtype_bytes: int) -> int:
    """What vLLM 0.19's sampler holds at once over ``rows`` sequences, as its code allocates it: the
    logits in the model's dtype over the vocabulary padded to 64, their float32 copy (none for a
    float32 model), the float32 probabilities and the exponential noise beside them (the module's text
    names the functions)."""
    fp32_copy = rows * vocab * 4 if dtype_bytes != 4 else 0
    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    return rows * padded * dtype_bytes + fp32_copy + 2 * rows * vocab * 4


def topk_topp_buffer_bytes(rows: int, vocab: int, sms: int = TOPK_TOPP_SMS) -> int:
    """vLLM 0.19's ``apply_top_k_top_p_triton`` buffer, kept in ``_TRITON_BUFFER_CACHE``: a float32
    vocabulary row for each of min(next power of two of min(SMs, rows), SMs) programs; fewer than 8
    rows take the sort path instead, which keeps nothing."""
    if rows < 8:
        return 0
    programs = min(sms, rows)
    return min(1 << (programs - 1).bit_length(), sms) * vocab * 4


def _activation(tokens: int, seqs: int, hidden: int, vocab: int, dtype_bytes: int, moe_workspace_per_token: int,
                mlp_per_rank: int, vllm_version: str | None) -> tuple[int, str]:
    recent = bool(version_at_least(vllm_version, "0.19")) and not version_at_least(vllm_version, "0.20")
    if recent:
        return _activation_019(tokens, min(seqs, tokens), hidden, vocab, dtype_bytes, moe_workspace_per_token,
                               mlp_per_rank, vllm_version)
    logits, forward = seqs * vocab * 4, tokens * hidden * dtype_bytes * HIDDEN_BUFFERS
    return max(logits, forward), (f"rule: the larger of fp32 logits for max_num_seqs {seqs} x vocab {vocab} and "
                                  f"{HIDDEN_BUFFERS} hidden-sized buffers for max_num_batched_tokens {tokens} "
                                  f"(vLLM {vllm_version or 'version unknown'}: the rule that held for seed 003's "
                                  "0.27.1; the rule from vLLM's code is 0.19's only)")


def _activation_019(tokens: int, rows: int, hidden: int, vocab: int, dtype_bytes: int, moe_workspace_per_token: int,
                    mlp_per_rank: int, vllm_version: str | None) -> tuple[int, str]:
    """vLLM 0.19's profiling peak: the larger of the sampler phase and the forward pass, the fused-MoE
    workspace that persists across both, and the residual its code does not explain."""
    sampler = (tokens + 2 * rows) * hidden * dtype_bytes + sampler_bytes(rows, vocab, dtype_bytes) \
        + topk_topp_buffer_bytes(rows, vocab)
    forward = int(tokens * dtype_bytes * (3 * mlp_per_rank + FORWARD_HIDDEN_BUFFERS_019 * hidden))
    moe = tokens * moe_workspace_per_token
    value = max(sampler, forward) + moe + int(PROFILE_RESIDUAL_019_GIB * GiB)
    phases = (f"the sampler phase {sampler / GiB:.2f} GiB (hidden states of max_num_batched_tokens {tokens}, logits, "
              f"fp32 copy, probabilities and noise for {rows} rows x vocab {vocab}, the top-k/top-p buffer) against "
              f"the forward pass {forward / GiB:.2f} GiB (MLP {mlp_per_rank:,} wide per rank, "
              f"{FORWARD_HIDDEN_BUFFERS_019:g} hidden-sized buffers per token, fitted)")
    return value, (f"vLLM 0.19.0's code (profile_run, vLLM {vllm_version}): the larger of {phases}"
                   + (f" + {moe / GiB:.2f} GiB of fused-MoE workspace ({moe_workspace_per_token:,} B per token)"
                      if moe else "") + f" + {PROFILE_RESIDUAL_019_GIB:g} GiB its code does not explain (fitted)")


def scheduler_defaults(gpu_memory_gib: float) -> tuple[int, int]:
    """vLLM's default (max_num_batched_tokens, max_num_seqs) for its OpenAI server by GPU
    memory (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``; an A100 takes
    the small defaults, which this cannot tell from memory alone)."""
    if gpu_memory_gib >= 160:
        return 16384, 1024
    if gpu_memory_gib >= 70:
        return 8192, 1024
    return 2048, 256


def terms(*, gpu_memory_gib: float, utilization: float, tp: int, pp: int, hidden_size: int, vocab_size: int,
          dtype_bytes: int, max_num_batched_tokens: int | None, max_num_seqs: int | None, enforce_eager: bool,
          cudagraphs_in_budget: bool | None, given: MemoryTerms, moe_workspace_per_token: int = 0,
          mlp_intermediate_size: int = 0, vllm_version: str | None = None, custom_all_reduce: bool | None = None,
          layers_per_rank: int = 0) -> dict[str, dict[str, Any]]:
    """The budget and each term it loses before the weights, as facts (bytes per rank), and the
    headroom outside it. ``cudagraphs_in_budget`` None: as the vLLM version does (0.21 and later);
    ``moe_workspace_per_token``: the fused-MoE workspace per batched token on a rank;
    ``mlp_intermediate_size``: a dense model's MLP width (0 for one with experts), split over TP;
    ``layers_per_rank``: the most layers one rank holds (for the CUDA graph estimate)."""
    tokens_default, seqs_default = scheduler_defaults(gpu_memory_gib)
    tokens, seqs = max_num_batched_tokens or tokens_default, max_num_seqs or seqs_default
    out = {"gpu_budget_bytes": fact(int(gpu_memory_gib * GiB * utilization),
                                    f"{gpu_memory_gib:g} GiB x gpu_memory_utilization {utilization:g}",
                                    kind="predicted", unit="B")}
    if given.non_torch_gib is not None:
        out["non_torch_bytes"] = fact(int(given.non_torch_gib * GiB), "plan.non_torch_gib", kind="given", unit="B")
    else:
        gib, why = _non_torch(tp, pp, vllm_version, custom_all_reduce)
        out["non_torch_bytes"] = fact(int(gib * GiB), why, kind="estimated", unit="B")
    if given.peak_activation_gib is not None:
        out["peak_activation_bytes"] = fact(int(given.peak_activation_gib * GiB), "plan.peak_activation_gib",
                                            kind="given", unit="B")
    else:
        value, why = _activation(tokens, seqs, hidden_size, vocab_size, dtype_bytes, moe_workspace_per_token,
                                 mlp_intermediate_size // tp, vllm_version)
        out["peak_activation_bytes"] = fact(value, why, kind="estimated", unit="B")
    in_budget = cudagraphs_in_budget
    if in_budget is None:
        in_budget = version_at_least(vllm_version, "0.21") is not False  # unknown: inside, as recent releases do
    graphs = fact(0, "enforce_eager: no CUDA graphs", kind="predicted", unit="B") if enforce_eager else \
        _cuda_graphs(given, vllm_version, layers_per_rank)
    if enforce_eager or in_budget:
        out["cuda_graph_bytes"] = graphs
    else:
        why = ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0: not taken from the KV budget" if cudagraphs_in_budget is False
               else f"vLLM {vllm_version} keeps CUDA graphs outside the KV budget (taken from it since 0.21)")
        out["cuda_graph_bytes"] = fact(0, why, kind="predicted", unit="B")
        out["cuda_graph_outside_bytes"] = graphs
    out.update(_headroom(out, gpu_memory_gib, utilization, min(seqs, tokens), vocab_size, hidden_size, dtype_bytes))
    return out


def _cuda_graphs(given: MemoryTerms, vllm_version: str | None, layers: int) -> dict[str, Any]:
    if given.cuda_graph_gib is not None:
        return fact(int(given.cuda_graph_gib * GiB), "plan.cuda_graph_gib", kind="given", unit="B")
    if version_at_least(vllm_version, "0.19") and not version_at_least(vllm_version, "0.20") and layers:
        gib = CUDA_GRAPH_GIB + CUDA_GRAPH_PER_LAYER_019_GIB * layers
        return fact(int(gib * GiB), f"rule fitted on vLLM 0.19.0's logged CUDAGraph memory: {CUDA_GRAPH_GIB:g} GiB + "
                    f"{CUDA_GRAPH_PER_LAYER_019_GIB:g} GiB x {layers} layers on the rank (vLLM {vllm_version})",
                    kind="estimated", unit="B")
    return fact(int(CUDA_GRAPH_GIB * GiB), f"rule: {CUDA_GRAPH_GIB:g} GiB when graphs are captured",
                kind="estimated", unit="B")


def _headroom(out: dict[str, dict[str, Any]], gpu_memory_gib: float, utilization: float, rows: int,
              vocab: int, hidden: int, dtype_bytes: int) -> dict[str, dict[str, Any]]:
    """What must fit outside the budget (graphs captured outside it, then the sampler's warm-up over
    ``rows`` = min(max_num_seqs, max_num_batched_tokens), where vLLM keeps graphs outside) against
    what the utilization leaves free."""
    if "cuda_graph_outside_bytes" not in out:
        return {}
    free = int(gpu_memory_gib * GiB * (1 - utilization))
    sampler = 3 * rows * hidden * dtype_bytes + sampler_bytes(rows, vocab, dtype_bytes)
    needed = out["cuda_graph_outside_bytes"]["value"] + sampler
    return {
        "sampler_warmup_bytes": fact(sampler, f"vLLM 0.19.0's code: hidden states, last rows and their random copy "
                                     f"for {rows} rows x hidden {hidden}, and the sampler's logits, fp32 copy, "
                                     f"probabilities and noise for {rows} rows x vocab {vocab} (warmed up after the "
                                     "graphs)", kind="estimated", unit="B"),
        "headroom_bytes": fact(free - needed, f"{gpu_memory_gib:g} GiB x (1 - gpu_memory_utilization {utilization:g}) - "
                               "cuda_graph_outside_bytes - sampler_warmup_bytes", kind="estimated", unit="B"),
    }


def headroom_warning(facts: dict[str, dict[str, Any]], gpu_memory_gib: float, utilization: float) -> str | None:
    """The warning for a plan whose memory outside the budget does not fit in what is left free."""
    if "headroom_bytes" not in facts or facts["headroom_bytes"]["value"] >= 0:
        return None
    graphs, sampler = facts["cuda_graph_outside_bytes"]["value"], facts["sampler_warmup_bytes"]["value"]
    short = -facts["headroom_bytes"]["value"]
    safe = math.floor(100 * (utilization - short / (gpu_memory_gib * GiB))) / 100
    return (f"Memory outside the KV budget may not fit: {graphs / GiB:.2f} GiB of CUDA graphs and "
            f"{sampler / GiB:.2f} GiB for the sampler's warm-up ({facts['sampler_warmup_bytes']['source']}) exceed the "
            f"{(graphs + sampler - short) / GiB:.2f} GiB that gpu_memory_utilization {utilization:g} leaves free by "
            f"{short / GiB:.2f} GiB; vLLM may run out of memory after allocating the KV cache: set "
            f"gpu_memory_utilization to {safe:.2f} or lower, lower max_num_seqs, or enforce_eager.")


#: The facts whose sum the budget loses besides the weights.
BUDGET_TERMS = ("gpu_budget_bytes", "non_torch_bytes", "peak_activation_bytes", "cuda_graph_bytes")


def overhead(facts: dict[str, dict[str, Any]]) -> int:
    """Bytes per rank the budget loses besides the weights."""
    return sum(int(facts[k]["value"]) for k in BUDGET_TERMS[1:])


def derived_kind(*kinds: str) -> str:
    """The kind of a figure computed before launch from figures of these kinds: ``estimated``
    when any rests on an assumption, else ``predicted``."""
    return "estimated" if "estimated" in kinds else "predicted"
