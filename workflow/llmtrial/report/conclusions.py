"""What the trial concludes, worked out from the records alone (no log is read again).

Per scenario the configurations are ranked on the figures that matter, each figure the
median over the scenario's passes with its min and max, each with its difference from a
baseline configuration; a configuration whose passes disagree more than the trial's
threshold is marked unstable. Sentences are generated from these numbers, never written by
hand. Also: cold against warm, the per-request throughput inside concurrent passes, and
what the records say was not measured.

Every record is read as its model (:mod:`llmtrial.core.record_models`): a field is an attribute,
a field a record may leave out reads as None. What this module works out (tables, cells, figures
over passes) are the types of :mod:`llmtrial.report.cells`.

A scenario with a latency target (``spec.slo``) is also ranked on goodput (requests per second
meeting every target, vLLM's ``--goodput`` rule) and the share of requests meeting it; its
order is by goodput. Sweeps (``kind: sweep``, a ``steps`` list) are not ranked here: they have
steps, not passes, and :mod:`llmtrial.report.sweeps` reads them. Records written before scenarios had
a ``kind``, ``warmup`` or ``repetition`` read as fixed scenarios without a warm-up.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from llmtrial.core.configuration_model import ColdStart, ConfigurationRecord, RateFact
from llmtrial.core.cost import Cost, hosts_of, pass_cost_figures, whole_energy
from llmtrial.core.preflight_model import PreflightRecord
from llmtrial.core.record_base import Fact
from llmtrial.core.record_models import PlanRecord
from llmtrial.core.scenario_model import (
    Goodput,
    Pass,
    PassSummary,
    Repetition,
    RequestSpread,
    Scenario,
    ScenarioSpec,
    Slo,
)
from llmtrial.core.stats import (
    DEFAULT_LEVEL,
    Interval,
    bootstrap_interval,
    cv,
    pass_interval,
    percentile,
)
from llmtrial.host.telemetry_sources import RAPL_SOURCE
from llmtrial.report.cells import Cell, FigureOverPasses, FigureSpec, ScenarioTable, Settings, SloPasses, Stall
from llmtrial.report.costs import ENERGY_FIGURE, cell_energy, cost_figure, cost_sentence, has_energy
from llmtrial.report.verdicts import NO_DIFFERENCE, Verdict, judge
from llmtrial.report.why_failed import idle_clause, signature_text
from llmtrial.serve.bench import headline
from llmtrial.serve.scenarios import DEFAULT_SLO_PERCENTILE, is_sweep, passes_asked, repetition_of, spread_of

#: The ranked figures: key, label, unit, whether higher is better, digits shown.
FIGURES: tuple[FigureSpec, ...] = (
    ("output_tok_s", "output tok/s", "tok/s", True, 1),
    ("tok_s_per_accelerator", "tok/s per accelerator", "tok/s", True, 1),
    ("tok_s_per_user", "tok/s per user", "tok/s", True, 2),
    ("ttft_median_ms", "TTFT median", "ms", False, 1),
    ("ttft_p99_ms", "TTFT p99", "ms", False, 1),
    ("tpot_median_ms", "TPOT median", "ms", False, 2),
    ("tpot_p99_ms", "TPOT p99", "ms", False, 2),
)
#: The goodput figures of a scenario with a latency target (``spec.slo``), ranked first.
GOODPUT_FIGURES: tuple[FigureSpec, ...] = (
    ("goodput", "goodput", "req/s", True, 2),
    ("slo_share", "SLO share", "%", True, 1),
)
#: The figure pass agreement is judged on (the record's own agreement figure).
AGREEMENT_FIGURE = "output_tok_s"


def is_sweep_entry(entry: Scenario) -> bool:
    """Whether a scenario entry is a sweep: its spec lists per-step values (:func:`llmtrial.serve.scenarios.is_sweep`)."""
    return is_sweep(entry.spec)


def asked(spec: ScenarioSpec) -> str:
    """What the trial file asked for: a fixed count, or passes until they agree."""
    return passes_asked(spec)


def repetition(entry: Scenario | None) -> Repetition:
    """How many passes a scenario ran and why they stopped (:func:`llmtrial.serve.scenarios.repetition_of`;
    a record written before ``repetition`` existed ran a fixed count)."""
    return repetition_of(entry)


def fixed_scenarios(record: ConfigurationRecord) -> list[Scenario]:
    """A configuration record's scenario entries that have passes (not sweeps), in order."""
    return [sc for sc in record.scenarios if not is_sweep_entry(sc)]


