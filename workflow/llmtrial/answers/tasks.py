"""The task set a trial asks every configuration: generated from a seed, read from JSONL files, or both.

Generated tasks are seed 001's kinds: three-digit additions and two-digit multiplications, graded
as numbers. A JSONL file holds one task per line: ``prompt``, ``expected``, ``grader`` (exact,
number, contains, regex; number when absent) and ``category`` (``fact`` when absent). A line that
does not read as a task is refused naming the file and line, before any server starts.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.answers.grading import GRADERS
from llmtrial.core.answers_model import Grader, Task
from llmtrial.core.trial_config import OutputsBlock

__all__ = ["TaskSetError", "CHECKOUT", "generate_tasks", "read_tasks", "task_file", "task_set", "tasks_digest"]

_KEYS = {"prompt", "expected", "grader", "category"}


class TaskSetError(ValueError):
    """A task set that cannot be used; the message names the key, file or line at fault."""


@dataclass(frozen=True)
class TaskFields:
    """A task before it is numbered in its set: its prompt, answer, grader, category and where it came from."""

    prompt: str
    expected: str
    grader: Grader
    category: str
    source: str

    def numbered(self, id: int) -> Task:
        return Task(id=id, prompt=self.prompt, expected=self.expected, grader=self.grader, category=self.category,
                    source=self.source)


def generate_tasks(seed: int, *, additions: int = 0, multiplications: int = 0) -> list[TaskFields]:
    """``additions`` three-digit additions then ``multiplications`` two-digit multiplications, drawn
    from ``random.Random(seed)``: the same seed gives the same tasks."""
    rng = random.Random(seed)
    out = []
    for _ in range(additions):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append(TaskFields(f"What is {a} + {b}? Answer with the number only.", str(a + b), "number", "addition",
                              f"generated (seed {seed})"))
    for _ in range(multiplications):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append(TaskFields(f"What is {a} * {b}? Answer with the number only.", str(a * b), "number",
                              "multiplication", f"generated (seed {seed})"))
    return out


def _task_line(raw: Any, where: str) -> TaskFields:
    """One JSONL line as a task's fields, or TaskSetError naming ``where``."""
    if not isinstance(raw, dict):
        raise TaskSetError(f"{where}: a task is a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise TaskSetError(f"{where}: unknown key(s) {', '.join(unknown)}; a task has {', '.join(sorted(_KEYS))}")
    for key in ("prompt", "expected"):
        if not isinstance(raw.get(key), str | int | float) or isinstance(raw.get(key), bool) or str(raw[key]) == "":
            raise TaskSetError(f"{where}: '{key}' must be a non-empty string")
    grader = raw.get("grader", "number")
    if grader not in GRADERS:
        raise TaskSetError(f"{where}: grader {grader!r} is not one of {', '.join(GRADERS)}")
    if grader == "regex":
        try:
            re.compile(str(raw["expected"]))
        except re.error as exc:
            raise TaskSetError(f"{where}: expected is not a regular expression ({exc})") from None
    category = raw.get("category", "fact")
    if not isinstance(category, str) or not category:
        raise TaskSetError(f"{where}: 'category' must be a non-empty string")
    return TaskFields(str(raw["prompt"]), str(raw["expected"]), grader, category, where)


def read_tasks(path: str | Path) -> list[TaskFields]:
    """The tasks of a JSONL file (blank lines and lines starting with # skipped)."""
    p = Path(path)
    if not p.is_file():
        raise TaskSetError(f"task file not found: {p}")
    out = []
    for number, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskSetError(f"{p}:{number}: not JSON ({exc.msg})") from None
        out.append(_task_line(raw, f"{p.name}:{number}"))
    if not out:
        raise TaskSetError(f"{p} holds no task")
    return out


#: The llmtrial checkout this package runs from (its config/answers/ holds the shipped sets), or None when
#: the package is installed elsewhere.
CHECKOUT = next((p for p in [Path(__file__).resolve().parents[3]] if (p / "config" / "answers").is_dir()), None)


def task_file(name: str | Path, base: Path | None = None) -> Path:
    """Where the task file ``name`` is: as given when absolute; else relative to ``base`` (the working
    directory when None), or, when not there, to the llmtrial checkout (so ``config/answers/small.jsonl``
    names the shipped set from any working directory)."""
    path = Path(name)
    if path.is_absolute():
        return path
    here = Path(base or Path.cwd()) / path
    if here.exists() or CHECKOUT is None or not (CHECKOUT / path).exists():
        return here
    return CHECKOUT / path


def task_set(outputs: OutputsBlock, base: Path | None = None) -> list[Task]:
    """The trial's task set from its ``outputs`` settings: the generated tasks, then each file's
    (found by :func:`task_file`), numbered from 1."""
    items: list[TaskFields] = []
    generate = outputs.generate
    if generate is not None:
        items += generate_tasks(generate.seed, additions=generate.additions, multiplications=generate.multiplications)
    for name in outputs.files:
        items += read_tasks(task_file(name, base))
    if not items:
        raise TaskSetError("outputs asks no task: give outputs.generate counts or outputs.files")
    return [item.numbered(i) for i, item in enumerate(items, start=1)]


def tasks_digest(tasks: Sequence[Task]) -> str:
    """sha256 of the tasks' prompts, answers and graders (JSON, in order): equal exactly when two runs
    asked the same tasks."""
    data = [[t.prompt, t.expected, t.grader, t.category] for t in tasks]
    return hashlib.sha256(json.dumps(data, ensure_ascii=False).encode()).hexdigest()
