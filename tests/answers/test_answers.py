"""The task set, its graders and the agreement arithmetic, on fixed answers."""

from __future__ import annotations

import pytest

from llmtrial.answers.agreement import accuracy_caution, agree, agreement_sentence
from llmtrial.answers.grading import grade, last_number
from llmtrial.answers.tasks import TaskSetError, generate_tasks, read_tasks, task_set
from llmtrial.core.answers_model import Answer
from llmtrial.core.trial_config import GenerateBlock, OutputsBlock


@pytest.mark.parametrize(("answer", "expected"), [("6126", "6106"), ("1849", "1869"), ("4710", "4810")])
def test_seed_001s_three_wrong_products_grade_wrong(answer: str, expected: str) -> None:
    assert not grade(answer, expected, "number")


@pytest.mark.parametrize("answer", ["6,106.", "71 * 86 = 6106", "The answer is 6106", " 6106\n"])
def test_formatted_numbers_grade_as_the_number(answer: str) -> None:
    assert grade(answer, "6106", "number")
    assert last_number("6,106.") == 6106


def test_contains_exact_and_regex_graders() -> None:
    assert grade("The capital of France is Paris.", "Paris", "contains")
    assert not grade("The capital of France is Lyon.", "Paris", "contains")
    assert grade(" 900 ", "900", "exact") and not grade("900.", "900", "exact")
    assert grade("There are seven days.", r"\b(7|seven)\b", "regex")


def test_the_same_seed_generates_the_same_tasks_and_their_answers_are_right() -> None:
    a = generate_tasks(3, additions=30, multiplications=20)
    assert a == generate_tasks(3, additions=30, multiplications=20) != generate_tasks(4, additions=30, multiplications=20)
    assert [t.category for t in a].count("addition") == 30
    for t in a:
        x, op, y = t.prompt.split()[2:5]
        assert int(t.expected) == (int(x) + int(y.rstrip("?")) if op == "+" else int(x) * int(y.rstrip("?")))


def test_a_bad_task_line_is_refused_naming_the_file_and_line(tmp_path) -> None:
    f = tmp_path / "set.jsonl"
    f.write_text('{"prompt": "2+2?", "expected": "4"}\n\n{"prompt": "x", "expected": "y", "grader": "fuzzy"}\n')
    with pytest.raises(TaskSetError, match=r"set.jsonl:3: grader 'fuzzy'"):
        read_tasks(f)
    f.write_text('{"prompt": "2+2?", "expected": "4"}\nnot json\n')
    with pytest.raises(TaskSetError, match=r"set.jsonl:2: not JSON"):
        read_tasks(f)


def test_the_shipped_set_reads_with_ids_from_one() -> None:
    tasks = task_set(OutputsBlock(files=["config/answers/small.jsonl"], generate=GenerateBlock(seed=1, additions=2)))
    assert [t.id for t in tasks] == list(range(1, len(tasks) + 1))
    assert {t.category for t in tasks} == {"addition", "multiplication", "fact"}


def _answers(texts: list[str]) -> list[Answer]:
    return [Answer(task=i, category="x", text=t, token_ids=[ord(c) for c in t], sha256=None, finish_reason="stop",
                   output_tokens=len(t), correct=False, seconds=0.1) for i, t in enumerate(texts, start=1)]


def test_agreement_counts_identical_answers_and_names_the_first_differing_token() -> None:
    base = ["a"] * 60
    other = list(base)
    other[6], other[30] = "ab", "b"
    ag = agree("bf16", _answers(base), "awq", _answers(other))
    assert agreement_sentence(ag) == "identical on 58 of 60; 2 differ (prompts 7 and 31)"
    assert [(d.task, d.first) for d in ag.differences] == [(7, 1), (31, 0)]
    assert agreement_sentence(agree("a", _answers(base), "b", _answers(base))) == "identical on 60 of 60"


def test_a_difference_of_a_few_prompts_is_named_as_no_ranking() -> None:
    assert "not a ranking" in accuracy_caution(58, 55, 60)
    assert accuracy_caution(58, 58, 60) is None and accuracy_caution(58, 30, 60) is None
