"""What a scenario asks for: fixed passes or a sweep's steps, how many passes, and its latency target.

A scenario whose ``concurrency``, ``num_prompts``, ``input_len`` or ``output_len`` is a list is a
*sweep*: one step per position of its lists, in order, each run once against the same warm
server; scalar keys repeat on every step. ``passes`` is a count or ``{min, max, agreement, interval}``;
``slo`` is a latency target judged per request exactly as vLLM's ``--goodput`` judges it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from llmtrial.core.record_base import Number
from llmtrial.core.scenario_model import Goodput, Pass, Repetition, Scenario, ScenarioSpec
from llmtrial.core.stats import DEFAULT_LEVEL, pass_interval
from llmtrial.core.trial_config import PassesRuleBlock, ScenarioBlock, SloBlock
from llmtrial.serve.datasets import PassLoad, context

#: slo key -> vLLM's --goodput metric name.
SLO_METRICS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}
DEFAULT_SLO_PERCENTILE = 90.0


def is_sweep(spec: ScenarioBlock | ScenarioSpec) -> bool:
    """Whether a scenario (the trial file's, or a record's) lists per-step values: a sweep."""
    return any(isinstance(v, list) for v in (spec.concurrency, spec.input_len, spec.output_len, spec.num_prompts))


def steps(spec: ScenarioBlock) -> list[PassLoad]:
    """A sweep's steps, each with one value per key (``step`` counts from 1)."""
    lists = [v for v in (spec.concurrency, spec.input_len, spec.output_len, spec.num_prompts) if isinstance(v, list)]
    return [PassLoad.at(spec, i, step=i + 1) for i in range(max(map(len, lists)))]


def contexts(spec: ScenarioBlock) -> set[int]:
    """The longest context lengths (input + output) a scenario reaches, every step of a sweep included;
    none for a prompt file's scenario (its prompts' lengths are not known before they are tokenized)."""
    runs = steps(spec) if is_sweep(spec) else [PassLoad.at(spec)]
    return {n for n in (context(spec, load) for load in runs) if n is not None}


@dataclass(frozen=True)
class RepetitionRule:
    """How many passes a scenario runs: at least ``min``, at most ``max``, stopping early once every
    rule given holds: the output tok/s spread is within ``agreement``, the width of its interval over
    passes at ``level`` (the one the report quotes and the verdicts rest on) over the median is within
    ``interval``. ``fixed``: a count was asked."""

    min: int
    max: int
    agreement: float | None
    interval: float | None = None
    level: float = DEFAULT_LEVEL
    fixed: bool = False

    @classmethod
    def of(cls, passes: int | PassesRuleBlock, level: float = DEFAULT_LEVEL) -> RepetitionRule:
        """The rule of a scenario's ``passes``: a count, or ``{min, max, agreement, interval}``."""
        if isinstance(passes, PassesRuleBlock):
            agreement, interval = passes.agreement, passes.interval
            return cls(passes.min, passes.max, None if agreement is None else float(agreement),
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
        """The width of the values' interval over passes at ``level`` (the report's and the verdicts' own,
        :func:`llmtrial.core.stats.pass_interval`: Student t on the logarithms) over their median (None below two)."""
        ci = pass_interval(values, self.level)
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


def _targets(slo: SloBlock) -> dict[str, float]:
    """The latency targets ``slo`` gives, by its key (ttft_ms, tpot_ms, e2el_ms)."""
    given = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2el_ms": slo.e2el_ms}
    return {key: float(value) for key, value in given.items() if value is not None}


def goodput_flags(slo: SloBlock | None) -> list[str]:
    """vLLM benchmark flags for a scenario's target (``--goodput ttft:500 tpot:50``), or none."""
    pairs = [f"{SLO_METRICS[key]}:{_num(value)}" for key, value in _targets(slo).items()] if slo else []
    return ["--goodput", *pairs] if pairs else []


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


class RequestDetail(BaseModel):
    """The per-request lists of vLLM's result file (``--save-detailed``) that the trial reads, and its goodput;
    each empty (None) where the file has none."""

    model_config = ConfigDict(extra="ignore")

    ttfts: list[Number | None] | None = None
    itls: list[list[Number] | None] | None = None
    latencies: list[Number | None] | None = None
    start_times: list[Number | None] | None = None
    output_lens: list[int | None] | None = None
    errors: list[str | None] | None = None
    request_goodput: Number | None = None
    num_prompts: int | None = None

    def requests(self) -> list[tuple[Number | None, Number | None, int | None, str | None]]:
        """(ttft, latency, output tokens, error) of each request, in the file's order."""
        lats = self.latencies or []
        errors = self.errors or [""] * len(lats)
        return list(zip(self.ttfts or [], lats, self.output_lens or [], errors, strict=False))


def goodput(detail: RequestDetail, slo: SloBlock) -> Goodput:
    """A pass's goodput under ``slo``, from the per-request detail of vLLM's result file.

    A request meets the target when each latency given is at most its target (TPOT is
    (latency - TTFT) / (output tokens - 1), and 0 for one token: vLLM's own rule), so
    ``requests_meeting`` over the pass's duration is vLLM's ``request_goodput``."""
    targets = _targets(slo)
    meeting = requests = 0
    for ttft, lat, n, err in detail.requests():
        if err or not n or ttft is None or lat is None:
            continue
        requests += 1
        got = {"ttft_ms": ttft * 1000, "e2el_ms": lat * 1000,
               "tpot_ms": (lat - ttft) * 1000 / (n - 1) if n > 1 else 0.0}
        meeting += all(got[k] <= v for k, v in targets.items())
    share = meeting / requests if requests else None
    percentile = float(slo.percentile)
    return Goodput(targets=targets, percentile=percentile, request_goodput=detail.request_goodput,
                   requests_meeting=meeting, requests=requests, share=share,
                   met=share is not None and share >= percentile / 100)


def repetition_of(entry: Scenario | None) -> Repetition:
    """How many passes a scenario entry of a configuration record ran and why it stopped; a record written before
    ``repetition`` existed ran a fixed count (stopped ``failed`` when a pass failed)."""
    passes: list[Pass] = entry.pass_results if entry is not None else []
    if entry is not None and entry.repetition is not None and entry.repetition.model_fields_set:
        return Repetition.model_validate({"passes_run": len(passes), **entry.repetition.model_dump(exclude_unset=True)})
    spec = entry.spec if entry is not None else None
    n = RepetitionRule.of(spec.passes).max if spec is not None and isinstance(spec.passes, int) else len(passes)
    return Repetition(min=n, max=n, agreement=None, passes_run=len(passes),
                      spread=entry.agreement.output_throughput if entry is not None and entry.agreement else None,
                      stopped="failed" if any(p.status == "failed" for p in passes) else "fixed")


def passes_asked(spec: ScenarioSpec) -> str:
    """What the trial file asked for: a fixed count, or passes until they agree."""
    if spec.passes is None:
        return "passes not recorded"
    passes = spec.passes if isinstance(spec.passes, int) else PassesRuleBlock.model_validate(spec.passes)
    return RepetitionRule.of(passes).describe()
