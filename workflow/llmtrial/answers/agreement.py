"""Do two runs answer alike? Identical answers character for character, the tasks that differ, and the
first token where each pair parts, with seed 001's caution: a few prompts on a small set is no ranking."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmtrial.core.answers_model import Answer

__all__ = ["AnswerDifference", "AnswerAgreement", "agree", "matrix", "tasks_phrase", "identical_phrase", "agreement_sentence", "accuracy_caution"]


@dataclass(frozen=True)
class AnswerDifference:
    """One task answered differently by two runs."""

    task: int
    a: str | None
    b: str | None
    a_correct: bool
    b_correct: bool
    #: Where the answers part: the first differing token (by token ids) or character (without them), from 0.
    first: int | None
    unit: str


@dataclass(frozen=True)
class AnswerAgreement:
    """Two runs' answers to the same tasks."""

    a: str
    b: str
    identical: int
    of: int
    differences: tuple[AnswerDifference, ...]

    @property
    def differing(self) -> list[int]:
        return [d.task for d in self.differences]


def _first_difference(x: Sequence[object], y: Sequence[object]) -> int:
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return i
    return min(len(x), len(y))


def _parting(a: Answer, b: Answer) -> tuple[int | None, str]:
    if a.token_ids is not None and b.token_ids is not None:
        return _first_difference(a.token_ids, b.token_ids), "token"
    if a.text is not None and b.text is not None:
        return _first_difference(a.text, b.text), "character"
    return None, "token"


def agree(a_label: str, a: Sequence[Answer], b_label: str, b: Sequence[Answer]) -> AnswerAgreement:
    """How ``a`` and ``b`` (answers to the same tasks, in order) agree; a failed request never agrees."""
    if [x.task for x in a] != [y.task for y in b]:
        raise ValueError(f"{a_label} and {b_label} answered different tasks")
    diffs = []
    for x, y in zip(a, b, strict=True):
        if x.text is None or x.text != y.text:
            first, unit = _parting(x, y)
            diffs.append(AnswerDifference(task=x.task, a=x.text, b=y.text, a_correct=x.correct, b_correct=y.correct,
                                    first=first, unit=unit))
    return AnswerAgreement(a=a_label, b=b_label, identical=len(a) - len(diffs), of=len(a), differences=tuple(diffs))


def matrix(runs: Mapping[str, Sequence[Answer]]) -> list[list[AnswerAgreement]]:
    """Every pair of ``runs`` (by label, in order): row i, column j compares run i with run j."""
    labels = list(runs)
    return [[agree(i, runs[i], j, runs[j]) for j in labels] for i in labels]


def tasks_phrase(ids: Sequence[int], most: int = 8) -> str:
    """"prompt 7", "prompts 7 and 31", "prompts 1, 2, 3 and 4 more"."""
    ids = list(ids)
    if len(ids) == 1:
        return f"prompt {ids[0]}"
    if len(ids) > most:
        return f"prompts {', '.join(map(str, ids[:most]))} and {len(ids) - most} more"
    return f"prompts {', '.join(map(str, ids[:-1]))} and {ids[-1]}"


def identical_phrase(identical: int, of: int, differing: Sequence[int]) -> str:
    """"identical on 58 of 60; 2 differ (prompts 7 and 31)", or "identical on 12 of 12"."""
    out = f"identical on {identical} of {of}"
    if differing:
        out += f"; {len(differing)} differ{'s' if len(differing) == 1 else ''} ({tasks_phrase(differing)})"
    return out


def agreement_sentence(ag: AnswerAgreement) -> str:
    """:func:`identical_phrase` of two runs' agreement."""
    return identical_phrase(ag.identical, ag.of, ag.differing)


def accuracy_caution(right_a: int, right_b: int, of: int) -> str | None:
    """Seed 001's caution when two runs' right answers differ by a few prompts (at most 3, or 5 % of the
    set): such a difference on a small set is not a ranking. None when they are equal or far apart."""
    gap = abs(right_a - right_b)
    if gap == 0 or gap > max(3, round(0.05 * of)):
        return None
    return (f"a difference of {gap} prompt{'s' if gap > 1 else ''} on a set of {of} is not a ranking: "
            "a set this small cannot tell the two apart")
