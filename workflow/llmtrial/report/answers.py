"""The report's Answers section: what each configuration answered to the trial's task set
(``outputs``), accuracy per category, the agreement matrix of every run against every other, each
prompt answered differently from the baseline with both answers and where they part, and whether
a patch's flag changed answers (the set asked again of a server with the flags off).

Sentences follow seed 001's caution: answers are compared character for character ("identical on
11 of 12; 1 differs (prompt 7)"), and a few prompts' difference in accuracy on a small set is named
as no ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmtrial.answers.agreement import AnswerAgreement, accuracy_caution, agree, agreement_sentence, matrix
from llmtrial.core.answers_model import Accuracy, AnswerRun, Answers, Task
from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.record_models import ManifestRecord

__all__ = ["LabelledRun", "labelled_runs", "answers_context", "answers_sentences", "answers_gaps"]

TINY_NOTE = ("The model is the generated tiny model (model.source.kind tiny): its weights are random, so its answers "
             "mean nothing and an accuracy near zero is expected. What the set still shows is whether configurations "
             "and patches change the answers.")


@dataclass(frozen=True)
class LabelledRun:
    """One asking of the set, named as the report names it: ``tp1``, or ``tp1, flags off``."""

    label: str
    configuration: str
    run: AnswerRun
    answers: Answers


def labelled_runs(configurations: Sequence[ConfigurationRecord]) -> list[LabelledRun]:
    """Every run of the set that completed, in configuration order, the passes' server first."""
    out = []
    for rec in configurations:
        if rec.answers is None:
            continue
        for run in rec.answers.runs:
            if run.failure is None and run.answers:
                label = rec.configuration if run.launch == "passes" else f"{rec.configuration}, flags off"
                out.append(LabelledRun(label=label, configuration=rec.configuration, run=run, answers=rec.answers))
    return out


def _all(run: AnswerRun) -> tuple[int, int]:
    row = next(a for a in run.accuracy if a.category == "all")
    return row.right, row.of


def _flags_text(run: AnswerRun) -> str:
    return ", ".join(f"{name} {'on' if on else 'off'}" for name, on in run.flags.items()) or "no patch"


@dataclass(frozen=True)
class AccuracyRow:
    """One run of the set: its label and flags, right answers per category and over all, whether it answered
    alike when asked again, how long it took and its server's log."""

    label: str
    flags: str
    cells: list[Accuracy | None]
    all: Accuracy
    repeat: str
    repeat_ok: bool
    seconds: float
    ready_s: float | None
    server_log: str | None


def _accuracy_rows(runs: Sequence[LabelledRun], categories: list[str]) -> list[AccuracyRow]:
    rows = []
    for lr in runs:
        by = {a.category: a for a in lr.run.accuracy}
        of = len(lr.run.answers)
        repeat = ("asked once" if lr.run.repeat_identical is None else
                  f"identical on {lr.run.repeat_identical} of {of} over {lr.run.repeat} asks")
        rows.append(AccuracyRow(label=lr.label, flags=_flags_text(lr.run),
                                cells=[by.get(c) for c in categories], all=by["all"], repeat=repeat,
                                repeat_ok=lr.run.repeat_identical in (None, of), seconds=lr.run.seconds,
                                ready_s=lr.run.ready_s, server_log=lr.run.server_log))
    return rows


@dataclass(frozen=True)
class DifferenceRow:
    """One prompt two runs answered differently: each answer and grade, and where they first differ."""

    pair: str
    task: int
    prompt: str
    a: str | None
    b: str | None
    a_correct: bool
    b_correct: bool
    first: str | None


def _difference_rows(pair: str, ag: AnswerAgreement, prompts: dict[int, str]) -> list[DifferenceRow]:
    return [DifferenceRow(pair=pair, task=d.task, prompt=prompts[d.task], a=d.a, b=d.b, a_correct=d.a_correct,
                          b_correct=d.b_correct, first=None if d.first is None else f"{d.unit} {d.first + 1}")
            for d in ag.differences]


def _pairs(runs: Sequence[LabelledRun], baseline: str) -> list[tuple[str, LabelledRun, LabelledRun]]:
    """What sentences and the differences table compare: each configuration's passes run against the
    baseline's, and each flags-off run against its own configuration's passes run."""
    passes = {lr.configuration: lr for lr in runs if lr.run.launch == "passes"}
    base = passes.get(baseline)
    against_base = [("baseline", base, lr) for lr in runs if base is not None and lr.run.launch == "passes" and lr is not base]
    return against_base + [("patch", passes[lr.configuration], lr) for lr in runs
                           if lr.run.launch == "flags_off" and lr.configuration in passes]


