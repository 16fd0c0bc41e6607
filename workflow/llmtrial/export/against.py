"""A trial against another tool's runs, or reports against reports: the comparison record
(:class:`llmtrial.core.comparison_model.ComparisonRecord`) where a side is Benchmark Reports v0.2
(:mod:`llmtrial.export.reports` reads either side). A is the first side given, B the second.

Pairs: each of A's workloads (a trial's configuration x scenario, or a group of runs) meets each of B's
unless both state a concurrency, a request rate or parallel sizes, and they differ (:data:`PAIRED_BY`: that
pair measured another load, or another deployment; each workload left without a partner is named). Per pair, what both state is checked (:data:`RULES`):

- the model, the input and output lengths with their distribution, concurrency and request rate: a value
  that differs, or that a side does not state, makes the pair "not comparable", naming each key;
- the output tokens served per request (more than 1 % apart), the accelerator and its count, the parallel
  sizes: a difference makes it not comparable; where a side does not state one, that is noted and the verdict
  assumes they match;
- the engine and its version: a difference is the change under test, as between two trials;
- the tool that measured: noted.

Each figure of a comparable pair gets a verdict (:func:`llmtrial.report.verdicts.judge`, the trial's rules) by
the test the two sides' runs allow, said in the row with how far to trust it (:func:`which_test`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.compare.comparison import trial_ref
from llmtrial.compare.trials import TrialResults
from llmtrial.core.comparison_model import ComparisonRecord, Difference, Row, Side, TrialRef
from llmtrial.core.paths import TrialPaths
from llmtrial.core.stats import DEFAULT_LEVEL, ONE_RUN_METHOD, RATIO_METHOD, pass_interval
from llmtrial.export.reports import FIGURES, REPORT_SUFFIXES, Measured, report_measured, trial_measured
from llmtrial.report.cells import Settings
from llmtrial.report.verdicts import judge

#: What both sides state (:func:`llmtrial.export.reports.stated_of`), in the order checked: key -> (aspect, words,
#: effect where the sides differ, effect where a side does not state it).
RULES = {
    "model": ("model", "model", "not comparable", "not comparable"),
    "input_seq_len": ("workload", "input length", "not comparable", "not comparable"),
    "output_seq_len": ("workload", "output length", "not comparable", "not comparable"),
    "concurrency": ("workload", "concurrency", "not comparable", "not comparable"),
    "rate_qps": ("workload", "request rate", "not comparable", "not comparable"),
    "output_served": ("workload", "output tokens served per request", "not comparable", "noted"),
    "accelerator": ("hardware", "accelerator", "not comparable", "noted"),
    "parallelism": ("hardware", "parallelism (tp, pp, dp)", "not comparable", "noted"),
    "engine": ("vllm", "engine", "under test", "noted"),
    "load_tool": ("measurement", "measured by", "noted", "noted"),
}
#: Keys both sides may leave unstated and still be alike: as fast as possible has no rate, and no limit on the
#: requests in flight no concurrency.
UNSTATED_ALIKE = frozenset({"rate_qps", "concurrency"})
TOLERANCE = 0.01  # a measured length (a mean) within 1 % is the same length
#: What both sides state and must share to be paired at all: the load, and the parallel sizes (a trial's tp2 is
#: not set against another tool's tp1 runs).
PAIRED_BY = ("concurrency", "rate_qps", "parallelism")


@dataclass(frozen=True)
class SideOf:
    """One side: what it is and its workloads."""

    ref: TrialRef
    units: list[Measured]
    settings: Settings | None


def is_trial(path: str | Path) -> bool:
    """Whether ``path`` is read as a trial's results folder: it holds the provenance record, or it is a folder
    with no report in it (so that a trial's folder missing its provenance is refused naming that file)."""
    folder = Path(path)
    if TrialPaths(folder).provenance.is_file():
        return True
    return folder.is_dir() and not any(p.suffix in REPORT_SUFFIXES for p in folder.iterdir() if p.is_file())


def side_of(path: str | Path, tool: str | None = None) -> SideOf:
    """A trial's results folder, or reports (:func:`llmtrial.export.reports.read_reports`)."""
    if is_trial(path):
        trial = TrialResults.load(path)
        return SideOf(trial_ref(trial), trial_measured(trial), trial.settings())
    units, converters = report_measured(path, tool)
    tools = sorted({u.stated["load_tool"] or "a tool the reports do not name" for u in units})
    made = f" (converted by llm-d's package from {', '.join(converters)} result files)" if converters else ""
    ref = TrialRef(folder=str(path), trial=Path(path).name, commit=None, dirty=None, recorded_at=None,
                   kind="benchmark report", tool=", ".join(tools) + made)
    return SideOf(ref, units, None)


def _same(key: str, a: Any, b: Any) -> bool:
    if key == "output_served":
        return abs(a - b) <= TOLERANCE * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict) and "value" in a and "value" in b:
        close = abs(a["value"] - b["value"]) <= TOLERANCE * max(abs(a["value"]), abs(b["value"]))
        fixed = a["distribution"] == "fixed"
        return a["distribution"] == b["distribution"] and (a["value"] == b["value"] if fixed else close) and \
            (a.get("min"), a.get("max")) == (b.get("min"), b.get("max"))
    return a == b


