"""A server's start-up split into its phases, as its log gives them.

vLLM stamps each line with the second it was written (``INFO 11-29 16:24:35 [file.py:68]``) and prints
some phases' own durations. A start-up passes milestones in this order, each found by the first line that
says it after the one before (:data:`MILESTONES`): the log's first line; loading the model starts; the
weights are loaded; the model is compiled (or loaded from vLLM's compile cache); the KV cache is sized
(after the profiling run); CUDA graphs are captured; the engine is ready; the API server serves. A phase
runs from one milestone found to the next found (:data:`PHASES` names it by the milestone it ends at), its
seconds the difference of the two lines' stamps (so a phase is known to about a second). Where vLLM prints
the phase's own duration (weights, compile, graph capture), that figure is kept beside it, with its line.

With the trial's launch-to-ready time, what the log cannot show is added first: ``before the log``, from
the launch to the log's first line (Python's imports), as ready time less the log's span. A milestone the
log does not have (an eager server compiles nothing; a CPU server captures no graphs) leaves its phase
out, its time counted in the next phase found.

The compile cache's part (:func:`compile_cache`): loaded from the cache, compiled and saved to it,
compiled because the cache could not be loaded (with vLLM's reason), or nothing compiled.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from llmtrial.core.configuration_model import StartupPhase
from llmtrial.logs.engine_warnings import WARNINGS
from llmtrial.logs.lines import LogLine, log_lines

_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(\d\d)-(\d\d)\s+(\d\d):(\d\d):(\d\d)\b")


@dataclass(frozen=True)
class Milestone:
    """A point a start-up passes: the phase ending there, the line that says it, and the line that prints the
    phase's own duration (its first group, in seconds), if vLLM prints one."""

    phase: str
    regex: re.Pattern[str]
    logged: re.Pattern[str] | None = None
    #: Where several lines say it (each worker compiles; one line per graph size), the last before the next
    #: milestone ends the phase.
    last: bool = False


#: The milestones in start-up order (vLLM 0.6 to 0.32, GPU and CPU builds).
MILESTONES: tuple[Milestone, ...] = (
    Milestone("process start", re.compile(r"Starting to load model")),
    Milestone("weights", re.compile(r"Model loading took|Loading weights took|Loading model weights took"),
              re.compile(r"(?:Model loading took [\d.]+ ?Gi?B(?: memory)? and|Loading weights took|"
                         r"Loading model weights took [\d.]+ ?Gi?B and) ([\d.]+) ?s")),
    Milestone("compile", re.compile(r"torch\.compile (?:takes|took) [\d.]+ s in total|saved AOT compiled function|"
                                    r"Directly load (?:the compiled graph|AOT compilation)|"
                                    r"Compiling a graph for (?:dynamic|general) shape takes"),
              re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total"), last=True),
    Milestone("profiling and KV allocation", re.compile(r"(?:GPU|CPU) KV cache size:|# (?:GPU|CPU|cuda) blocks:"),
              re.compile(r"Memory profiling takes ([\d.]+) seconds")),
    Milestone("graph capture", re.compile(r"Graph capturing finished in"),
              re.compile(r"Graph capturing finished in ([\d.]+) secs?")),
    Milestone("engine warm-up", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    Milestone("API server start", re.compile(r"Starting vLLM (?:API )?server on|Application startup complete|"
                                             r"Uvicorn running on")),
)
PHASES = ("before the log", *(m.phase for m in MILESTONES))


def stamp(line: LogLine, year: int = 2000) -> datetime.datetime | None:
    """The second a vLLM line was written (its month, day and time; ``year`` stands in for the one it omits)."""
    m = _STAMP.search(line.text)
    if m is None:
        return None
    month, day, hour, minute, second = map(int, m.groups())
    try:
        return datetime.datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None


def _first(lines: list[LogLine], start: int, regex: re.Pattern[str]) -> int | None:
    """The index of the first stamped line from ``start`` on that ``regex`` finds in, or None."""
    return next((i for i in range(start, len(lines)) if regex.search(lines[i].message) and stamp(lines[i])), None)


def _seconds(a: datetime.datetime, b: datetime.datetime) -> float:
    delta = (b - a).total_seconds()
    return delta + 366 * 86400 if delta < 0 else delta  # a start-up over the new year


def _logged(lines: list[LogLine], start: int, end: int, m: Milestone, source: str) -> tuple[float | None, str | None]:
    if m.logged is None:
        return None, None
    for i in range(start, end + 1):
        found = m.logged.search(lines[i].message)
        if found:
            return float(found.group(1)), f"{source}:{lines[i].number}"
    return None, None


def startup_phases(text: str, source: str = "server.log", ready_seconds: float | None = None) -> list[StartupPhase]:
    """The phases of the start-up the log ``text`` (read from ``source``) shows (module docstring); ``ready_seconds``:
    the trial's launch-to-ready time, for the phase before the log. None found: an empty list."""
    lines = log_lines(text)
    first = next((i for i, ln in enumerate(lines) if stamp(ln)), None)
    if first is None:
        return []
    found: list[tuple[Milestone, int]] = []
    at = first
    for k, m in enumerate(MILESTONES):
        i = _first(lines, at, m.regex)
        if i is None:
            continue
        if m.last:
            later = [j for n in MILESTONES[k + 1:] if (j := _first(lines, i + 1, n.regex)) is not None]
            i = max(j for j in range(i, min(later, default=len(lines))) if m.regex.search(lines[j].message)
                    and stamp(lines[j]))
        found.append((m, i))
        at = i + 1
    out, prev = [], first
    for m, i in found:
        logged, logged_source = _logged(lines, prev, i, m, source)
        begins_inside = prev == first and bool(m.regex.search(lines[first].message))  # an excerpt, from mid-phase
        seconds = None if begins_inside else _seconds(stamp(lines[prev]), stamp(lines[i]))
        out.append(StartupPhase(name=m.phase, seconds=seconds,
                                source=f"{source}:{lines[i].number}", logged_seconds=logged,
                                logged_source=logged_source))
        prev = i
    span = _seconds(stamp(lines[first]), stamp(lines[prev]))
    if ready_seconds is not None and found and ready_seconds >= span:
        out.insert(0, StartupPhase(name="before the log", seconds=round(ready_seconds - span, 3),
                                   source=f"launch to {source}:{lines[first].number} (ready time less the log's span)",
                                   logged_seconds=None, logged_source=None))
    return out


_LOADED = re.compile(r"Directly load (?:the compiled graph|AOT compilation)")
_FAILED = next(w.regex for w in WARNINGS if w.name == "compile_cache_load_failure")  # the engine warning's own
_SAVED = re.compile(r"saved AOT compiled function|torch\.compile (?:takes|took) [\d.]+ s in total|Dynamo bytecode transform time")


def compile_cache(text: str) -> str:
    """What the start-up did with vLLM's compile cache, in words (module docstring)."""
    lines = log_lines(text)
    failed = next((m for ln in lines if (m := _FAILED.search(ln.message))), None)
    if failed:
        return f"compiled again: the cache could not be loaded ({failed['why']})"
    if any(_LOADED.search(ln.message) for ln in lines):
        return "loaded from vLLM's compile cache"
    if any(_SAVED.search(ln.message) for ln in lines):
        return "compiled, and saved to vLLM's compile cache"
    return "nothing compiled (eager, or the log does not say)"
