"""The answers part of a configuration record: the task set asked of its server after the passes,
each answer with its grade, and each run (the passes' server, and a launch with a patch's flag off)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmtrial.core.record_base import Maybe, RecordModel

Grader = Literal["exact", "number", "contains", "regex"]


class Task(RecordModel):
    """One task of the set: a prompt with its known answer and how it is graded."""

    id: int = Field(ge=1, description="The task's number in the set, from 1 (what sentences name as prompt N).")
    prompt: str = Field(description="What the server is asked.")
    expected: str = Field(description="The known answer (a regular expression for grader regex).")
    grader: Grader = Field(description="How the answer is graded (llmtrial.answers.grading).")
    category: str = Field(description="The task's category (addition, multiplication, fact, ...).")
    source: str = Field(description="Where it came from: generated (seed N) or file:line.")


class Answer(RecordModel):
    """What the server answered to one task, and its grade."""

    task: int = Field(ge=1, description="The task's id.")
    category: str = Field(description="The task's category.")
    text: str | None = Field(description="The answer's text; null when the request failed.")
    token_ids: Maybe[list[int]] = Field(None, description="The answer's token ids, as vLLM returned them.")
    sha256: str | None = Field(description="sha256 of the text (UTF-8), hex.")
    finish_reason: str | None = Field(description="stop, length, ... as vLLM said.")
    output_tokens: int | None = Field(description="Tokens generated (the usage block).")
    correct: bool = Field(description="The grader accepted the answer.")
    seconds: float = Field(ge=0, description="Request to full answer.")
    error: str | None = Field(None, description="Why the request failed, or null.")


class Accuracy(RecordModel):
    """Right answers in one category (or all)."""

    category: str = Field(description="The category, or all.")
    right: int = Field(ge=0, description="Answers graded right.")
    of: int = Field(ge=0, description="Tasks asked.")


class AnswerRun(RecordModel):
    """The set asked of one server: the passes' own, or a launch of its own with patch flags off."""

    launch: Literal["passes", "flags_off"] = Field(description=(
        "passes: the server that ran the passes, after them; flags_off: a server launched for the set with "
        "the patch flags below off, the configuration otherwise the same."))
    flags: dict[str, bool] = Field(description="Each applied patch by name: its flag on in this server.")
    started: float = Field(description="Unix time the first request was sent.")
    seconds: float = Field(ge=0, description="Wall time of the set (every repeat).")
    repeat: int = Field(ge=1, description="Times the set was asked.")
    repeat_identical: int | None = Field(description=(
        "Tasks whose answers were identical, character for character, on every repeat; null for one repeat."))
    answers: list[Answer] = Field(description="The first repeat's answers, by task.")
    accuracy: list[Accuracy] = Field(description="Right answers per category, then all.")
    server_log: Maybe[str] = Field(None, description="flags_off: that server's log, relative to the configuration folder.")
    ready_s: Maybe[float] = Field(None, description="flags_off: launch to first /health 200, s.")
    failure: str | None = Field(None, description="Why the set did not complete (the server did not start, died), or null.")


class Answers(RecordModel):
    """The trial's task set (``outputs`` in the trial file) asked of this configuration."""

    api: Literal["chat", "completion"] = Field(description="chat: /v1/chat/completions with the model's chat template; "
                                                           "completion: /v1/completions with the raw prompt.")
    max_tokens: int = Field(ge=1, description="Most tokens per answer.")
    seed: int = Field(description="The requests' sampling seed.")
    temperature: float = Field(description="0: greedy.")
    tasks_sha256: str = Field(description="sha256 of the task list (JSON), to tell two runs asked the same tasks.")
    tasks: list[Task] = Field(description="The task set, in order.")
    runs: list[AnswerRun] = Field(description="The passes' server first, then a launch with flags off where one ran.")