def pair_differences(a: Measured, b: Measured) -> list[Difference]:
    """What A's workload and B's state differently, or one of them not at all (:data:`RULES`)."""
    out = []
    for key, (aspect, _words, differ, unstated) in RULES.items():
        va, vb = a.stated[key], b.stated[key]
        if va is None and vb is None and key in UNSTATED_ALIKE:
            continue
        if va is None or vb is None:
            effect = unstated
        elif _same(key, va, vb):
            continue
        else:
            effect = differ
        out.append(Difference(aspect=aspect, key=key, a=va, b=vb, effect=effect,
                              scope=f"{a.label} against {b.label}"))
    return out


def _other_load(a: Measured, b: Measured) -> bool:
    return any(a.stated[k] is not None and b.stated[k] is not None and a.stated[k] != b.stated[k]
               for k in PAIRED_BY)


def _words(d: Difference) -> str:
    name = RULES[d.key][1]
    if d.a is None or d.b is None:
        return f"{name} (not stated by {'A' if d.a is None else 'B'})"
    return f"{name} ({_value(d.a)} against {_value(d.b)})"


def _value(v: Any) -> str:
    if isinstance(v, dict) and "value" in v:
        return f"{v['distribution']} {v['value']:g}" + (f" ({v['min']}–{v['max']})" if v.get("min") is not None else "")
    if isinstance(v, dict):
        return ", ".join(f"{k} {x}" for k, x in v.items())
    return f"{v:g}" if isinstance(v, float) else str(v)


def which_test(n_a: int, n_b: int) -> str:
    """The test two sides of ``n_a`` and ``n_b`` runs allow, and how far to trust it."""
    if min(n_a, n_b) >= 2:
        return (f"over runs, {n_a} in A against {n_b} in B: {RATIO_METHOD}; as far as each side's runs are "
                "independent repeats of its work")
    if max(n_a, n_b) >= 2 and min(n_a, n_b) == 1:
        lone, many = ("A", "B") if n_a == 1 else ("B", "A")
        return (f"one run in {lone} against {max(n_a, n_b)} in {many}: {ONE_RUN_METHOD}; a single run cannot show "
                f"its own spread, so trust it only as far as {lone}'s runs would vary as {many}'s do")
    return "none: one run a side, no spread to test against (the ratio alone)"


def _side(values: list[float], level: float) -> Side:
    ci = pass_interval(values, level) if values else None
    return Side(median=statistics.median(values) if values else None, low=ci.low if ci else None,
                high=ci.high if ci else None, values=values)


def pair_rows(a: Measured, b: Measured, blocked: list[Difference], level: float) -> list[Row]:
    """B's runs against A's on every figure of one pair."""
    rows = []
    reason = "not comparable: " + ", ".join(_words(d) for d in blocked) + (" differ" if blocked else "")
    for key, label, unit, higher, _digits, _get, _field in FIGURES:
        va, vb = a.values[key], b.values[key]
        base = {"configuration": a.configuration, "scenario": a.scenario, "against": b.label, "figure": key,
                "label": label, "unit": unit, "higher_is_better": higher, "a": _side(va, level),
                "b": _side(vb, level), "test": which_test(len(va), len(vb))}
        if blocked:
            rows.append(Row(**base, ratio=None, low=None, high=None, verdict="not comparable", reason=reason))
            continue
        v = judge(vb, va, higher=higher, level=level, key=key, one_run=True)
        rows.append(Row(**base, ratio=v.test.ratio, low=v.test.low, high=v.test.high, verdict=v.word,
                        reason=v.reason if va and vb else f"not measured in {'A' if not va else 'B'}"))
    return rows


