"""Disk headroom: whether the filesystems a stage writes to keep their reserve.

Preflight checks the staging folder before anything is staged; the model stage checks
every filesystem it writes to (staging folder, Hugging Face cache, archive) with what is
still to fetch, before the first byte; the weights policy checks the archive before it
copies. Folders that share a filesystem are summed, so two folders on one disk must fit
together. The byte reserve defaults keep the kubelet's 10 % eviction threshold.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmtrial.core.preflight_model import Disk
from llmtrial.core.trial_config import DiskBlock
from llmtrial.core.units import GiB

logger = logging.getLogger(__name__)

__all__ = ["GiB", "HeadroomError", "Need", "disk_headroom", "headroom_by_filesystem", "headroom_message",
           "require_headroom"]


#: The reserve the model stage keeps when a trial names none.

#: What a stage needs on one folder: (role, path, bytes, files), such as
#: ("staging", folder, bytes to fetch, files to fetch).
Need = tuple[str, str | Path, int, int]


class HeadroomError(RuntimeError):
    """A filesystem the stage writes to would fall below its reserve."""


def disk_headroom(path: str | Path, needed_bytes: int, *, reserve_fraction: float, reserve_min_gib: float,
                  files: int = 0, reserve_inodes_fraction: float = 0.05) -> Disk:
    """Free space and inodes where ``path`` lives, against what staging needs plus the reserve.

    The byte reserve is the larger of ``reserve_fraction`` of the filesystem and
    ``reserve_min_gib``; the inode reserve is ``reserve_inodes_fraction`` of its inodes (the
    kubelet evicts at nodefs.inodesFree < 5 %) and at least 1000."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    st = os.statvfs(p)
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    reserve = max(int(reserve_fraction * total), int(reserve_min_gib * GiB))
    inodes_free, inodes_reserve = st.f_favail, max(int(reserve_inodes_fraction * st.f_files), 1000)
    bytes_ok = free - needed_bytes >= reserve
    inodes_ok = st.f_files == 0 or inodes_free - files >= inodes_reserve
    return Disk(path=str(p), device=os.stat(p).st_dev, total_bytes=total, free_bytes=free,
                needed_bytes=int(needed_bytes), reserve_bytes=reserve, inodes_free=inodes_free,
                inodes_reserve=inodes_reserve, files=files, ok=bytes_ok and inodes_ok,
                short_bytes=max(int(needed_bytes) + reserve - free, 0),
                short_inodes=0 if st.f_files == 0 else max(files + inodes_reserve - inodes_free, 0))


@dataclass
class _Filesystem:
    """The roles whose folders share one filesystem, and what they need there together."""

    roles: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    bytes: int = 0
    files: int = 0


def headroom_by_filesystem(needs: Sequence[Need], disk: DiskBlock) -> list[Disk]:
    """Headroom of every filesystem a stage writes to. ``needs`` holds (role, path, bytes,
    files) such as ("staging", dir, bytes to fetch, files to fetch); roles whose paths share a
    filesystem are summed, so two folders on one disk must fit together."""
    groups: dict[int | None, _Filesystem] = {}
    for role, path, needed, files in needs:
        probe = disk_headroom(path, 0, reserve_fraction=0, reserve_min_gib=0)
        group = groups.setdefault(probe.device, _Filesystem())
        group.roles.append(role)
        group.paths.append(str(path))
        group.bytes += int(needed)
        group.files += int(files)
    out = []
    for group in groups.values():
        fs = disk_headroom(group.paths[0], group.bytes, files=group.files,
                           reserve_fraction=float(disk.reserve_fraction), reserve_min_gib=float(disk.reserve_min_gib),
                           reserve_inodes_fraction=float(disk.reserve_inodes_fraction))
        fs.roles, fs.paths = group.roles, group.paths
        out.append(fs)
    return out


def headroom_message(fs: Disk, what: str = "staging") -> str:
    """One line naming the filesystem, what it must hold, the reserve, and what is free."""
    gib = lambda b: f"{b / GiB:,.2f} GiB ({b:,} bytes)"  # noqa: E731
    roles = "/".join(fs.roles or []) or what
    line = (f"{fs.path} ({roles}): needs {gib(fs.needed_bytes)} and must keep a reserve of "
            f"{gib(fs.reserve_bytes)}; {gib(fs.free_bytes)} free of {gib(fs.total_bytes)}")
    if fs.short_bytes:
        line += f"; short by {gib(fs.short_bytes)}"
    if fs.short_inodes:
        line += (f"; needs {fs.files:,} inodes and a reserve of {fs.inodes_reserve:,}, "
                 f"{fs.inodes_free:,} free (short by {fs.short_inodes:,})")
    return line


def require_headroom(needs: Sequence[Need], disk: DiskBlock | None, what: str) -> list[Disk]:
    """The headroom of every filesystem in ``needs`` (logged), or HeadroomError naming each
    filesystem that would fall below its reserve. ``disk`` holds the reserve settings
    (the trial file's defaults when None); ``what`` names what is being staged."""
    filesystems = headroom_by_filesystem(needs, disk or DiskBlock())
    short = [fs for fs in filesystems if not fs.ok]
    for fs in filesystems:
        logger.info("headroom %s", headroom_message(fs))
    if short:
        raise HeadroomError(f"not enough disk to stage {what}, nothing was written: "
                            + "; ".join(headroom_message(fs) for fs in short)
                            + "; free space or lower disk.reserve_* (the default keeps the kubelet's "
                            "10 % eviction threshold)")
    return filesystems