def figures_of(spec: ScenarioSpec, cost: Cost | None = None,
               energy: bool = False) -> tuple[FigureSpec, ...]:
    """The figures a scenario is ranked on: goodput first when it has a latency target; the cost per million
    output tokens when a price is given, the energy per output token where it was measured."""
    extra = ((cost_figure(cost),) if cost else ()) + ((ENERGY_FIGURE,) if energy else ())
    return (GOODPUT_FIGURES + FIGURES if spec.slo else FIGURES) + extra


def ranks(plan: PlanRecord | None) -> int | None:
    """Accelerators (GPUs, or CPU workers) one configuration uses: DP x TP x PP from its plan
    (:attr:`llmtrial.core.record_models.PlanRecord.accelerators`)."""
    return plan.accelerators if plan is not None else None


def pass_figures(summary: PassSummary, concurrency: int, n_ranks: int | None) -> dict[str, float | None]:
    """The ranked figures of one pass, from vLLM's result summary as recorded."""
    figures = headline(summary)
    tok_s = figures["output_tok_s"]
    return {
        **figures,
        "tok_s_per_accelerator": tok_s / n_ranks if tok_s is not None and n_ranks else None,
        "tok_s_per_user": tok_s / concurrency if tok_s is not None and concurrency else None,
        **goodput_figures(summary.goodput),
    }


def goodput_figures(goodput: Goodput | None) -> dict[str, float | None]:
    """A pass's goodput (req/s meeting every target) and SLO share (%); None without a target."""
    if goodput is None:
        return {"goodput": None, "slo_share": None}
    share = goodput.share
    return {"goodput": goodput.request_goodput, "slo_share": 100.0 * share if share is not None else None}


