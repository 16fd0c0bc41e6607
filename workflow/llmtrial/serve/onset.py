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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from llmtrial.core.record_base import Fact
from llmtrial.core.scenario_model import Onset as OnsetRecord
from llmtrial.core.scenario_model import OnsetComparison, OnsetStep, ScenarioSpec, Step, StepFigures, WindowStat
from llmtrial.serve.bench import headline
from llmtrial.serve.datasets import FILE_SUFFIX, PassLoad

ASSUMPTION = ("Every request of a step is in flight at once (in flight = min(concurrency, prompts)) and holds "
              "its prompt and its whole output (ignore_eos: output grows to output_len), each rounded up to "
              "whole blocks; the cache's blocks are the KV cache tokens vLLM logged over the block size. "
              "A step preempts when in flight x blocks per request exceeds them; requests wait when the "
              "prompts alone exceed them or a step preempts (a preempted request is queued again).")


def _peak(stat: WindowStat | None) -> float | None:
    return float(stat.max) if stat and stat.max is not None else None


def _mean(stat: WindowStat | None) -> float | None:
    return float(stat.mean) if stat and stat.mean is not None else None


def step_figures(step: Step) -> StepFigures:
    """One step's figures from its pass entry: the server's counters and gauges over its
    window, and the benchmark's own summary (None where a source had nothing)."""
    window = (step.telemetry.summary if step.telemetry else None) or {}
    summary = step.summary
    usage = window.get("metrics.kv_cache_usage")
    figures = StepFigures(
        preemptions=step.server_metrics.preemptions if step.server_metrics else None,
        kv_cache_usage_peak=_peak(usage), kv_cache_usage_mean=_mean(usage),
        running_peak=_peak(window.get("metrics.running")), waiting_peak=_peak(window.get("metrics.waiting")),
        **headline(summary), failed=summary.failed if summary else None)
    if summary is not None and summary.goodput is not None:
        figures.goodput = summary.goodput
    return figures


def predict(load: PassLoad, kv_tokens: int, block_size: int) -> OnsetStep:
    """The planner's view of one step (its concurrency, prompts and lengths)."""
    blocks = kv_tokens // block_size
    in_flight = min(load.concurrency, load.num_prompts)
    per_request = math.ceil((load.input_len + load.output_len) / block_size)
    prompt_blocks = in_flight * math.ceil(load.input_len / block_size)
    preempts = in_flight * per_request > blocks
    return OnsetStep(step=load.step, concurrency=load.concurrency, in_flight=in_flight,
                     blocks_per_request=per_request, blocks_needed=in_flight * per_request,
                     tokens_needed=in_flight * per_request * block_size,
                     predicted_preempts=preempts, predicted_waits=preempts or prompt_blocks > blocks)


@dataclass(frozen=True)
class Seen:
    """What one step that ran showed: its requests in flight, and the preemptions and waiting requests seen."""

    step: int
    concurrency: int
    in_flight: int
    preemptions: float | None
    waiting_peak: float | None

    @classmethod
    def of(cls, step: Step) -> Seen:
        figures = step.figures or StepFigures()
        assert step.step is not None and step.concurrency is not None and step.num_prompts is not None
        return cls(step.step, step.concurrency, min(step.concurrency, step.num_prompts), figures.preemptions,
                   figures.waiting_peak)


Row = TypeVar("Row", OnsetStep, Seen)


def _load(step: Step) -> PassLoad:
    assert step.concurrency is not None and step.num_prompts is not None
    assert step.input_len is not None and step.output_len is not None
    return PassLoad(step.concurrency, step.num_prompts, step.input_len, step.output_len, step.step)


def _first(rows: list[Row], hit: Callable[[Row], bool]) -> Row | None:
    return next((r for r in rows if hit(r)), None)


def _less(a: int | None, b: int | None) -> int | None:
    return a - b if a is not None and b is not None else None


def _compare(predicted: OnsetStep | None, observed: Seen | None) -> OnsetComparison:
    return OnsetComparison(
        predicted_step=predicted.step if predicted else None,
        predicted_concurrency=predicted.concurrency if predicted else None,
        observed_step=observed.step if observed else None,
        observed_concurrency=observed.concurrency if observed else None,
        error_steps=_less(observed.step, predicted.step) if observed and predicted else None,
        error_requests=_less(observed.in_flight, predicted.in_flight) if observed and predicted else None)


def _varied_lengths(spec: ScenarioSpec | None) -> str | None:
    """Why a step's requests have no one length, or None where they have."""
    if spec is not None and (spec.dataset or "random") in FILE_SUFFIX:
        return "the prompts' lengths are the prompt file's, not known before they are tokenized"
    if spec is not None and spec.range_ratio is not None:
        return "the requests' lengths vary (range_ratio)"
    return None


def onset(steps: list[Step], kv_tokens: Fact | None, block_size: int | None,
          spec: ScenarioSpec | None = None) -> OnsetRecord:
    """Predicted against observed onset of preemption and of waiting requests for one sweep.

    ``steps`` are the sweep's step entries (with ``figures``), ``kv_tokens`` the start-up fact
    vLLM logged, ``block_size`` the plan's, ``spec`` the sweep's. Without either, or where the requests'
    lengths are not one figure per step (a prompt file's, or random ones under a range ratio), nothing is
    predicted and the record says why."""
    observed = [Seen.of(s) for s in steps if s.status == "ok"]
    out = OnsetRecord(kv_cache_tokens=kv_tokens.value if kv_tokens else None,
                      kv_cache_tokens_source=kv_tokens.source if kv_tokens else None,
                      block_size=block_size, assumption=ASSUMPTION, per_step=[])
    varied = _varied_lengths(spec)
    if not kv_tokens or not block_size or varied:
        out.unpredicted = varied or ("no KV cache size in the server log" if not kv_tokens else
                                     "no block size in the plan")
    else:
        out.per_step = [predict(_load(s), int(kv_tokens.value), int(block_size)) for s in steps]
    rows = out.per_step or []
    out.preemption = _compare(_first(rows, lambda r: bool(r.predicted_preempts)),
                              _first(observed, lambda r: (r.preemptions or 0) > 0))
    out.waiting = _compare(_first(rows, lambda r: bool(r.predicted_waits)),
                           _first(observed, lambda r: (r.waiting_peak or 0) > 0))
    return out
