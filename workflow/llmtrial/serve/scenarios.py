"""What a scenario asks for: fixed passes or a sweep's steps, how many passes, and its latency target.

A scenario whose ``concurrency``, ``num_prompts``, ``input_len`` or ``output_len`` is a list is a
*sweep*: one step per position of its lists, in order, each run once against the same warm
server; scalar keys repeat on every step. ``passes`` is a count or ``{min, max, agreement, interval}``;
``slo`` is a latency target judged per request exactly as vLLM's ``--goodput`` judges it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtrial.core.stats import DEFAULT_LEVEL, mean_interval
from llmtrial.core.trial_checks import SWEEP_KEYS
from llmtrial.serve.datasets import context

#: The keys a sweep may list, in the order a step names them.
#: slo key -> vLLM's --goodput metric name.
SLO_METRICS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}
DEFAULT_SLO_PERCENTILE = 90.0


def is_sweep(spec: Mapping[str, Any]) -> bool:
    return any(isinstance(spec.get(k), list) for k in SWEEP_KEYS)


def steps(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A sweep's steps, each a scenario with one value per key (``step`` counts from 1)."""
    n = max(len(spec[k]) for k in SWEEP_KEYS if isinstance(spec.get(k), list))
    out = []
    for i in range(n):
        one = {k: v for k, v in spec.items() if k not in SWEEP_KEYS}
        one.update({k: int(spec[k][i]) if isinstance(spec[k], list) else int(spec[k]) for k in SWEEP_KEYS})
        out.append({"step": i + 1, **one})
    return out


def contexts(spec: Mapping[str, Any]) -> set[int]:
    """The longest context lengths (input + output) a scenario reaches, every step of a sweep included;
    none for a prompt file's scenario (its prompts' lengths are not known before they are tokenized)."""
    runs = steps(spec) if is_sweep(spec) else [spec]
    return {n for n in map(context, runs) if n is not None}


@dataclass(frozen=True)
class RepetitionRule:
    """How many passes a scenario runs: at least ``min``, at most ``max``, stopping early once every
    rule given holds: the output tok/s spread is within ``agreement``, the width of its Student t
    interval at ``level`` over the median is within ``interval``. ``fixed``: a count was asked."""

    min: int
    max: int
    agreement: float | None
    interval: float | None = None
    level: float = DEFAULT_LEVEL
    fixed: bool = False

    @classmethod
    def of(cls, spec: Mapping[str, Any], level: float = DEFAULT_LEVEL) -> RepetitionRule:
        passes = spec.get("passes", 1)
        if isinstance(passes, Mapping):
            agreement, interval = passes.get("agreement"), passes.get("interval")
            return cls(int(passes["min"]), int(passes["max"]), None if agreement is None else float(agreement),
                       None if interval is None else float(interval), level)
        return cls(int(passes), int(passes), None, None, level, fixed=True)

    def describe(self) -> str:
        """What the trial file asked for, in words: a fixed count, or passes until they agree."""
        if self.fixed:
            return f"{self.max} pass(es)"
        rules = ([f"agree within {100 * self.agreement:.1f} %"] if self.agreement is not None else []) + (
            [f"their {100 * self.level:g} % interval is within {100 * self.interval:.1f} % of the median"]
            if self.interval is not None else [])
        return f"{self.min}–{self.max} passes, stopping once they " + " and ".join(rules or ["reach the maximum"])

    def interval_width(self, values: list[float]) -> float | None:
        """The width of the values' Student t interval at ``level`` over their median (None below two)."""
        ci = mean_interval(values, self.level)
        return ci.width_over(statistics.median(values)) if ci else None

    def verdict(self, values: list[float], ran: int, failed: bool) -> str | None:
        """Why to stop after ``ran`` passes whose output tok/s (those that succeeded) are ``values``
        (``failed``: the last one failed), or None to go on: ``fixed`` (a count was asked: it runs
        whatever fails), ``failed`` (agreement cannot be judged on a failed pass), ``agreed`` (every
        rule holds) or ``max_reached``."""
        if self.fixed:
            return "fixed" if ran >= self.max else None
        if failed:
            return "failed"
        spread, width = spread_of(values), self.interval_width(values)
        holds = [spread is not None and spread <= self.agreement] if self.agreement is not None else []
        holds += [width is not None and width <= self.interval] if self.interval is not None else []
        if ran >= self.min and all(holds):
            return "agreed"
        return "max_reached" if ran >= self.max else None


