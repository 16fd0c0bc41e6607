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

Recent vLLM logs these terms in one line per worker ("Free memory on device ... Actual usage
is X GiB for consumed memory (weights + non-torch), Y GiB for peak activation, and Z GiB for
CUDAGraph memory ... Current kv cache memory in use is K GiB"); :mod:`llmtrial.logs` reads
it, so each term here can be put beside the logged one.

A term given in the trial file is ``given``; one this module computes from a rule is
``estimated`` and its source says the rule; zero CUDA graph memory under ``enforce_eager``
is ``predicted``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmtrial.records import fact

GiB = 1024**3

#: Non-torch memory per rank with one GPU, and with TP x PP > 1 (NCCL and all-reduce
#: buffers): seed 003 logged 56.89 GiB consumed against 55.19 GiB of weights at TP4.
NON_TORCH_SINGLE_GIB = 0.25
NON_TORCH_MULTI_GIB = 1.70
#: CUDA graph memory when graphs are captured: seed 003 logged 0.32 GiB at TP4.
CUDA_GRAPH_GIB = 0.32
#: Live hidden-sized buffers per token at the profiling run's peak (residual, normed input,
#: attention output, MLP input and output, rotary scratch, and slack).
HIDDEN_BUFFERS = 8


@dataclass(frozen=True)
class MemoryTerms:
    """Terms the trial file may give (GiB per rank); None leaves each to the planner's rule."""

    non_torch_gib: float | None = None
    peak_activation_gib: float | None = None
    cuda_graph_gib: float | None = None


def scheduler_defaults(gpu_memory_gib: float) -> tuple[int, int]:
    """vLLM's default (max_num_batched_tokens, max_num_seqs) for its OpenAI server by GPU
    memory (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``; an A100 takes
    the small defaults, which this cannot tell from memory alone)."""
    if gpu_memory_gib >= 160:
        return 16384, 1024
    if gpu_memory_gib >= 70:
        return 8192, 1024
    return 2048, 256


def terms(*, gpu_memory_gib: float, utilization: float, workers: int, hidden_size: int, vocab_size: int,
          dtype_bytes: int, max_num_batched_tokens: int | None, max_num_seqs: int | None, enforce_eager: bool,
          cudagraphs_in_budget: bool, given: MemoryTerms) -> dict[str, dict[str, Any]]:
    """The budget and each term it loses before the weights, as facts (bytes per rank)."""
    tokens_default, seqs_default = scheduler_defaults(gpu_memory_gib)
    tokens, seqs = max_num_batched_tokens or tokens_default, max_num_seqs or seqs_default
    out = {"gpu_budget_bytes": fact(int(gpu_memory_gib * GiB * utilization),
                                    f"{gpu_memory_gib:g} GiB x gpu_memory_utilization {utilization:g}",
                                    kind="predicted", unit="B")}
    if given.non_torch_gib is not None:
        out["non_torch_bytes"] = fact(int(given.non_torch_gib * GiB), "plan.non_torch_gib", kind="given", unit="B")
    else:
        gib = NON_TORCH_MULTI_GIB if workers > 1 else NON_TORCH_SINGLE_GIB
        out["non_torch_bytes"] = fact(int(gib * GiB), f"rule: {gib:g} GiB for {'TP x PP > 1 (NCCL buffers)' if workers > 1 else 'one GPU'}",
                                      kind="estimated", unit="B")
    if given.peak_activation_gib is not None:
        out["peak_activation_bytes"] = fact(int(given.peak_activation_gib * GiB), "plan.peak_activation_gib",
                                            kind="given", unit="B")
    else:
        logits = seqs * vocab_size * 4
        forward = tokens * hidden_size * dtype_bytes * HIDDEN_BUFFERS
        out["peak_activation_bytes"] = fact(
            max(logits, forward), f"rule: the larger of fp32 logits for max_num_seqs {seqs} x vocab {vocab_size} and "
            f"{HIDDEN_BUFFERS} hidden-sized buffers for max_num_batched_tokens {tokens}", kind="estimated", unit="B")
    if enforce_eager or not cudagraphs_in_budget:
        why = "enforce_eager: no CUDA graphs" if enforce_eager else \
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0: not taken from the KV budget"
        out["cuda_graph_bytes"] = fact(0, why, kind="predicted", unit="B")
    elif given.cuda_graph_gib is not None:
        out["cuda_graph_bytes"] = fact(int(given.cuda_graph_gib * GiB), "plan.cuda_graph_gib", kind="given", unit="B")
    else:
        out["cuda_graph_bytes"] = fact(int(CUDA_GRAPH_GIB * GiB), f"rule: {CUDA_GRAPH_GIB:g} GiB when graphs are captured",
                                       kind="estimated", unit="B")
    return out


def overhead(facts: dict[str, dict[str, Any]]) -> int:
    """Bytes per rank the budget loses besides the weights."""
    return sum(int(facts[k]["value"]) for k in ("non_torch_bytes", "peak_activation_bytes", "cuda_graph_bytes"))


def derived_kind(*kinds: str) -> str:
    """The kind of a figure computed before launch from figures of these kinds: ``estimated``
    when any rests on an assumption, else ``predicted``."""
    return "estimated" if "estimated" in kinds else "predicted"
