"""Ask a running server every task of the set, greedy, and grade the answers.

One request per task, ``concurrency`` at a time (1 by default: batching can change greedy
answers), temperature 0 with the trial's seed, ``return_token_ids`` so the first differing token
between two runs can be named. A request that fails is an answer with its error, graded wrong;
the run goes on.
"""

from __future__ import annotations

import hashlib
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict

from llmtrial.answers.grading import grade
from llmtrial.core.answers_model import Accuracy, Answer, AnswerRun, Task
from llmtrial.core.trial_config import OutputsBlock

log = logging.getLogger(__name__)

__all__ = ["CompletionRequest", "Completion", "request_body", "ask_one", "ask_all", "accuracy", "identical_repeats", "run_set"]


class ChatMessage(BaseModel):
    """One message of a chat request or of its answer."""

    model_config = ConfigDict(extra="ignore")

    role: str = "assistant"
    content: str | None = None


class CompletionRequest(BaseModel):
    """The OpenAI-style request for one task: greedy, seeded, asking for the answer's token ids; ``messages``
    for the chat API, ``prompt`` for the completions API."""

    model: str
    max_tokens: int
    temperature: float = 0.0
    seed: int
    return_token_ids: bool = True
    messages: list[ChatMessage] | None = None
    prompt: str | None = None


class Choice(BaseModel):
    """The fields of an answer's first choice that are read (the server's, not our record)."""

    model_config = ConfigDict(extra="ignore")

    text: str | None = None
    message: ChatMessage | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None


class Usage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    completion_tokens: int | None = None


class Completion(BaseModel):
    """The server's answer to a :class:`CompletionRequest`, as far as it is read."""

    model_config = ConfigDict(extra="ignore")

    choices: list[Choice]
    usage: Usage | None = None


def request_body(task: Task, *, model: str, api: str, max_tokens: int, seed: int) -> CompletionRequest:
    """The request for ``task``: greedy, seeded, asking for the answer's token ids."""
    if api == "chat":
        return CompletionRequest(model=model, max_tokens=max_tokens, seed=seed,
                                 messages=[ChatMessage(role="user", content=task.prompt)])
    return CompletionRequest(model=model, max_tokens=max_tokens, seed=seed, prompt=task.prompt)


def _choice_text(choice: Choice, api: str) -> str:
    if api == "chat":
        return (choice.message.content if choice.message else None) or ""
    return choice.text or ""


def ask_one(base_url: str, task: Task, *, model: str, api: str, max_tokens: int, seed: int,
            timeout: float) -> Answer:
    """One task asked and graded."""
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    body = request_body(task, model=model, api=api, max_tokens=max_tokens, seed=seed)
    req = urllib.request.Request(base_url + path, data=body.model_dump_json(exclude_none=True).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = Completion.model_validate_json(resp.read())
        choice = payload.choices[0]
    except (OSError, ValueError, IndexError) as exc:
        detail = exc.read().decode("utf-8", "replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
        return Answer(task=task.id, category=task.category, text=None, sha256=None, finish_reason=None,
                      output_tokens=None, correct=False, seconds=round(time.monotonic() - start, 3),
                      error=f"{type(exc).__name__}: {exc}{' ' + detail if detail else ''}")
    text = _choice_text(choice, api)
    return Answer(task=task.id, category=task.category, text=text, token_ids=choice.token_ids,
                  sha256=hashlib.sha256(text.encode()).hexdigest(), finish_reason=choice.finish_reason,
                  output_tokens=payload.usage.completion_tokens if payload.usage else None,
                  correct=grade(text, task.expected, task.grader), seconds=round(time.monotonic() - start, 3))


def ask_all(base_url: str, tasks: Sequence[Task], *, settings: OutputsBlock, model: str) -> list[Answer]:
    """Every task asked, ``settings.concurrency`` at a time; answers in task order."""
    def one(task: Task) -> Answer:
        return ask_one(base_url, task, model=model, api=settings.api, max_tokens=settings.max_tokens,
                       seed=settings.seed, timeout=float(settings.timeout_s))

    with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
        return list(pool.map(one, tasks))


def accuracy(tasks: Sequence[Task], answers: Sequence[Answer]) -> list[Accuracy]:
    """Right answers per category, in the order categories first appear, then all."""
    by: dict[str, list[bool]] = {}
    for task, answer in zip(tasks, answers, strict=True):
        by.setdefault(task.category, []).append(answer.correct)
    rows = [Accuracy(category=c, right=sum(v), of=len(v)) for c, v in by.items()]
    return [*rows, Accuracy(category="all", right=sum(r.right for r in rows), of=sum(r.of for r in rows))]


def identical_repeats(repeats: Sequence[Sequence[Answer]]) -> int | None:
    """Tasks whose answer text was the same on every repeat; None for a single repeat."""
    if len(repeats) < 2:
        return None
    return sum(1 for same in zip(*repeats, strict=True) if len({a.text for a in same}) == 1 and same[0].text is not None)


def run_set(base_url: str, tasks: Sequence[Task], *, settings: OutputsBlock, model: str,
            launch: str, flags: Mapping[str, bool], **parts: Any) -> AnswerRun:
    """The set asked ``settings.repeat`` times of the server at ``base_url``: the run's record."""
    started, clock = time.time(), time.monotonic()
    repeats = [ask_all(base_url, tasks, settings=settings, model=model) for _ in range(settings.repeat)]
    run = AnswerRun(launch=launch, flags=dict(flags), started=started, seconds=round(time.monotonic() - clock, 3),
                    repeat=len(repeats), repeat_identical=identical_repeats(repeats), answers=repeats[0],
                    accuracy=accuracy(tasks, repeats[0]), **parts)
    total = run.accuracy[-1]
    log.info("answers (%s%s): %d of %d right in %.1f s%s", launch,
             "".join(f", {k} {'on' if v else 'off'}" for k, v in flags.items()), total.right, total.of, run.seconds,
             "" if run.repeat_identical is None else f"; identical on {run.repeat_identical} of {len(tasks)} repeats")
    return run
