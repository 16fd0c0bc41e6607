"""What the trial's sweeps show, worked out from the configuration records alone.

A sweep scenario (``kind: sweep``) runs one pass per step, each step at its own concurrency
(and lengths), against the same warm server. Per sweep and configuration this gives the rows
of its steps (preemptions, KV cache usage, running and waiting requests, throughput and
latency, goodput where the scenario has a target) and the planner's predicted onset of
preemption and of waiting requests against the first step that showed them, with sentences
generated from these numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.record_base import Number
from llmtrial.core.scenario_model import Onset, OnsetComparison, OnsetStep, Scenario, ScenarioSpec, Step, StepFigures
from llmtrial.report.conclusions import failure_summary, is_sweep_entry, warmup_note

#: The two onsets compared: the field of the record's ``onset``, what was observed, what none observed reads.
ONSETS: tuple[tuple[str, str, str], ...] = (
    ("preemption", "first preempted", "no step preempted"),
    ("waiting", "first had requests waiting", "no step had requests waiting"),
)
#: What an onset comparison gives, in the order a row shows it.
COMPARED = ("predicted_step", "predicted_concurrency", "observed_step", "observed_concurrency", "error_steps",
            "error_requests")
_WORDS = ("zero", "one", "two", "three", "four", "five")


def _pct(x: float | None) -> float | None:
    return 100.0 * x if x is not None else None


@dataclass(frozen=True)
class StepRow:
    """One step of one configuration: what it asked for, what /metrics and the benchmark saw, and what the
    planner predicted of it (KV cache usage and the SLO share in per cent)."""

    step: int | None
    concurrency: int | None
    input_len: int | None
    output_len: int | None
    num_prompts: int | None
    status: str
    log: str | None
    seed: int | None
    preemptions: Number | None
    kv_peak_pct: float | None
    kv_mean_pct: float | None
    running_peak: Number | None
    waiting_peak: Number | None
    output_tok_s: Number | None
    ttft_median_ms: Number | None
    ttft_p99_ms: Number | None
    tpot_median_ms: Number | None
    tpot_p99_ms: Number | None
    failed: int | None
    slo_share_pct: float | None
    slo_met: bool | None
    predicted_preempts: bool | None
    predicted_waits: bool | None
    tokens_needed: int | None


def step_row(step: Step, predicted: OnsetStep | None) -> StepRow:
    """One step of one configuration: what it asked for, what /metrics and the benchmark saw,
    and what the planner predicted of it."""
    f = step.figures or StepFigures()
    plan = predicted or OnsetStep()
    goodput = f.goodput or (step.summary.goodput if step.summary else None)
    return StepRow(
        step=step.step, concurrency=step.concurrency, input_len=step.input_len, output_len=step.output_len,
        num_prompts=step.num_prompts, status=step.status, log=step.log, seed=step.seed,
        preemptions=f.preemptions, kv_peak_pct=_pct(f.kv_cache_usage_peak), kv_mean_pct=_pct(f.kv_cache_usage_mean),
        running_peak=f.running_peak, waiting_peak=f.waiting_peak, output_tok_s=f.output_tok_s,
        ttft_median_ms=f.ttft_median_ms, ttft_p99_ms=f.ttft_p99_ms, tpot_median_ms=f.tpot_median_ms,
        tpot_p99_ms=f.tpot_p99_ms, failed=f.failed, slo_share_pct=_pct(goodput.share) if goodput else None,
        slo_met=goodput.met if goodput else None, predicted_preempts=plan.predicted_preempts,
        predicted_waits=plan.predicted_waits, tokens_needed=plan.tokens_needed)


def _at(step: int | None, concurrency: int | None) -> str:
    return f"concurrency {concurrency} (step {step})"


def _plural(n: int, one: str) -> str:
    return f"{n} {one}{'' if n == 1 else 's'}"


def error_words(error_steps: int, error_requests: int | None) -> str:
    """``on the mark``, ``one step late (1 step, 4 requests)`` or ``two steps early (...)``:
    late when the onset came at a later step than predicted."""
    if error_steps == 0:
        return "on the mark"
    n = abs(error_steps)
    words = f"{_WORDS[n] if n < len(_WORDS) else n} step{'' if n == 1 else 's'} {'late' if error_steps > 0 else 'early'}"
    detail = _plural(n, "step") + (f", {_plural(abs(error_requests), 'request')}" if error_requests is not None else "")
    return f"{words} ({detail})"


def onset_sentence(configuration: str, kind: str, cmp: OnsetComparison | None, last: int | None,
                   unpredicted: str | None = None) -> str:
    """One sentence on one onset (``preemption`` or ``waiting``) of one configuration's sweep."""
    _key, seen, none_seen = next(o for o in ONSETS if o[0] == kind)
    cmp = cmp or OnsetComparison()
    obs, pred = cmp.observed_step, cmp.predicted_step
    observed = (f"{configuration} {seen} at {_at(obs, cmp.observed_concurrency)}" if obs is not None
                else f"{configuration}: {none_seen}" + (f" up to concurrency {last}" if last is not None else ""))
    if unpredicted:
        return f"{observed}; nothing was predicted ({unpredicted})."
    if pred is None:
        return f"{observed}; predicted none." if obs is None else f"{observed}; the planner predicted none: not foreseen."
    if obs is None:
        return f"{observed}; predicted at step {pred} (concurrency {cmp.predicted_concurrency}) but none observed."
    errs = obs - pred if cmp.error_steps is None else cmp.error_steps
    return (f"{observed}; the planner predicted {_at(pred, cmp.predicted_concurrency)}: "
            f"{error_words(errs, cmp.error_requests)}.")