def over_passes(values: Iterable[float | None], level: float = DEFAULT_LEVEL) -> FigureOverPasses | None:
    """One figure over passes (None without a value); its ``bootstrap`` (a latency figure's interval over
    requests) is set by :func:`scenario_cell`, its ``best``, ``tied`` and ``vs_baseline`` by :func:`against_baseline`."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return FigureOverPasses(values=vals, median=statistics.median(vals), min=min(vals), max=max(vals), n=len(vals),
                  spread=spread_of(vals), ci=pass_interval(vals, level), cv=cv(vals))


#: The latency figures with a bootstrap interval over requests: the per-request samples and the statistic.
BOOTSTRAPPED = {"ttft_median_ms": ("request_ttft_ms", statistics.median),
                "ttft_p99_ms": ("request_ttft_ms", lambda v: percentile(v, 99)),
                "tpot_median_ms": ("request_tpot_ms", statistics.median),
                "tpot_p99_ms": ("request_tpot_ms", lambda v: percentile(v, 99))}


def request_interval(ok: list[Pass], key: str, settings: Settings) -> Interval | None:
    """A latency figure's bootstrap interval over the requests of every pass together, where vLLM's
    per-request detail was recorded (None otherwise, or for a figure that is not a latency)."""
    if key not in BOOTSTRAPPED:
        return None
    field, stat = BOOTSTRAPPED[key]
    samples = [v for p in ok for v in (getattr(p.summary, field) or [])]
    return bootstrap_interval(samples, stat, settings.level, settings.resamples, settings.seed)


def failure_summary(record: ConfigurationRecord) -> str:
    """One line on why a configuration has no figures."""
    if record.status == "skipped":
        reasons = record.plan.reasons
        return f"not launched: the planner said {record.plan.verdict}" + (f" ({reasons[0].rstrip('.')})" if reasons else "")
    failure = record.failure
    if failure is None:
        return "failed in an unknown phase: no diagnosis recorded"
    sig = failure.signature
    if sig is not None and (failure.error_line is None or failure.error_line.pattern == "unknown"):
        # no known failure explains it: what the log shows of the crash says more than that
        return (f"failed in {failure.phase}: {signature_text(sig)} (line {sig.crash_line} of {sig.source}; "
                "no known failure explains it)")
    line = (failure.error_line.diagnosis if failure.error_line else None) or failure.message or "no diagnosis recorded"
    clause = idle_clause(record)
    return f"failed in {failure.phase}: {line.rstrip('.')}" + (f"; the server {clause}" if clause else "")


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f} %" if x is not None else "unknown"


def _rules(rep: Repetition) -> str:
    """The stopping rules a scenario ran under, with the figure each reached."""
    rules = [f"within {_pct(rep.agreement)} (spread {_pct(rep.spread)})"] if rep.agreement is not None else []
    if rep.interval is not None:
        level = f"{100 * rep.level:g} % " if rep.level is not None else ""
        rules.append(f"with their {level}interval within {_pct(rep.interval)} of the median (width {_pct(rep.interval_width)})")
    return " and ".join(rules) or "under no rule"


def repetition_note(rep: Repetition, warmup: Pass | None = None) -> str:
    """One line: how many passes ran, why they stopped, and whether a warm-up pass came first."""
    n, stopped = rep.passes_run, rep.stopped
    passes = f"{n} pass{'es' if n != 1 else ''}"
    if stopped == "agreed":
        text = f"{passes}: stopped once they agreed {_rules(rep)}"
    elif stopped == "max_reached":
        text = f"{passes}, the most allowed: they never agreed {_rules(rep)}"
    elif stopped == "failed":
        text = f"{passes}: stopped when pass {n} failed"
    else:
        text = f"{passes}, a fixed count"
    note = warmup_note(warmup)
    return f"{text}; {note}" if note else text


def repetition_noteworthy(entry: Scenario | None) -> bool:
    """Whether the passes' count says more than the trial file's fixed count: a warm-up ran, passes
    ran until they agreed, or the run stopped early. Records without ``repetition`` never do."""
    if entry is None:
        return False
    rep = entry.repetition
    return bool(entry.warmup) or bool(rep and (rep.agreement is not None or rep.interval is not None
                                               or rep.stopped != "fixed"))


def warmup_note(warmup: Pass | None) -> str | None:
    """Whether a warm-up pass ran before the figures' passes (it is never counted in them)."""
    if not warmup:
        return None
    return ("a warm-up pass ran first, kept out of the figures" if warmup.status == "ok"
            else "a warm-up pass ran first and failed, kept out of the figures")


def _slo_passes(ok: list[Pass]) -> SloPasses | None:
    """How many passes met the scenario's SLO at its percentile."""
    judged = [p.summary.goodput for p in ok if p.summary.goodput]
    if not judged:
        return None
    return SloPasses(met=sum(1 for g in judged if g.met), n=len(judged), percentile=judged[0].percentile)


def scenario_cell(record: ConfigurationRecord, scenario: Scenario | None, n_ranks: int | None,
                  settings: Settings, figures: Iterable[FigureSpec] = FIGURES, cost: Cost | None = None) -> Cell:
    """One configuration in one scenario (:class:`llmtrial.report.cells.Cell`); the warm-up pass is never among its passes."""
    keys = [key for key, *_ in figures]
    cell = Cell(configuration=record.configuration, figures=dict.fromkeys(keys), energy=cell_energy([]))
    ok = scenario.ok_passes() if scenario else []
    if scenario is not None:
        cell.repetition = repetition(scenario)
        cell.repetition_note = repetition_note(cell.repetition, scenario.warmup)
        cell.repetition_shown = repetition_noteworthy(scenario)
    if record.status != "ok" or not ok:
        cell.status = record.status if record.status != "ok" else "no passes"
        cell.diagnosis = failure_summary(record) if record.status != "ok" else "no pass of this scenario completed"
        return cell
    concurrency = int(scenario.spec.concurrency)
    units = cost.units(n_ranks, hosts_of(record)) if cost else None
    per_pass = [{**pass_figures(p.summary, concurrency, n_ranks), **pass_cost_figures(p, cost, units, whole_energy(record))}
                for p in ok]
    if "energy_per_token_j" in keys:
        cell.energy = cell_energy(ok)
    for key in keys:
        fig = cell.figures[key] = over_passes((f[key] for f in per_pass), settings.level)
        if fig:
            fig.bootstrap = request_interval(ok, key, settings)
    cell.passes = len(ok)
    cell.slo = _slo_passes(ok)
    cell.stalls = [Stall(pass_=p.pass_, mean_ttft_ms=p.summary.mean_ttft_ms, median_ttft_ms=p.summary.median_ttft_ms)
                   for p in ok if p.stall]
    fig = cell.figures[AGREEMENT_FIGURE]
    cell.spread = fig.spread if fig else None
    cell.unstable = cell.spread is not None and cell.spread > settings.max_disagreement
    return cell