def spread_of(values: list[float]) -> float | None:
    """Spread of a figure across passes, (max - min) / mean; None with fewer than two."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2 or statistics.fmean(vals) == 0:
        return None
    return (max(vals) - min(vals)) / statistics.fmean(vals)


def goodput_flags(slo: Mapping[str, Any] | None) -> list[str]:
    """vLLM benchmark flags for a scenario's target (``--goodput ttft:500 tpot:50``), or none."""
    pairs = [f"{metric}:{_num(slo[key])}" for key, metric in SLO_METRICS.items() if slo and slo.get(key) is not None]
    return ["--goodput", *pairs] if pairs else []


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def goodput(result: Mapping[str, Any], slo: Mapping[str, Any]) -> dict[str, Any]:
    """A pass's goodput under ``slo``, from vLLM's result file with per-request detail.

    A request meets the target when each latency given is at most its target (TPOT is
    (latency - TTFT) / (output tokens - 1), and 0 for one token: vLLM's own rule), so
    ``requests_meeting`` over the pass's duration is vLLM's ``request_goodput``."""
    targets = {k: float(slo[k]) for k in SLO_METRICS if slo.get(k) is not None}
    percentile = float(slo.get("percentile", DEFAULT_SLO_PERCENTILE))
    ttfts, lats = result.get("ttfts") or [], result.get("latencies") or []
    lens, errors = result.get("output_lens") or [], result.get("errors") or [""] * len(lats)
    meeting = requests = 0
    for ttft, lat, n, err in zip(ttfts, lats, lens, errors, strict=False):
        if err or not n:
            continue
        requests += 1
        got = {"ttft_ms": ttft * 1000, "e2el_ms": lat * 1000,
               "tpot_ms": (lat - ttft) * 1000 / (n - 1) if n > 1 else 0.0}
        meeting += all(got[k] <= v for k, v in targets.items())
    share = meeting / requests if requests else None
    return {"targets": targets, "percentile": percentile, "request_goodput": result.get("request_goodput"),
            "requests_meeting": meeting, "requests": requests, "share": share,
            "met": share is not None and share >= percentile / 100}


def runs_of(entry: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Every benchmark run of a record's scenario entry with its label, in the order they ran:
    the warm-up, each pass, each sweep step."""
    name = entry["name"]
    out: list[tuple[str, Mapping[str, Any]]] = [(f"{name} warm-up", entry["warmup"])] if entry.get("warmup") else []
    out += [(f"{name} pass {p['pass']}", p) for p in entry.get("pass_results", [])]
    return out + [(f"{name} step {s.get('step')}", s) for s in entry.get("steps") or []]


def repetition_of(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    """How many passes a scenario entry of a configuration record ran and why it stopped; a record written before
    ``repetition`` existed ran a fixed count (stopped ``failed`` when a pass failed)."""
    entry = entry or {}
    passes = entry.get("pass_results", [])
    rep = entry.get("repetition")
    if rep:
        return {"passes_run": len(passes), **rep}
    spec = entry.get("spec") or {}
    n = RepetitionRule.of(spec).max if isinstance(spec.get("passes"), int) else len(passes)
    return {"min": n, "max": n, "agreement": None, "passes_run": len(passes),
            "spread": (entry.get("agreement") or {}).get("output_throughput"),
            "stopped": "failed" if any(p.get("status") == "failed" for p in passes) else "fixed"}


def passes_asked(spec: Mapping[str, Any]) -> str:
    """What the trial file asked for: a fixed count, or passes until they agree."""
    return RepetitionRule.of(spec).describe() if spec.get("passes") is not None else "passes not recorded"
