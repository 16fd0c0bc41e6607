"""Units, stated once: the binary byte multiples every part of the library counts in, and a byte
count written for people."""

from __future__ import annotations

__all__ = ["GiB", "KiB", "MiB", "human_bytes"]

KiB = 2**10
MiB = 2**20
GiB = 2**30


def human_bytes(value: float) -> str:
    """A byte count for people: 1,023 B, 1.50 KiB, ... TiB."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < KiB or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.2f} {unit}"
        size /= KiB
    return f"{value} B"