def _baseline(names: list[str], settings: Settings) -> str | None:
    if settings.baseline is not None:
        return settings.baseline
    return names[0] if names else None


def _values(cell: Cell, key: str) -> list[float]:
    fig = cell.figures[key]
    return fig.values if fig else []


def cell_verdict(a: Cell, b: Cell, key: str, higher: bool, settings: Settings) -> Verdict:
    """Configuration cell ``a`` against ``b`` on one figure (:func:`llmtrial.report.verdicts.judge`)."""
    return judge(_values(a, key), _values(b, key), higher=higher, level=settings.level, key=key,
                 wide=bool(a.unstable or b.unstable))


def against_baseline(cells: list[Cell], baseline: str | None, settings: Settings,
                     figures: Iterable[FigureSpec] = FIGURES) -> None:
    """Mark in place each figure's verdict against the baseline and the best value: ``best`` where the
    leader (by median) is detectably better than every other configuration, else ``tied`` on the leader
    and on each configuration not detectably worse than it."""
    ok = [c for c in cells if c.status == "ok"]
    base = next((c for c in ok if c.configuration == baseline), None)
    for key, _label, _unit, higher, _digits in figures:
        have = [(c, fig) for c in ok if (fig := c.figures[key])]
        for c, fig in have:
            if base is not None and c is not base and base.figures[key]:
                fig.vs_baseline = cell_verdict(c, base, key, higher, settings)
        if len(have) < 2:
            continue
        leader, lead_fig = (max if higher else min)(have, key=lambda pair: pair[1].median)
        tied = [(c, fig) for c, fig in have if c is not leader and not cell_verdict(leader, c, key, higher, settings).decided]
        lead_fig.best = not tied
        for _c, fig in [(leader, lead_fig), *tied] if tied else []:
            fig.tied = True


def scenario_specs(configurations: Iterable[ConfigurationRecord]) -> dict[str, ScenarioSpec]:
    """Every scenario with passes (sweeps left out) the configurations ran, in the trial's order, with its spec."""
    specs: dict[str, ScenarioSpec] = {}
    for rec in configurations:
        for sc in fixed_scenarios(rec):
            specs.setdefault(sc.name, sc.spec)
    return specs


def scenario_tables(configurations: list[ConfigurationRecord], plans: Iterable[PlanRecord],
                    settings: Settings, cost: Cost | None = None) -> list[ScenarioTable]:
    """Per scenario (in the trial's order): every configuration's cell, ranked by output tok/s
    (by goodput where the scenario has a latency target), configurations without figures last,
    with their one-line diagnosis; with the cost per million output tokens at ``cost`` (the provenance
    record's price) and the energy per output token where measured. Sweeps are not here
    (:func:`llmtrial.report.sweeps.sweep_tables`)."""
    names = [r.configuration for r in configurations]
    baseline = _baseline(names, settings)
    plans = list(plans)
    tables = []
    for name, spec in scenario_specs(configurations).items():
        energy = has_energy(configurations, name)
        figures = figures_of(spec, cost, energy)
        cells = []
        for rec in configurations:
            sc = next((s for s in fixed_scenarios(rec) if s.name == name), None)
            plan = next((p for p in plans if p.configuration == rec.configuration), None)
            cells.append(scenario_cell(rec, sc, ranks(plan), settings, figures, cost))
        against_baseline(cells, baseline, settings, figures)
        ranked_by = "goodput" if spec.slo else "output_tok_s"
        cells.sort(key=lambda c: (c.status != "ok", -(c.median(ranked_by) or 0)))
        for i, c in enumerate(c for c in cells if c.status == "ok"):
            c.rank = i + 1
        table = ScenarioTable(name=name, spec=spec, cells=cells, baseline=baseline, figures=figures, ranked_by=ranked_by,
                              passes_asked=asked(spec), slo_text=slo_text(spec.slo) if spec.slo else None,
                              unstable=[c.configuration for c in cells if c.unstable],
                              single_pass=[c.configuration for c in cells if c.status == "ok" and c.passes < 2],
                              settings=settings, cost=cost, energy=energy)
        table.sentences = scenario_sentences(table)
        tables.append(table)
    return tables


