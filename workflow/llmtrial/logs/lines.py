"""A vLLM server's log as lines: read, cleaned, their prefixes told apart from their message.

vLLM's log format changes between releases, and logs reach a reader through other tools. The
message may sit behind a logger prefix (``INFO 08-21 18:21:55 [kv_cache_utils.py:2235] ``), one
process prefix or two (``(EngineCore_DP0 pid=558)``, ``(Worker pid=7) (Worker_TP0 pid=770)``,
``(RayWorkerWrapper pid=9, ip=10.0.0.2)``), torch's ``[rank0]:``, a container runtime's
``vllm-1  | `` or a timestamp of the collector in front of it all. Lines may carry ANSI colour
codes and progress bars redrawn with ``\\r``, and a terminal may have wrapped a long message over
several lines. This module reads all of that; :mod:`llmtrial.logs.startup_log` (start-up figures) and
:mod:`llmtrial.logs.failures` (why a server died) read its lines.

Line numbers count ``\\n``-separated lines, as ``sed -n Np`` and editors do. Within a line,
carriage returns are resolved the way a terminal shows them: the last non-empty
``\\r``-separated segment is the line's text.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["EXCEPTION", "LogLine", "continued", "find_lines", "log_lines", "read_log", "spaced", "strip_ansi", "tail"]

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves (ESC [ ... final byte)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: ESC ] ... BEL or ESC \
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
)

#: One piece of what may stand in front of a message, tried again and again until none matches.
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
_PREFIX_PART = re.compile(
    r"(?P<process>\([^()]*\))\s+"  # (EngineCore_DP0 pid=558), (VllmWorker rank=5 pid=3073), (pid=9, ip=...)
    r"|\[rank\d+\]:\s?"  # torch.distributed's elastic prefix
    r"|[>|]\s+"  # a quoted or tabled paste
    r"|[A-Za-z0-9][\w.-]*\s+\|\s"  # docker compose: "vllm-1  | "
    r"|\S+\s+\d{1,2}\s+\d\d:\d\d:\d\d\s+\S+\s+[^\s\[]+\[\d+\]:\s"  # journald: "Aug 18 14:14:59 host python3[28145]: "
    r"|\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s+"  # a collector's timestamp
    rf"|-\s+[\w.]+\s+-\s+{_LEVEL}\s+-\s"  # Python logging's " - name - LEVEL - " after its timestamp
    rf"|{_LEVEL}:?\s+"  # vLLM's level, time and [file:line] (file:line] before 0.8)
    r"(?:(?:\d{4}-)?\d\d-\d\d\s+\d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?(?:\[[^\]]*\]\s*|[\w.]+:\d+\]\s*)?"
    r"|\[[\w.-]+\]\s+"  # a stage or framework tag: [decode], [Stage-0], [Error]
)
#: A process prefix names its process and pid: ``(Worker_TP0 pid=770)``.
#: A framework's one-word tag in parentheses: ``(Process)``.
_TAG = re.compile(r"^\(\w+\)$")
_PROCESS = re.compile(r"^\((?:(?P<process>[^\s(),=]+)\s+)?[^()]*?\bpid=(?P<pid>\d+)")


@dataclass(frozen=True)
class LogLine:
    """One line of a log as a terminal shows it.

    ``text`` is the whole line (ANSI removed, ``\\r`` resolved, stripped); ``message`` is what
    follows every prefix; ``process`` and ``pid`` name the innermost process prefix (the one
    nearest the message), or are None; ``prefixed`` says whether any prefix was there.
    """

    number: int
    text: str
    message: str
    process: str | None = None
    pid: int | None = None

    @property
    def prefixed(self) -> bool:
        return self.message != self.text


def read_log(path: str | os.PathLike[str]) -> str:
    """A log file's text with its line breaks as written.

    ``Path.read_text`` turns the ``\r`` of progress bars into line breaks, which would
    shift line numbers away from what ``sed -n Np`` shows; this keeps them.
    """
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        return fh.read()


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colours, cursor movement) from ``text``."""
    return _ANSI.sub("", text)


def _clean(raw: str, keep_indent: bool = False) -> str:
    """One raw log line as a terminal shows it: ANSI removed, ``\\r`` resolved, stripped
    (trailing whitespace only, with ``keep_indent``)."""
    segments = [s for s in strip_ansi(raw).split("\r") if s.strip()]
    if not segments:
        return ""
    return segments[-1].rstrip() if keep_indent else segments[-1].strip()


def _split(number: int, text: str) -> LogLine:
    """``text`` told into its prefixes and its message."""
    at, process, pid = 0, None, None
    while at < len(text):
        m = _PREFIX_PART.match(text, at)
        if m is None or m.end() == at:
            break
        if m["process"]:
            p = _PROCESS.match(m["process"])
            if p is not None:
                process, pid = p["process"], int(p["pid"])
            elif not _TAG.match(m["process"]):
                break  # a message that opens with parentheses, not a prefix
        at = m.end()
    return LogLine(number, text, text[at:].lstrip(), process, pid)


def log_lines(text: str) -> list[LogLine]:
    """Every line of ``text``, cleaned and split; index ``i`` is line number ``i + 1``."""
    return [_split(n, _clean(raw)) for n, raw in enumerate(text.split("\n"), start=1)]


#: A message that raises an exception of its own (``torch.OutOfMemoryError: ...``).
EXCEPTION = re.compile(r"^\w+(?:\.\w+)*(?:Error|Exception): ")


def continued(lines: list[LogLine], i: int, most: int = 8) -> str:
    """The message of line ``i`` with the lines a terminal wrapped it onto: the following lines
    that carry no prefix of their own, at most ``most``, joined without a separator (a wrap may
    fall inside a word or a number; patterns that read wrapped text allow any spacing). A line
    that starts an exception of its own (``RuntimeError: ...``) is never a continuation."""
    parts = [lines[i].message]
    for line in lines[i + 1:i + 1 + most]:
        if not line.text or line.prefixed or line.text.startswith(("Traceback", "File ")) or EXCEPTION.search(line.text):
            break
        parts.append(line.text)
    return "".join(parts)


def spaced(pattern: str) -> str:
    """``pattern`` with every literal space allowing any spacing, none included: the form in which a
    message :func:`continued` rejoined from a terminal's wrap still matches."""
    return pattern.replace(" ", r"\s*")


def find_lines(text: str, regex: re.Pattern[str], source: str = "server.log") -> list[dict[str, Any]]:
    """Every line where ``regex`` matches: the cleaned line, ``"<source>:<lineno>"`` and the
    vLLM process that logged it (``process`` and ``pid`` from the innermost prefix, or None)."""
    return [{"line": line.text, "source": f"{source}:{line.number}", "process": line.process, "pid": line.pid}
            for line in log_lines(text) if line.text and regex.search(line.text)]


def tail(text: str, n: int = 40) -> list[str]:
    """The last ``n`` non-empty lines of ``text``, ANSI-stripped (indentation kept)."""
    if n <= 0:
        return []
    lines = (_clean(raw, keep_indent=True) for raw in text.split("\n"))
    return [line for line in lines if line][-n:]
