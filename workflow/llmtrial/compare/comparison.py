"""Trial B against trial A: the comparison record (:class:`llmtrial.core.comparison_model.ComparisonRecord`).

The earlier trial (by the time its preflight read the host) is A; verdicts say how B did against it.
Configurations and scenarios are matched by name. Per configuration x scenario x figure, B's pass
values are tested against A's (:func:`llmtrial.report.verdicts.judge`, at B's confidence level unless
one is given) and the ratio B / A is given with its interval, unless a workload difference makes that
configuration's scenario not comparable, in which case no ratio is given and the reason names the keys.
Where both trials asked a configuration the same task set, B's answers are compared with A's character
for character (the passes' servers), as the report compares configurations.
"""

from __future__ import annotations

from pathlib import Path

from llmtrial.answers.agreement import accuracy_caution, agree, identical_phrase
from llmtrial.compare.comparability import blocking, change_sentence, differences
from llmtrial.compare.trials import TrialResults
from llmtrial.core.answers_model import Answers
from llmtrial.core.comparison_model import AnswersRow, ComparisonRecord, Difference, Row, Side, TrialRef
from llmtrial.report.cells import Cell, FigureOverPasses, Settings
from llmtrial.report.conclusions import figures_of, fixed_scenarios, ranks, scenario_cell
from llmtrial.report.verdicts import judge


def trial_ref(t: TrialResults) -> TrialRef:
    return TrialRef(folder=str(t.folder), trial=t.trial, commit=t.provenance.commit, dirty=t.provenance.dirty,
                    recorded_at=t.recorded_at)


def ordered(x: TrialResults, y: TrialResults) -> tuple[TrialResults, TrialResults]:
    """(earlier, later) by the time each trial's preflight read the host."""
    return (x, y) if x.recorded_at <= y.recorded_at else (y, x)


def _cells(t: TrialResults, name: str, settings: Settings) -> dict[str, Cell]:
    """One configuration's cells by scenario name (:func:`llmtrial.report.conclusions.scenario_cell`)."""
    rec = t.configurations[name]
    return {sc.name: scenario_cell(rec, sc, ranks(t.plans.get(name)), settings, figures_of(sc.spec))
            for sc in fixed_scenarios(rec)}


def _side(fig: FigureOverPasses | None) -> Side:
    if not fig:
        return Side(median=None, low=None, high=None, values=[])
    ci = fig.ci
    return Side(median=fig.median, low=ci.low if ci else None, high=ci.high if ci else None, values=fig.values)


def _not_comparable(blocked: list[Difference]) -> str:
    keys = ", ".join(f"{d.key.rsplit('.', 1)[-1]} ({d.a} against {d.b})" for d in blocked)
    return f"not comparable: {keys} differ"


def figure_row(name: str, scenario: str, figure: tuple, cells: tuple[Cell, Cell], blocked: list[Difference],
               settings: Settings) -> Row:
    """B against A on one figure of one configuration's scenario."""
    key, label, unit, higher, _digits = figure
    ca, cb = cells
    fa, fb = ca.figures.get(key), cb.figures.get(key)
    base = {"configuration": name, "scenario": scenario, "figure": key, "label": label, "unit": unit,
            "higher_is_better": higher, "a": _side(fa), "b": _side(fb)}
    if blocked:
        return Row(**base, ratio=None, low=None, high=None, verdict="not comparable", reason=_not_comparable(blocked))
    if not fa or not fb:
        missing = "A" if not fa else "B"
        return Row(**base, ratio=None, low=None, high=None, verdict="unstable", reason=f"no completed pass in {missing}")
    v = judge(fb.values, fa.values, higher=higher, level=settings.level, key=key, wide=bool(ca.unstable or cb.unstable))
    return Row(**base, ratio=v.test.ratio, low=v.test.low, high=v.test.high, verdict=v.word, reason=v.reason)


def rows(a: TrialResults, b: TrialResults, names: list[str], diffs: list[Difference], settings: Settings) -> list[Row]:
    out = []
    for name in names:
        cells_a, cells_b = _cells(a, name, settings), _cells(b, name, settings)
        for scenario in [s for s in cells_b if s in cells_a]:
            spec = next(sc.spec for sc in fixed_scenarios(b.configurations[name]) if sc.name == scenario)
            blocked = blocking(diffs, name, scenario)
            out += [figure_row(name, scenario, f, (cells_a[scenario], cells_b[scenario]), blocked, settings)
                    for f in figures_of(spec)]
    return out