def _at(settings: Settings) -> str:
    return f"at {100 * settings.level:g} % confidence"


def _ratio_sentence(lead: Cell, other: Cell, settings: Settings) -> str:
    """Output tok/s of the leader against another configuration, said as the verdict allows."""
    a, b = lead.median("output_tok_s") or 0.0, other.median("output_tok_s") or 0.0
    v = cell_verdict(lead, other, "output_tok_s", True, settings)
    names, medians = (lead.configuration, other.configuration), f"medians {a:,.1f} against {b:,.1f} tok/s"
    if v.decided:
        return (f"{names[0]} delivers {v.ratio_text()} the output tok/s of {names[1]} ({medians}): "
                f"{v.word} {_at(settings)}")
    if v.word == NO_DIFFERENCE:
        return (f"{names[0]} and {names[1]} show no detectable difference in output tok/s {_at(settings)} "
                f"(ratio {v.ratio_text()}; {medians}): a tie")
    return f"{names[0]} against {names[1]} on output tok/s is {v.word}, {v.reason} (ratio {v.ratio_text()}; {medians})"


def _ttft_sentence(cells: list[Cell], settings: Settings) -> str | None:
    timed = sorted(((c, m) for c in cells if (m := c.median("ttft_median_ms")) is not None), key=lambda pair: pair[1])
    if len(timed) < 2:
        return None
    (fast, a), (slow, b) = timed[0], timed[-1]
    if not b:
        return None
    v = cell_verdict(fast, slow, "ttft_median_ms", False, settings)
    ms = f"(median TTFT {a:,.1f} against {b:,.1f} ms; ratio {v.ratio_text()})"
    if v.decided:
        return f"{fast.configuration} is {v.word} to first token than {slow.configuration} {_at(settings)} {ms}"
    if v.word == NO_DIFFERENCE:
        return (f"{fast.configuration} and {slow.configuration} show no detectable difference in time to first "
                f"token {_at(settings)} {ms}")
    return f"{fast.configuration} against {slow.configuration} on time to first token is {v.word}, {v.reason} {ms}"


def _unstable_note(cells: Iterable[Cell]) -> str:
    shaky = [f"{c.configuration} {100 * (c.spread or 0.0):.1f} %" for c in cells if c.unstable]
    return f" Unstable: passes disagree on output tok/s by {', '.join(shaky)}." if shaky else ""


def _percentile(slo: Slo) -> float:
    """The share of requests (%) that must meet the target."""
    return float(slo.percentile if slo.percentile is not None else DEFAULT_SLO_PERCENTILE)


def slo_text(slo: Slo) -> str:
    """The target as words: ``TTFT ≤ 500 ms, TPOT ≤ 50 ms at p90``."""
    named = ((slo.ttft_ms, "TTFT"), (slo.tpot_ms, "TPOT"), (slo.e2el_ms, "end-to-end latency"))
    targets = ", ".join(f"{label} ≤ {ms:g} ms" for ms, label in named if ms is not None)
    return f"{targets} at p{_percentile(slo):g}"


def _goodput_sentence(table: ScenarioTable, lead: Cell, other: Cell) -> str:
    a, b = lead.median("goodput"), other.median("goodput")
    if a is None or b is None:
        return f"no goodput figure for {(other if a is not None else lead).configuration}"
    v = cell_verdict(lead, other, "goodput", True, table.settings)
    said = (f"a {v.word} goodput than" if v.decided else "no detectable difference in goodput from" if v.word == NO_DIFFERENCE
            else f"a goodput too unstable to compare ({v.reason}) with")
    return (f"under the target ({table.slo_text}), {lead.configuration} has {said} "
            f"{other.configuration} {_at(table.settings)} ({a:,.2f} against {b:,.2f} req/s meeting every target; "
            f"ratio {v.ratio_text()}); ranked by goodput")


