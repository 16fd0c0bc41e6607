"""A crash's signature: what was raised, where in vLLM, and in which start-up phase.

Two failed configurations fail "the same way" when their signatures are equal: the exception type
as the log prints it, its message with the numbers masked (:func:`mask`), the innermost frame in
the vLLM package and the phase it happened in. Each part is read from the log and is ``None``
where the log does not show it, never guessed.

The crash is the first exception line (``Type: message``) that is not a mere wrapper ("Engine core
initialization failed. See root cause above"); without one, the first traceback. Its frames are
those above it, or, where vLLM logs the exception before its traceback, the traceback the same
process prints right after it. The phase (:data:`PHASES`, :mod:`llmtrial.logs.phases`) comes from the
innermost vLLM frame that tells one (the function, or the call on its code line), or, where its own frames
tell none (a bare ``TimeoutError`` of the message queue), from the traceback it is chained to ("The above
exception was the direct cause of ..."): where it was being handled; where none does, from vLLM's own lines
before the crash: a check that names its phase, the method a V0 worker names, or the last
start-up line (after "Model loading took" comes profiling, after "Available KV cache memory" the KV
allocation, and so on). Frames win over lines: they are where it was.

:func:`failure_signature` reads one log, or every rank's log (a list), taking the rank that
crashed first (by the time on its crash line, else the first in the list).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmtrial.core.configuration_model import CrashFrame, Phase, Signature
from llmtrial.logs.failures import FRAME, OOM_LINE, TRACEBACK, WRAPPER
from llmtrial.logs.lines import LogLine, log_lines
from llmtrial.logs.phases import COMPILE_FUNCTIONS, PHASES, line_phase, phase_of_function, vllm_path

__all__ = ["PHASES", "FailureSignature", "Phase", "failure_signature", "mask", "phase_of_function",
           "signature_of_lines", "signature_record"]


_HEX = re.compile(r"0x[0-9A-Fa-f]+")
_NUMBER = re.compile(r"\d+(?:\.\d+)*")


def mask(message: str) -> str:
    """``message`` with every ``0x`` hexadecimal as ``<HEX>`` and every run of digits (decimals and
    dotted versions included) as ``<N>``; the rest verbatim."""
    return _NUMBER.sub("<N>", _HEX.sub("<HEX>", message))


@dataclass(frozen=True)
class FailureSignature:
    """How a server crashed, read from its log.

    ``exception`` and ``message`` (masked) come from the exception line, ``None`` where the log prints
    none; ``frame`` is the innermost vLLM frame of its traceback; ``phase`` the start-up phase the
    log shows. The evidence is kept as 0-based indices of :func:`llmtrial.logs.lines.log_lines`:
    ``crash_index`` (the exception line, else the traceback's first line), ``frame_index`` and
    ``phase_index`` (the line that shows the phase). ``out_of_memory``: the crash is a device
    out-of-memory error, in any wording the failure catalogue knows (on the exception line, or, without
    one, on the lines vLLM prints just before the traceback). ``log`` is the position of the log in the
    list it was read from (0 for a single log).
    """

    exception: str | None
    message: str | None
    frame: CrashFrame | None
    phase: Phase | None
    crash_index: int
    frame_index: int | None = None
    phase_index: int | None = None
    out_of_memory: bool = False
    log: int = 0

    @property
    def crash_line(self) -> int:
        """The 1-based line of the crash (as ``sed -n Np`` counts)."""
        return self.crash_index + 1

    @property
    def phase_line(self) -> int | None:
        """The 1-based line that shows the phase, or ``None`` without a phase."""
        return None if self.phase_index is None else self.phase_index + 1


# ------------------------------------------------------------------ the crash and its traceback

#: An exception line: ``Type: message`` (a type ending in Error or Exception, or a module-qualified class
#: such as ``triton.runtime.errors.OutOfResources``), at the start of the message or after a logger's
#: ``[file:line]`` the line's prefix was not told from. NCCL's ``ncclSystemError:`` is no Python type.
_EXCEPTION_LINE = re.compile(
    r"(?:^|(?<=\]\s))(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)|(?:[a-z_]\w*\.)+[A-Z]\w*)"
    r"(?::\s+(?P<message>.*)|:?$)")
#: Where Python chains one exception to the next.
_CHAIN = re.compile(r"The above exception was the direct cause|During handling of the above exception")
#: A call on a traceback's code line (``self.worker.init_device()``), or a function taken from a table
#: (``self._funcs["ncclCommInitRank"](...)``).
_CALL = re.compile(r"\b(\w+)\s*\(|\[\"(\w+)\"\]")


@dataclass(frozen=True)
class _Shown:
    """A frame line of a traceback (``index``), with the 0-based index of its code line, if shown."""

    index: int
    file: str
    function: str
    line: int
    code: int | None


def _exception(line: LogLine) -> re.Match[str] | None:
    return _EXCEPTION_LINE.search(line.message) if line.text else None


def _other_process(line: LogLine, of: LogLine) -> bool:
    """``line`` names a process other than the one ``of`` names (a line naming none may be either)."""
    return line.pid is not None and of.pid is not None and (line.process, line.pid) != (of.process, of.pid)


def _frame_at(lines: list[LogLine], i: int) -> tuple[re.Match[str] | None, int]:
    """The frame on line ``i`` (rejoined where a terminal wrapped it) and the index of its last line."""
    m = FRAME.search(lines[i].text)
    if m is not None or 'File "' not in lines[i].text:
        return m, i
    joined = lines[i].message
    for j in range(i + 1, min(i + 4, len(lines))):
        if lines[j].prefixed or not lines[j].text:
            break
        joined += lines[j].text
        m = FRAME.search(joined)
        if m is not None:
            return m, j
    return None, i


def _code_line(lines: list[LogLine], j: int, stop: int, of: LogLine) -> int | None:
    """The code line a traceback shows under a frame: the next non-empty line of the process from ``j``."""
    for k in range(j, min(stop, len(lines))):
        line = lines[k]
        if not line.text or _other_process(line, of):
            continue
        if 'File "' in line.text or _exception(line) is not None or TRACEBACK.search(line.text):
            return None
        return k
    return None


def _frames_in(lines: list[LogLine], start: int, stop: int, of: LogLine) -> list[_Shown]:
    """The frames between ``start`` and ``stop`` printed by the process of ``of``, outermost first."""
    frames: list[_Shown] = []
    i = start
    while i < stop:
        m, last = (None, i) if _other_process(lines[i], of) else _frame_at(lines, i)
        if m is not None:
            code = _code_line(lines, last + 1, stop, of)
            frames.append(_Shown(i, m["file"], m["func"], int(m["line"]), code))
        i = last + 1
    return frames


def _frames_after(lines: list[LogLine], t: int) -> list[_Shown]:
    """The frames of the traceback whose ``Traceback`` line is ``t``, up to its exception line."""
    stop = min(len(lines), t + 400)
    end = next((k for k in range(t + 1, stop) if not _other_process(lines[k], lines[t])
                and (_exception(lines[k]) is not None or TRACEBACK.search(lines[k].text))), stop)
    return _frames_in(lines, t + 1, end, lines[t])


def _exception_frames(lines: list[LogLine], e: int) -> list[_Shown]:
    """The frames of the exception on line ``e``: those above it back to its ``Traceback`` line, else
    those of the traceback the same process prints right after it (vLLM logs the error first)."""
    top = max(0, e - 400)
    for k in range(e - 1, top - 1, -1):
        line = lines[k]
        if _other_process(line, lines[e]):
            continue
        if TRACEBACK.search(line.text) or _CHAIN.search(line.text) or _exception(line) is not None:
            top = k + 1
            break
    frames = _frames_in(lines, top, e, lines[e])
    if frames:
        return frames
    for t in range(e + 1, min(len(lines), e + 11)):
        line = lines[t]
        if (line.process, line.pid) == (lines[e].process, lines[e].pid):
            if TRACEBACK.search(line.text):
                return _frames_after(lines, t)
            if _exception(line) is not None or 'File "' in line.text:
                break
    return []


def _chained_frames(lines: list[LogLine], e: int) -> list[_Shown]:
    """The frames of the traceback the same process chains right after the exception on line ``e`` ("The above
    exception was the direct cause of the following exception"): where the exception was being handled."""
    chained = False
    for t in range(e + 1, min(len(lines), e + 8)):
        line = lines[t]
        if _other_process(line, lines[e]):
            continue
        chained = chained or bool(_CHAIN.search(line.text))
        if chained and TRACEBACK.search(line.text):
            return _frames_after(lines, t)
    return []


def _innermost(frames: list[_Shown]) -> tuple[CrashFrame | None, int | None]:
    for shown in reversed(frames):
        path = vllm_path(shown.file)
        if path is not None:
            return CrashFrame(file=path, function=shown.function, line=shown.line), shown.index
    return None, None


def _frame_phase(lines: list[LogLine], frames: list[_Shown]) -> tuple[Phase, int] | None:
    """The phase of the innermost frame that tells one: a vLLM function, the call on its code line,
    or torch compiling; with the index of that line."""
    for shown in reversed(frames):
        path = vllm_path(shown.file)
        if path is None:
            compiling = shown.function in COMPILE_FUNCTIONS and re.search(r"torch/_(?:dynamo|inductor)/", shown.file)
            if compiling:
                return "graph_capture_compile", shown.index
            continue
        phase = phase_of_function(shown.function, path)
        if phase is not None:
            return phase, shown.index
        if shown.code is not None:
            for called in _CALL.findall(lines[shown.code].message):
                phase = phase_of_function(called[0] or called[1], path)
                if phase is not None:
                    return phase, shown.code
    return None


def _lines_phase(lines: list[LogLine], crash: int) -> tuple[Phase, int] | None:
    """The phase the last of vLLM's phase lines up to the crash shows, with its index."""
    for k in range(crash, -1, -1):
        phase = line_phase(lines[k])
        if phase is not None:
            return phase, k
    return None


def _crash(lines: list[LogLine]) -> tuple[int, re.Match[str] | None] | None:
    """The crash: the first exception line that is no mere wrapper, else the first traceback, else the
    first wrapper; ``None`` when the log shows neither an exception line nor a traceback."""
    wrapper = None
    for i, line in enumerate(lines):
        m = _exception(line)
        if m is not None and not WRAPPER.search(line.text):
            return i, m
        if m is not None and wrapper is None:
            wrapper = (i, m)
    first = next((i for i, line in enumerate(lines) if line.text and TRACEBACK.search(line.text)), None)
    return (first, None) if first is not None else wrapper


def signature_of_lines(lines: list[LogLine]) -> FailureSignature | None:
    """The signature of the crash that ``lines`` (of :func:`llmtrial.logs.lines.log_lines`) show, or
    ``None`` when they show no exception line and no traceback."""
    crash = _crash(lines)
    if crash is None:
        return None
    i, m = crash
    frames = _exception_frames(lines, i) if m is not None else _frames_after(lines, i)
    frame, frame_index = _innermost(frames)
    phase, phase_index = (_frame_phase(lines, frames) or (m is not None and _frame_phase(lines, _chained_frames(lines, i)))
                          or _lines_phase(lines, i) or (None, None))
    said = [lines[i]] if m is not None else lines[max(0, i - 3):i + 1]
    return FailureSignature(
        exception=m["type"] if m is not None else None,
        message=mask(m["message"] or "") if m is not None else None,
        frame=frame, phase=phase, crash_index=i, frame_index=frame_index, phase_index=phase_index,
        out_of_memory=any(OOM_LINE.search(line.text) for line in said),
    )


# ------------------------------------------------------------------ one log or every rank's

#: A log line's time: vLLM's ``MM-DD HH:MM:SS`` (a year in front where a collector adds one).
_TIME = re.compile(r"\b(?:\d{4}-)?(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")


def _crash_time(lines: list[LogLine], crash: int) -> tuple[float, ...] | None:
    """When the crash on line ``crash`` was logged: the time on it or the nearest line above it."""
    for line in reversed(lines[max(0, crash - 50):crash + 1]):
        m = _TIME.search(line.text)
        if m is not None:
            month, day, hour, minute, second, fraction = m.groups(default="0")
            return int(month), int(day), int(hour), int(minute), int(second), float(f"0.{fraction}")
    return None


def failure_signature(log: str | Sequence[str]) -> FailureSignature | None:
    """The signature of the crash a vLLM log shows, or ``None`` when it shows none.

    ``log`` is one log's text, or every rank's (node's) log: then the rank that crashed first, by the
    time logged on its crash line where every crashed rank's log has one, else the first in the list
    that crashed; its position is the signature's ``log``.
    """
    texts = [log] if isinstance(log, str) else list(log)
    found: list[tuple[FailureSignature, tuple[float, ...] | None]] = []
    for n, text in enumerate(texts):
        lines = log_lines(text)
        sig = signature_of_lines(lines)
        if sig is not None:
            found.append((replace(sig, log=n), _crash_time(lines, sig.crash_index)))
    if not found:
        return None
    times = [t for _, t in found if t is not None]
    if len(times) == len(found):
        return min(found, key=lambda f: f[1] or ())[0]
    return found[0][0]


def signature_record(logs: Sequence[tuple[str, str]]) -> Signature | None:
    """The record's signature of the crash that every rank's log shows (``logs``: (source, text) pairs,
    the server's first), or ``None`` when none shows one."""
    sig = failure_signature([text for _, text in logs])
    if sig is None:
        return None
    return Signature(exception=sig.exception, message=sig.message, frame=sig.frame, phase=sig.phase,
                     out_of_memory=sig.out_of_memory, source=logs[sig.log][0], crash_line=sig.crash_line,
                     phase_line=sig.phase_line)
