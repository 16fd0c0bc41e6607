"""The shape of one preflight check, shared by the host's preflight (:mod:`llmtrial.preflight`),
the cross-node preflight (:mod:`llmtrial.crossnode`) and the plans (:mod:`llmtrial.plan`).

It sits apart from both preflights so that :mod:`llmtrial.preflight` can run the cross-node
checks without the two importing each other.
"""

from __future__ import annotations

from typing import Any

from llmtrial.disk import GiB

__all__ = ["MIN_SHM_BYTES", "check"]

#: The smallest ``/dev/shm`` a host of a trial should have.
MIN_SHM_BYTES = 1 * GiB


def check(name: str, status: str, detail: str, **data: Any) -> dict[str, Any]:
    """One check's outcome: ``ok``, ``warn``, ``fail`` or ``skip``, with what was seen."""
    return {"name": name, "status": status, "detail": detail, **data}