def slo_sentence(table: ScenarioTable) -> str | None:
    """Which configurations meet the scenario's SLO (their share at least its percentile), pass by pass."""
    judged = [(c, c.slo) for c in table.ok() if c.slo]
    if not judged or table.spec.slo is None:
        return None
    parts = []
    for c, slo in judged:
        met, n = slo.met, slo.n
        share = c.median("slo_share")
        verdict = ("meets it" + (" in every pass" if n > 1 else "") if met == n
                   else "misses it" + (" in every pass" if n > 1 else "") if met == 0 else f"meets it in {met} of {n} passes")
        parts.append(f"{c.configuration} {verdict} ({share:.1f} % of requests within target)" if share is not None
                     else f"{c.configuration} {verdict}")
    return f"The SLO asks for at least {_percentile(table.spec.slo):g} % of requests within the target: {'; '.join(parts)}."


def scenario_sentences(table: ScenarioTable) -> list[str]:
    """Sentences for one scenario, generated from its cells."""
    spec = table.spec
    where = f"In scenario {table.name} (concurrency {spec.concurrency}), "
    ok = table.ok()
    slo = slo_sentence(table) if spec.slo else None
    priced = cost_sentence(table, table.cost)
    if not ok:
        return [f"No configuration completed scenario {table.name}."]
    if len(ok) == 1:
        only = ok[0]
        return [f"Only {only.configuration} completed scenario {table.name}: "
                f"{only.median('output_tok_s') or 0.0:,.1f} output tok/s.{_unstable_note(ok)}"] + [
                    s for s in (slo, priced) if s]
    lead = ok[0]
    other = next((c for c in ok if c.configuration == table.baseline and c is not lead), ok[1])
    if spec.slo:
        by_tok_s = sorted((lead, other), key=lambda c: -(c.median("output_tok_s") or 0.0))
        out = [where + _goodput_sentence(table, lead, other) + ".",
               "On output tok/s alone, " + _ratio_sentence(*by_tok_s, table.settings) + "."]
    else:
        out = [where + _ratio_sentence(lead, other, table.settings) + "."]
    ttft = _ttft_sentence(ok, table.settings)
    if ttft:
        out.append(ttft + ".")
    out[-1] += _unstable_note(ok)
    return out + [s for s in (slo, priced) if s]


def outcome_sentences(configurations: Iterable[ConfigurationRecord]) -> list[str]:
    """One sentence per configuration that gave no figures."""
    return [f"{r.configuration} {failure_summary(r)}." for r in configurations if r.status != "ok"]


def warning_sentences(configurations: Iterable[ConfigurationRecord]) -> list[str]:
    """One sentence per warning the engine printed that the seeds acted on, with its log line."""
    out = []
    for r in configurations:
        for w in r.engine_warnings:
            more = f", {w.count} lines" if w.count > 1 else ""
            out.append(f"{r.configuration}: {w.summary} ({w.source}{more}).")
    return out


@dataclass(frozen=True)
class ColdWarm:
    """A configuration's cold start against its warm passes at concurrency 1: launch to ready, the first request,
    the warm figures over passes and the ratios (warm tok/s over the first request's, its TTFT over warm)."""

    configuration: str
    ready_s: Fact | None
    first_ttft_s: Fact | None
    first_output_tok_s: RateFact | None
    warm_scenario: str | None
    warm_tok_s: FigureOverPasses | None
    warm_ttft_ms: FigureOverPasses | None
    tok_s_ratio: float | None
    ttft_ratio: float | None