def compared(onset: Onset | None, key: str) -> OnsetComparison:
    """The onset of preemption (``key`` ``preemption``) or of waiting requests (``waiting``); empty
    (every step None) where the record has none."""
    if onset is None:
        return OnsetComparison()
    return (onset.preemption if key == "preemption" else onset.waiting) or OnsetComparison()


@dataclass(frozen=True)
class OnsetRow:
    """Predicted against observed onset of preemption (``key`` preemption) or of waiting requests (waiting)."""

    what: str
    key: str
    predicted_step: int | None
    predicted_concurrency: int | None
    observed_step: int | None
    observed_concurrency: int | None
    error_steps: int | None
    error_requests: int | None


def onset_rows(onset: Onset) -> list[OnsetRow]:
    """Predicted against observed onset of preemption and of waiting, one row each."""
    return [OnsetRow(what="preemption" if key == "preemption" else "requests waiting", key=key,
                     **compared(onset, key).model_dump(include=set(COMPARED)))
            for key, _seen, _none in ONSETS]


@dataclass
class SweepCell:
    """One configuration in one sweep: its step rows, its onset comparison and sentences; ``diagnosis`` where
    it has no step to show."""

    configuration: str
    status: str
    rows: list[StepRow] = field(default_factory=list)
    onset: Onset | None = None
    onset_rows: list[OnsetRow] = field(default_factory=list)
    sentences: list[str] = field(default_factory=list)
    warmup_note: str | None = None
    diagnosis: str | None = None
    preemption: OnsetComparison = field(default_factory=OnsetComparison)


def sweep_cell(record: ConfigurationRecord, entry: Scenario | None) -> SweepCell:
    """One configuration in one sweep: its step rows, its onset comparison and sentences."""
    name = record.configuration
    steps = (entry.steps if entry else None) or []
    if record.status != "ok" and not steps:
        return SweepCell(name, record.status, diagnosis=failure_summary(record))
    if not steps or entry is None:
        return SweepCell(name, "no steps", diagnosis="no step of this sweep ran")
    onset = entry.onset
    predicted = (onset.per_step if onset else None) or []
    rows = [step_row(s, next((p for p in predicted if p.step == s.step), None)) for s in steps]
    last = max((r.concurrency for r in rows if r.status == "ok" and r.concurrency), default=None)
    sentences = [onset_sentence(name, key, compared(onset, key), last, onset.unpredicted)
                 for key, _seen, _none in ONSETS] if onset else []
    return SweepCell(name, "ok" if all(r.status == "ok" for r in rows) else "failed", rows=rows, onset=onset,
                     onset_rows=onset_rows(onset) if onset else [], preemption=compared(onset, "preemption"),
                     sentences=sentences + _peak_sentence(name, rows), warmup_note=warmup_note(entry.warmup))


def _peak_sentence(name: str, rows: list[StepRow]) -> list[str]:
    timed = [r for r in rows if r.status == "ok" and r.output_tok_s is not None]
    if not timed:
        return [f"{name}: no step of this sweep completed."]
    best = max(timed, key=lambda r: r.output_tok_s)
    return [f"{name} delivers the most output tok/s at concurrency {best.concurrency} "
            f"({best.output_tok_s:,.1f} tok/s, step {best.step} of {len(rows)}; one pass per step, so no "
            "interval and no verdict between steps)."]


@dataclass(frozen=True)
class SweepTable:
    """One sweep scenario: its spec, each configuration's cell, whether any step had a goodput target, the
    cells' sentences and the outcome of each cell without steps."""

    name: str
    spec: ScenarioSpec
    cells: list[SweepCell]
    has_goodput: bool
    sentences: list[str]
    outcomes: list[str]


def sweep_tables(configurations: Iterable[ConfigurationRecord]) -> list[SweepTable]:
    """Per sweep scenario (in the trial's order): its spec and each configuration's cell."""
    configurations = list(configurations)
    specs = {}
    for rec in configurations:
        for sc in rec.scenarios:
            if is_sweep_entry(sc):
                specs.setdefault(sc.name, sc.spec)
    tables = []
    for name, spec in specs.items():
        cells = [sweep_cell(rec, next((s for s in rec.scenarios if s.name == name and is_sweep_entry(s)), None))
                 for rec in configurations]
        tables.append(SweepTable(name=name, spec=spec, cells=cells,
                                 has_goodput=any(r.slo_share_pct is not None for c in cells for r in c.rows),
                                 sentences=[line for c in cells for line in c.sentences],
                                 outcomes=[f"{c.configuration}: {c.diagnosis}." for c in cells if c.diagnosis]))
    return tables


def sweep_gaps(tables: Iterable[SweepTable]) -> list[str]:
    """What the sweeps did not give, one sentence each: an onset nothing predicted, a step with no
    /metrics figures (so neither preemptions nor KV cache usage are known there)."""
    out = []
    for t in tables:
        for c in t.cells:
            why = c.onset.unpredicted if c.onset else None
            if why:
                out.append(f"Sweep {t.name}: no onset predicted for {c.configuration} ({why}).")
            blind = [str(r.step) for r in c.rows if r.status == "ok" and r.kv_peak_pct is None]
            if blind:
                out.append(f"Sweep {t.name}: no KV cache usage sampled for {c.configuration} in step(s) "
                           f"{', '.join(blind)}.")
    return out
