"""The trial ledger: an append-only record of every change a trial makes to the host.

Each entry is written (flushed and fsynced) *before* the change it describes, with what
is needed to undo it, so cleanup can restore the host from the ledger alone after a
crash or ``kill -9``. One JSON object per line; a line torn by a crash is skipped.

Every entry carries ``run`` (the workflow invocation that wrote it: the workflow sets
``LLMTRIAL_RUN`` once per snakemake invocation, and its jobs inherit it) and its own
``id``. An entry that undoes a change names it: ``undoes`` holds the change's id (or a
list of ids), so undo is matched change by change, never by name across runs. Entries
of a ledger written before runs had ids read as one earlier run (``run`` ``earlier``);
their undo entries name no id and are matched by a key of the change (its service, file,
folder or process group) instead.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Iterable

#: The environment variable that names the current run; the workflow sets it once per invocation.
RUN_ENV = "LLMTRIAL_RUN"
#: The run of entries written before runs had ids.
EARLIER_RUN = "earlier"


def new_run_id() -> str:
    """A run id: the local start time and a random suffix (sortable, unique enough)."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


_PROCESS_RUN = new_run_id()


def current_run() -> str:
    """The run this process belongs to: ``LLMTRIAL_RUN`` when set (a workflow invocation and
    its jobs), else one id for this process (the command line's own cleanup, a test)."""
    return os.environ.get(RUN_ENV) or _PROCESS_RUN


class Ledger:
    """Append-only JSON-lines file at ``path``; entries written here carry ``run``."""

    def __init__(self, path: str | os.PathLike[str], run: str | None = None) -> None:
        self.path = Path(path)
        self.run = run or current_run()

    def append(self, action: str, **data: Any) -> dict[str, Any]:
        entry = {"t": time.time(), "action": action, "run": self.run, "id": secrets.token_hex(8), **data}
        line = (json.dumps(entry, default=str) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write with O_APPEND: concurrent jobs do not interleave
            os.fsync(fd)
        finally:
            os.close(fd)
        return entry

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for i, raw in enumerate(self.path.read_text(encoding="utf-8").splitlines()):
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line torn by a crash mid-write
            entry.setdefault("run", EARLIER_RUN)
            entry.setdefault("id", f"line-{i + 1}")
            out.append(entry)
        return out


def undone_ids(entry: dict[str, Any]) -> list[str]:
    """The ids an undo entry names (none for an entry of an old-format ledger)."""
    ids = entry.get("undoes")
    if ids is None:
        return []
    return [ids] if isinstance(ids, str) else list(ids)


def match_undos(entries: Iterable[dict[str, Any]], is_change: Callable[[dict[str, Any]], bool],
                is_undo: Callable[[dict[str, Any]], bool],
                key: Callable[[dict[str, Any]], Any]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Pair each change with the entry that undid it, in ledger order.

    Returns ``(outstanding, undone)``: the changes no entry has undone (by id, in order) and,
    per undone change's id, the entry that undid it. An undo entry of an old-format ledger
    (no run, no ids) undoes every outstanding change with the same ``key``; any other entry
    undoes only the ids it names."""
    outstanding: dict[str, dict[str, Any]] = {}
    undone: dict[str, dict[str, Any]] = {}
    for e in entries:
        if is_change(e):
            outstanding[e["id"]] = e
        elif is_undo(e):
            legacy = "undoes" not in e and e.get("run") == EARLIER_RUN
            ids = [i for i, c in outstanding.items() if key(c) == key(e)] if legacy else undone_ids(e)
            for i in ids:
                if i in outstanding:
                    outstanding.pop(i)
                    undone[i] = e
    return outstanding, undone
