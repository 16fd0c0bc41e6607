"""The trial ledger: an append-only record of every change a trial makes to the host.

Each entry is written (flushed and fsynced) *before* the change it describes, with what
is needed to undo it, so cleanup can restore the host from the ledger alone after a
crash or ``kill -9``. One JSON object per line; a line torn by a crash is skipped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class Ledger:
    """Append-only JSON-lines file at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, action: str, **data: Any) -> dict[str, Any]:
        entry = {"t": time.time(), "action": action, **data}
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
        for raw in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                continue  # a line torn by a crash mid-write
        return out