def cold_warm(record: ConfigurationRecord) -> ColdWarm | None:
    """Launch to ready, the cold first request, the warm median at concurrency 1 and their ratio."""
    if record.status != "ok":
        return None
    cold: ColdStart = record.cold_start
    warm_sc = next((s for s in fixed_scenarios(record) if int(s.spec.concurrency) == 1), None)
    ok = [p.summary for p in (warm_sc.pass_results if warm_sc else []) if p.status == "ok" and p.summary]
    warm_tok_s = over_passes(s.output_throughput for s in ok)
    warm_ttft = over_passes(s.median_ttft_ms for s in ok)
    cold_tok_s = cold.first_output_tok_s.value if cold.first_output_tok_s else None
    cold_ttft = cold.first_ttft_s.value if cold.first_ttft_s else None
    return ColdWarm(
        configuration=record.configuration, ready_s=cold.ready_seconds, first_ttft_s=cold.first_ttft_s,
        first_output_tok_s=cold.first_output_tok_s, warm_scenario=warm_sc.name if warm_sc else None,
        warm_tok_s=warm_tok_s, warm_ttft_ms=warm_ttft,
        tok_s_ratio=warm_tok_s.median / cold_tok_s if warm_tok_s and cold_tok_s else None,
        ttft_ratio=cold_ttft * 1000.0 / warm_ttft.median if warm_ttft and cold_ttft and warm_ttft.median else None)


@dataclass(frozen=True)
class Stream:
    """One concurrent pass: its aggregate output tok/s and each request's own, with their spread."""

    configuration: str
    scenario: str
    pass_: int
    concurrency: int
    aggregate: float | None
    requests: list[float]
    summary: RequestSpread | None


def streams(record: ConfigurationRecord) -> list[Stream]:
    """Per concurrent pass: the output tok/s of each request, as vLLM's per-request detail gives it."""
    out = []
    for sc in fixed_scenarios(record):
        if int(sc.spec.concurrency) < 2:
            continue
        for p in sc.pass_results:
            s = p.summary
            if p.status == "ok" and s and s.request_output_tok_s:
                out.append(Stream(configuration=record.configuration, scenario=sc.name, pass_=p.pass_,
                                  concurrency=int(sc.spec.concurrency), aggregate=s.output_throughput,
                                  requests=s.request_output_tok_s, summary=s.request_output_tok_s_summary))
    return out


def _telemetry_gaps(configurations: Iterable[ConfigurationRecord]) -> list[str]:
    """A telemetry source absent, or failing at times, in any configuration's job."""
    seen: dict[tuple[str, str], list[str]] = {}
    for r in configurations:
        for name, src in (r.telemetry.sources or {}).items():
            if name == RAPL_SOURCE and src.status == "absent":  # said by llmtrial.report.costs.cost_gaps
                continue
            if src.status in ("absent", "failed at times", "failed"):
                why = src.reason or src.status
                seen.setdefault((name, why), []).append(r.configuration)
    out = []
    for (name, why), names in seen.items():
        what = "no power, energy, GPU utilisation or GPU memory over time" if name == "nvml" else "gaps in its series"
        out.append(f"Telemetry source {name}: {why} ({', '.join(names)}): {what}.")
    return out


def not_measured(*, preflight: PreflightRecord, configurations: list[ConfigurationRecord],
                 plans: Iterable[PlanRecord], tables: Iterable[ScenarioTable]) -> list[str]:
    """What the records say was not measured, one sentence each."""
    out = []
    gpus = preflight.environment.gpus
    if not gpus.present:
        out.append(f"No GPU: {gpus.reason or 'none found'}. No GPU power, energy, utilisation or PCIe "
                   "figures exist for this trial; throughput per accelerator counts CPU workers (DP x TP x PP).")
    out += _telemetry_gaps(configurations)
    for t in tables:
        if t.single_pass:
            out.append(f"Scenario {t.name}: one pass only for {', '.join(t.single_pass)}, so no agreement figure.")
    for r in configurations:
        if r.status != "ok":
            out.append(f"{r.configuration}: no serving figures ({failure_summary(r)}).")
    for p in plans:
        if "weights_bytes" in p.facts and p.facts["weights_bytes"].kind == "estimated":
            out.append(f"{p.configuration}: the weights' size is estimated ({p.facts['weights_bytes'].source}), "
                       "not measured.")
    for r in configurations:
        missing = [row.name for row in r.prediction if row.measured is None]
        if missing:
            out.append(f"{r.configuration}: predicted but not measured: {', '.join(missing)}.")
    if not preflight.probes:
        out.append("No host probes are recorded (memory bandwidth, collective all-reduce): the trial does not "
                   "measure the fabric or the cards' links under load.")
    return out
