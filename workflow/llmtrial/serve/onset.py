"""Where a sweep starts to preempt: the planner's arithmetic against what /metrics showed.

vLLM preempts a running request when the KV cache has no free block for its next token.
With every request of a step in flight at once holding its prompt and, by the end, its whole
output, a step needs ``in_flight x ceil((input + output) / block_size)`` blocks; when that is
more than the cache's blocks (the KV cache tokens vLLM logged, over the block size), the step
is predicted to preempt. Requests wait when the cache cannot admit every prompt, or when a
preempted request goes back to the queue. Observed: the first step whose preemption counter
moved, and the first whose waiting gauge was above zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from llmtrial.serve.bench import headline
from llmtrial.serve.datasets import FILE_SUFFIX, dataset_of

ASSUMPTION = ("Every request of a step is in flight at once (in flight = min(concurrency, prompts)) and holds "
              "its prompt and its whole output (ignore_eos: output grows to output_len), each rounded up to "
              "whole blocks; the cache's blocks are the KV cache tokens vLLM logged over the block size. "
              "A step preempts when in flight x blocks per request exceeds them; requests wait when the "
              "prompts alone exceed them or a step preempts (a preempted request is queued again).")


def _fig(summary: Mapping[str, Any], key: str, stat: str) -> float | None:
    one = summary.get(key)
    return float(one[stat]) if one else None


def step_figures(step: Mapping[str, Any]) -> dict[str, Any]:
    """One step's figures from its pass entry: the server's counters and gauges over its
    window, and the benchmark's own summary (None where a source had nothing)."""
    window = (step.get("telemetry") or {}).get("summary") or {}
    summary = step.get("summary") or {}
    out: dict[str, Any] = {
        "preemptions": (step.get("server_metrics") or {}).get("preemptions"),
        "kv_cache_usage_peak": _fig(window, "metrics.kv_cache_usage", "max"),
        "kv_cache_usage_mean": _fig(window, "metrics.kv_cache_usage", "mean"),
        "running_peak": _fig(window, "metrics.running", "max"),
        "waiting_peak": _fig(window, "metrics.waiting", "max"),
        **headline(summary),
        "failed": summary.get("failed"),
    }
    if "goodput" in summary:
        out["goodput"] = summary["goodput"]
    return out


def predict(step: Mapping[str, Any], kv_tokens: int, block_size: int) -> dict[str, Any]:
    """The planner's view of one step (``concurrency``, ``num_prompts``, ``input_len``, ``output_len``)."""
    blocks = kv_tokens // block_size
    in_flight = min(int(step["concurrency"]), int(step["num_prompts"]))
    per_request = math.ceil((int(step["input_len"]) + int(step["output_len"])) / block_size)
    prompt_blocks = in_flight * math.ceil(int(step["input_len"]) / block_size)
    preempts = in_flight * per_request > blocks
    return {"step": step["step"], "concurrency": int(step["concurrency"]), "in_flight": in_flight,
            "blocks_per_request": per_request, "blocks_needed": in_flight * per_request,
            "tokens_needed": in_flight * per_request * block_size,
            "predicted_preempts": preempts, "predicted_waits": preempts or prompt_blocks > blocks}


def _first(rows: list[Mapping[str, Any]], hit: Any) -> Mapping[str, Any] | None:
    return next((r for r in rows if hit(r)), None)


def _compare(predicted: Mapping[str, Any] | None, observed: Mapping[str, Any] | None) -> dict[str, Any]:
    both = predicted is not None and observed is not None
    return {"predicted_step": predicted["step"] if predicted else None,
            "predicted_concurrency": predicted["concurrency"] if predicted else None,
            "observed_step": observed["step"] if observed else None,
            "observed_concurrency": observed["concurrency"] if observed else None,
            "error_steps": observed["step"] - predicted["step"] if both else None,
            "error_requests": observed["in_flight"] - predicted["in_flight"] if both else None}


def _varied_lengths(spec: Mapping[str, Any]) -> str | None:
    """Why a step's requests have no one length, or None where they have."""
    if dataset_of(spec) in FILE_SUFFIX:
        return "the prompts' lengths are the prompt file's, not known before they are tokenized"
    if spec.get("range_ratio") is not None:
        return "the requests' lengths vary (range_ratio)"
    return None


def onset(steps: list[Mapping[str, Any]], kv_tokens: Mapping[str, Any] | None, block_size: int | None,
          spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Predicted against observed onset of preemption and of waiting requests for one sweep.

    ``steps`` are the sweep's step entries (with ``figures``), ``kv_tokens`` the start-up fact
    vLLM logged (``{"value", "source"}``), ``block_size`` the plan's, ``spec`` the sweep's. Without
    either, or where the requests' lengths are not one figure per step (a prompt file's, or random
    ones under a range ratio), nothing is predicted and the record says why."""
    observed = [{"step": s["step"], "concurrency": s["concurrency"],
                 "in_flight": min(int(s["concurrency"]), int(s["num_prompts"])), **(s.get("figures") or {})}
                for s in steps if s.get("status") == "ok"]
    out: dict[str, Any] = {"kv_cache_tokens": kv_tokens["value"] if kv_tokens else None,
                           "kv_cache_tokens_source": kv_tokens["source"] if kv_tokens else None,
                           "block_size": block_size, "assumption": ASSUMPTION, "per_step": []}
    varied = _varied_lengths(spec or {})
    if not kv_tokens or not block_size or varied:
        out["unpredicted"] = varied or ("no KV cache size in the server log" if not kv_tokens else
                                        "no block size in the plan")
    else:
        out["per_step"] = [predict(s, int(kv_tokens["value"]), int(block_size)) for s in steps]
    rows = out["per_step"]
    out["preemption"] = _compare(_first(rows, lambda r: r["predicted_preempts"]),
                                 _first(observed, lambda r: (r.get("preemptions") or 0) > 0))
    out["waiting"] = _compare(_first(rows, lambda r: r["predicted_waits"]),
                              _first(observed, lambda r: (r.get("waiting_peak") or 0) > 0))
    return out