@dataclass(frozen=True)
class AnswersSection:
    """The report's Answers section: the set as asked, the runs' accuracy, the agreement matrix, every
    prompt answered differently and the sentences of "What the trial found"."""

    settings: Answers
    categories: list[str]
    baseline: str
    rows: list[AccuracyRow]
    labels: list[str]
    matrix: list[list[AnswerAgreement]]
    differences: list[DifferenceRow]
    sentences: list[str]
    tasks: list[Task]
    flags_off: bool


def answers_context(configurations: Sequence[ConfigurationRecord], baseline: str | None,
                    manifest: ManifestRecord) -> AnswersSection | None:
    """What the template's Answers section shows; None when no configuration was asked the set."""
    runs = labelled_runs(configurations)
    if not runs:
        return None
    first = runs[0].answers
    categories = list(dict.fromkeys(t.category for t in first.tasks))
    base = baseline if any(lr.configuration == baseline for lr in runs) else runs[0].configuration
    prompts = {t.id: t.prompt for t in first.tasks}
    differences = []
    for kind, a, b in _pairs(runs, base):
        pair = f"{b.label} against {a.label}" if kind == "baseline" else f"{a.label} (flags on) against flags off"
        differences += _difference_rows(pair, agree(a.label, a.run.answers, b.label, b.run.answers), prompts)
    grid = matrix({lr.label: lr.run.answers for lr in runs})
    return AnswersSection(settings=first, categories=categories, baseline=base, rows=_accuracy_rows(runs, categories),
                          labels=[lr.label for lr in runs], matrix=grid, differences=differences,
                          sentences=answers_sentences(runs, base, manifest), tasks=first.tasks,
                          flags_off=any(lr.run.launch == "flags_off" for lr in runs))


def _patch_sentence(on: LabelledRun, off: LabelledRun) -> str:
    ag = agree(on.label, on.run.answers, off.label, off.run.answers)
    names = [name for name, flag in on.run.flags.items() if flag]
    if len(names) > 1:
        flags, patch, changes = f"flags of {', '.join(names[:-1])} and {names[-1]}", "the patches", "change"
    else:
        flags, patch, changes = f"flag of {''.join(names)}", "the patch", "changes"
    verdict = f"{patch} did not change the answers" if not ag.differences else f"{patch} {changes} answers"
    return (f"{on.configuration} with the {flags} on against off (a launch of its own): "
            f"{agreement_sentence(ag)}; {verdict}.")


def _baseline_sentence(base: LabelledRun, other: LabelledRun) -> str:
    ag = agree(base.label, base.run.answers, other.label, other.run.answers)
    (ra, of), (rb, _) = _all(base.run), _all(other.run)
    out = f"{other.label}'s answers against the baseline {base.label}'s: {agreement_sentence(ag)}."
    caution = accuracy_caution(ra, rb, of)
    if caution:
        out += f" {other.label} is right on {rb} and {base.label} on {ra}: {caution}."
    return out


def answers_sentences(runs: Sequence[LabelledRun], baseline: str, manifest: ManifestRecord) -> list[str]:
    """The Answers lines of "What the trial found"."""
    first = runs[0]
    of = len(first.answers.tasks)
    right = ", ".join(f"{lr.label} on {_all(lr.run)[0]}" for lr in runs if lr.run.launch == "passes")
    out = [f"Answers to the set of {of} tasks ({first.answers.api}, greedy, at most {first.answers.max_tokens} tokens): "
           f"right {right} of {of}."]
    for kind, a, b in _pairs(runs, baseline):
        out.append(_baseline_sentence(a, b) if kind == "baseline" else _patch_sentence(a, b))
    for lr in runs:
        if lr.run.repeat_identical is not None and lr.run.repeat_identical < of:
            out.append(f"{lr.label} did not answer alike when asked again: identical on {lr.run.repeat_identical} "
                       f"of {of} over {lr.run.repeat} asks (greedy decoding, so its serving is not deterministic).")
    if manifest.source.get("kind") == "tiny":
        out.append(TINY_NOTE)
    return out


def answers_gaps(configurations: Sequence[ConfigurationRecord]) -> list[str]:
    """The "What was not measured" lines: no set asked, or a run of it that did not complete."""
    if all(r.answers is None for r in configurations):
        return ["No task set was asked of any server (the trial file's outputs block is unset, or nothing served): "
                "whether the configurations or a patch change the answers was not checked."]
    out = []
    for rec in configurations:
        for run in rec.answers.runs if rec.answers else ():
            if run.failure is not None:
                which = "with the patch flags off" if run.launch == "flags_off" else "after the passes"
                out.append(f"{rec.configuration}: the task set {which} did not complete ({run.failure}).")
        if rec.status == "ok" and rec.answers is None:
            out.append(f"{rec.configuration}: served, but no answers are recorded (the set was asked of the others).")
    return out
