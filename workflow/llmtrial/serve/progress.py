"""What a person watching a run sees of a configuration's job, on the terminal as well as in the
job's log (the ``llmtrial.progress`` logger, :data:`llmtrial.core.joblog.PROGRESS`): the launch,
each start-up phase as the server's log states it, ready with the KV cache line, each pass with
its output tok/s and the agreement so far, why the passes stopped, and the outcome.

The lines are worded here, from what the job already holds (the server log's facts, a pass's
record entry); the job calls :func:`say`."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.joblog import PROGRESS
from llmtrial.core.scenario_model import Pass, Repetition
from llmtrial.logs.lines import log_lines, read_log
from llmtrial.logs.startup_log import parse_startup

progress = logging.getLogger(PROGRESS)

#: The start-up facts a watcher reports as they appear in the server's log, in the order vLLM
#: reaches them, each with its wording.
STARTUP_PHASES = (
    ("model_init_seconds", "model initialised in {value} {unit}"),
    ("loading_weights_seconds", "weights loaded in {value} {unit}"),
    ("model_load_seconds", "model loaded in {value} {unit}"),
    ("model_load_gib", "model weights take {value} {unit}"),
    ("available_kv_gib", "KV cache memory available: {value} {unit}"),
    ("kv_cache_tokens", "KV cache: {value:,} {unit}"),
    ("engine_init_seconds", "engine initialised (profiling, KV cache, warm-up) in {value} {unit}"),
)
#: Why a scenario's passes stopped (serve.scenarios.RepetitionRule.verdict), in words.
STOPPED = {"agreed": "they agreed", "max_reached": "the maximum was reached", "fixed": "the count asked was run",
           "failed": "a pass failed"}


def say(message: str, *args: Any) -> None:
    progress.info(message, *args)


def _message(line: str) -> str:
    """A log line's message without vLLM's prefixes (process, level, time, file)."""
    parsed = log_lines(line)
    return parsed[0].message if parsed else line.strip()


def ready_line(name: str, ready_s: float, startup: Mapping[str, Any]) -> str:
    """``tp1: ready after 41.2 s; CPU KV cache size: ... (server.log:73)``."""
    kv = startup.get("kv_cache_tokens")
    said = f"{_message(kv['line'])} ({kv['source']})" if kv and kv.get("line") else "no KV cache line in its log"
    return f"{name}: ready after {ready_s:.1f} s; {said}"


def pass_line(name: str, label: str, one: Pass, spread: float | None = None, ran: int = 1) -> str:
    """One pass, warm-up or sweep step as it ended: its output tok/s, and a scenario's agreement so far."""
    if one.status != "ok" or one.summary is None:
        why = "timed out" if one.timed_out else f"exit {one.returncode}"
        return f"{name}: {label} FAILED ({why}; its log: {one.log})"
    tok_s, ttft = one.summary.output_throughput, one.summary.median_ttft_ms
    text = f"{name}: {label}: {tok_s:,.1f} output tok/s" if tok_s is not None else f"{name}: {label}: no output tok/s"
    if ttft is not None:
        text += f", median TTFT {ttft:,.1f} ms"
    if ran > 1:
        text += f"; spread over {ran} passes so far {100 * spread:.1f} %" if spread is not None else "; no spread yet"
    return text


def stopped_line(name: str, scenario: str, repetition: Repetition) -> str:
    """Why a scenario's passes stopped, with the spread they ended at."""
    spread = repetition.spread
    return (f"{name}: {scenario}: {repetition.passes_run} pass(es), stopped because {STOPPED[str(repetition.stopped)]}"
            + (f" (spread {100 * spread:.1f} %)" if spread is not None else ""))


def outcome_line(record: ConfigurationRecord, path: str) -> str:
    """How the configuration's job ended, and where its record is."""
    name = record.configuration
    if record.status == "skipped":
        return f"{name}: not launched, the planner says it cannot work: {'; '.join(record.plan.reasons)} ({path})"
    if record.failure is not None:
        return f"{name}: FAILED in {record.failure.phase} ({record.failure.reason}): {record.failure.message} ({path})"
    return f"{name}: {record.status} in {record.timing.wall_s:.0f} s; its record: {path}"


class StartupWatch:
    """Called while the server starts (every few seconds): says each start-up phase the server's
    log has reached since the last call, and every 30 s how long the start has taken."""

    def __init__(self, name: str, log_path: Path, source: str, note_every: float = 30.0):
        self.name, self.log_path, self.source = name, log_path, source
        self.seen: set[str] = set()
        self.started = time.monotonic()
        self.note_every, self.last_note = note_every, time.monotonic()

    def __call__(self) -> None:
        facts = parse_startup(read_log(self.log_path), source=self.source) if self.log_path.exists() else {}
        for key, wording in STARTUP_PHASES:
            f = facts.get(key)
            if f is not None and key not in self.seen and f.get("value") is not None:
                self.seen.add(key)
                say("%s: start-up: %s (%s)", self.name, wording.format(value=f["value"], unit=f.get("unit") or ""),
                    f["source"])
        if time.monotonic() - self.last_note >= self.note_every:
            self.last_note = time.monotonic()
            say("%s: still starting, %.0f s since launch", self.name, time.monotonic() - self.started)
