"""Two file routines the whole library shares: hashing a file and writing one atomically.

Every sha256 of a file (a staged model's manifest, a Hub file's verification, a copy into
the archive, a patched file against vLLM's RECORD) is read through :func:`file_digest`, and
every file the library writes for another stage or a later run (records, manifests, the
verified-files memory, the report, a patched vLLM file) goes through
:func:`atomic_write_bytes`: a temporary file beside the target, fsync, rename. A reader
sees the old file or the new one, never a short one.

This module imports nothing from llmtrial, so every other module may use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from llmtrial.core.units import MiB

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = ["CHUNK", "file_digest", "sha256_file", "atomic_write_bytes", "atomic_write_text", "sibling_dir", "replace_dir"]

#: Files are read in 1 MiB chunks.
CHUNK = MiB


def file_digest(path: str | os.PathLike[str], *, also: Sequence[_Hash] = (), copy_to: IO[bytes] | None = None) -> _Hash:
    """The sha256 of the file at ``path`` (a ``hashlib`` object), reading it once.

    Each chunk also updates the hashes in ``also`` (a git blob sha1, say) and is written to
    ``copy_to`` when given, so a copy is hashed from the bytes it was made of.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            for other in also:
                other.update(chunk)
            if copy_to is not None:
                copy_to.write(chunk)
    return digest


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the file at ``path``."""
    return file_digest(path).hexdigest()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None,
                       owner: tuple[int, int] | None = None) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file beside it (same filesystem),
    fsync, then rename over the target. ``mode`` and ``owner`` (uid, gid) are set on the
    temporary file first when given (else it gets 0o666 less the umask, as a plain ``open``
    would give it); an owner that cannot be set (not root) is left as is.
    The parent folder is created; on any failure the temporary file is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    # 0o666 less the umask, as a plain open() would create it (mkstemp would make it 0600)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if owner is not None and owner != (os.getuid(), os.getgid()):
            with contextlib.suppress(PermissionError):
                os.chown(tmp, *owner)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def sibling_dir(dest: Path, tag: str) -> Path:
    """A fresh hidden folder next to ``dest`` (same filesystem, so rename is atomic)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.{tag}-", dir=dest.parent))


def replace_dir(new: Path, dest: Path) -> None:
    """Move the complete folder ``new`` to ``dest``, replacing any existing ``dest``."""
    if dest.exists() or dest.is_symlink():
        old = sibling_dir(dest, "old")
        old.rmdir()
        os.replace(dest, old)
        try:
            os.replace(new, dest)
        except BaseException:
            os.replace(old, dest)  # put the previous model back
            raise
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    else:
        os.replace(new, dest)
