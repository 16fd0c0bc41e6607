"""Logging for one workflow job or command: everything to one log file, with timestamps."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

#: The logger whose records a person watching the run sees on the terminal as well as in the
#: job's log: a configuration's phases (llmtrial.serve.progress), the steps of the other stages.
PROGRESS = "llmtrial.progress"


class CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to whatever ``sys.stderr`` is when a record is emitted, not the
    stream it was when logging was set up: a command run in-process (a test, a notebook) whose
    stderr is replaced afterwards still logs, and never to a stream closed since."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def open_job_log(path: str | Path | None, level: int = logging.INFO, echo: tuple[str, ...] = ()) -> None:
    """Send the ``logging`` records (and anything printed to stderr) to ``path``.

    With ``path`` None, log to stderr only (the command line). Records of :data:`PROGRESS` and
    of the loggers named in ``echo`` also go to the terminal the workflow runs in (progress of a
    long step).
    """
    handlers: list[logging.Handler]
    if path is not None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        stream = open(p, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - the job's log for the rest of the process
        sys.stderr = stream
        handlers = [logging.StreamHandler(stream)]
    else:
        handlers = [CurrentStderr()]
    logging.basicConfig(level=level, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in (PROGRESS, *echo) if path is not None else ():
        terminal = logging.StreamHandler(sys.__stderr__)
        terminal.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logging.getLogger(name).addHandler(terminal)