def sentences(record_rows: list[Row], level: float) -> list[str]:
    """Per configuration x scenario, output tok/s of B against A; then how many figures differ."""
    out = []
    for r in (r for r in record_rows if r.figure == "output_tok_s"):
        where = f"{r.configuration} in {r.scenario}"
        if r.verdict == "not comparable":
            out.append(f"{where}: {r.reason}; no verdict.")
        elif r.ratio is not None and r.low is not None:
            out.append(f"{where}: B is {r.verdict} than A on output tok/s" if r.verdict in ("faster", "slower") else
                       f"{where}: {r.verdict} on output tok/s" + (f" ({r.reason})" if r.reason else ""))
            out[-1] += (f", {r.ratio:.2f}x ({100 * level:g} % CI {r.low:.2f}–{r.high:.2f}x; medians {r.b.median:,.1f} "
                        f"against {r.a.median:,.1f} tok/s).")
        else:
            out.append(f"{where}: {r.verdict} on output tok/s ({r.reason}).")
    judged = [r for r in record_rows if r.verdict != "not comparable"]
    differ = [r for r in judged if r.verdict in ("faster", "slower", "better", "worse")]
    out.append(f"{len(differ)} of {len(judged)} figures compared differ at {100 * level:g} % confidence"
               + (": " + "; ".join(f"{r.configuration} {r.scenario} {r.label} {r.verdict}" for r in differ) if differ else "")
               + ".")
    return out


def _right(answers: Answers | None) -> int | None:
    run = next((r for r in answers.runs if r.launch == "passes"), None) if answers else None
    return None if run is None or run.failure else next(a.right for a in run.accuracy if a.category == "all")


def answers_row(name: str, a: Answers | None, b: Answers | None) -> AnswersRow | None:
    """B's answers against A's for one configuration (the passes' servers); None when neither was asked a set."""
    if a is None and b is None:
        return None
    base = {"configuration": name, "right_a": _right(a), "right_b": _right(b)}
    if a is None or b is None:
        return AnswersRow(**base, identical=None, of=None, differing=[], reason=f"no task set asked in {'A' if a is None else 'B'}")
    if a.tasks_sha256 != b.tasks_sha256:
        return AnswersRow(**base, identical=None, of=None, differing=[],
                          reason="not comparable: the task sets differ (tasks sha256)")
    if base["right_a"] is None or base["right_b"] is None:
        return AnswersRow(**base, identical=None, of=None, differing=[], reason="the set did not complete in A or B")
    ag = agree("A", a.runs[0].answers, "B", b.runs[0].answers)
    return AnswersRow(**base, identical=ag.identical, of=ag.of, differing=ag.differing, reason=None)


def answers_sentences(found: list[AnswersRow]) -> list[str]:
    """Per configuration: B's answers against A's, with seed 001's caution on a few prompts' difference."""
    out = []
    for r in found:
        if r.identical is None or r.of is None:
            out.append(f"{r.configuration}'s answers: {r.reason}.")
            continue
        line = f"{r.configuration}'s answers in B against A: {identical_phrase(r.identical, r.of, r.differing)}."
        caution = accuracy_caution(r.right_a or 0, r.right_b or 0, r.of)
        if caution:
            line += f" B is right on {r.right_b} and A on {r.right_a}: {caution}."
        out.append(line)
    return out


def compare_trials(x: str | Path, y: str | Path, level: float | None = None) -> ComparisonRecord:
    """The comparison record of two results folders (either order: the earlier is A)."""
    a, b = ordered(TrialResults.load(x), TrialResults.load(y))
    settings = b.settings()
    if level is not None:
        settings = Settings(baseline=settings.baseline, max_disagreement=settings.max_disagreement, notes=settings.notes,
                            level=level, resamples=settings.resamples, seed=settings.seed)
    names = [n for n in b.configurations if n in a.configurations]
    diffs = differences(a, b, names)
    found = rows(a, b, names, diffs, settings)
    answered = [row for n in names
                if (row := answers_row(n, a.configurations[n].answers, b.configurations[n].answers)) is not None]
    return ComparisonRecord(
        a=trial_ref(a), b=trial_ref(b), level=settings.level, method=settings.method_line(),
        workloads_match=not any(d.effect == "not comparable" for d in diffs), differences=diffs,
        changes=[change_sentence(d) for d in diffs if d.effect == "under test"],
        only_in_a=[n for n in a.configurations if n not in b.configurations],
        only_in_b=[n for n in b.configurations if n not in a.configurations],
        rows=found, answers=answered, sentences=sentences(found, settings.level) + answers_sentences(answered))