def _selected(units: list[Measured], configuration: str | None, scenario: str | None) -> list[Measured]:
    """A side's workloads of that configuration and scenario, each filter applied only where the side has a
    workload of that name (a trial's tp1 picked, reports labelled otherwise kept whole)."""
    if configuration is not None and any(u.configuration == configuration for u in units):
        units = [u for u in units if u.configuration == configuration]
    if scenario is not None and any(u.scenario == scenario for u in units):
        units = [u for u in units if u.scenario == scenario]
    return units


def pair_sentence(rows: list[Row], level: float) -> str:
    """One pair's finding on output tok/s, with the test behind it."""
    r = next(r for r in rows if r.figure == "output_tok_s")
    where = f"{r.configuration}/{r.scenario} against B's {r.against} ({len(r.b.values)} run(s))"
    if r.verdict == "not comparable":
        return f"{where}: {r.reason}; no verdict."
    said = f"B is {r.verdict} than A on output tok/s" if r.verdict in ("faster", "slower") else \
        f"{r.verdict} on output tok/s" + (f" ({r.reason})" if r.reason else "")
    ratio = (f", {r.ratio:.2f}x ({100 * level:g} % CI {r.low:.2f}–{r.high:.2f}x)" if r.low is not None else
             f", {r.ratio:.2f}x (no interval)" if r.ratio is not None else "")
    medians = f"; medians {r.b.median:,.1f} against {r.a.median:,.1f} tok/s" if r.a.median and r.b.median else ""
    return f"{where}: {said}{ratio}{medians}. Test: {r.test}."


def compare_against(x: str | Path, y: str | Path, *, level: float | None = None, tool: str | None = None,
                    configuration: str | None = None, scenario: str | None = None) -> ComparisonRecord:
    """The comparison record of A (``x``) and B (``y``), either a trial's results folder or reports; ``tool``
    names the tool of a result file that is not recognised, ``configuration`` and ``scenario`` keep each side's
    workloads of that name, where it has any (:func:`_selected`)."""
    a, b = side_of(x, tool), side_of(y, tool)
    settings = a.settings or b.settings
    lvl = level if level is not None else settings.level if settings else DEFAULT_LEVEL
    ua, ub = (_selected(s.units, configuration, scenario) for s in (a, b))
    pairs = [(p, q) for p in ua for q in ub if not _other_load(p, q)]
    diffs, rows, said = [], [], []
    for p, q in pairs:
        found = pair_differences(p, q)
        diffs += found
        pair = pair_rows(p, q, [d for d in found if d.effect == "not comparable"], lvl)
        rows += pair
        said.append(pair_sentence(pair, lvl))
    judged = [r for r in rows if r.verdict != "not comparable"]
    differ = [r for r in judged if r.verdict in ("faster", "slower", "better", "worse")]
    said.append(f"{len(differ)} of {len(judged)} figures compared differ at {100 * lvl:g} % confidence" +
                (": " + "; ".join(f"{r.configuration}/{r.scenario} against {r.against} {r.label} {r.verdict}"
                                  for r in differ) if differ else "") + ".")
    noted = sorted({_words(d) for d in diffs if d.effect == "noted" and (d.a is None or d.b is None)})
    if noted:
        said.append(f"Not stated, so assumed alike: {'; '.join(noted)}.")
    paired_a, paired_b = {p.label for p, _ in pairs}, {q.label for _, q in pairs}
    method = (settings.method_line() if settings else f"Confidence level {100 * lvl:g} %.") + (
        " Against reports: the test each row names (over runs where both sides have two or more; one run "
        f"against the other side's runs: {ONE_RUN_METHOD}; none with one run a side).")
    return ComparisonRecord(
        a=a.ref, b=b.ref, level=lvl, method=method,
        workloads_match=bool(pairs) and not any(d.effect == "not comparable" for d in diffs), differences=diffs,
        changes=sorted({f"{RULES[d.key][1]}: {_value(d.a)} in A, {_value(d.b)} in B"
                        for d in diffs if d.effect == "under test"}),
        only_in_a=[u.label for u in ua if u.label not in paired_a],
        only_in_b=[u.label for u in ub if u.label not in paired_b], rows=rows, answers=[], sentences=said)
