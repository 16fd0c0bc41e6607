"""A staged model's manifest: every file with its size and sha256, built and checked.

The model stage writes the manifest (:data:`MANIFEST_NAME`, hidden inside the staged
folder) so later stages and the report can say exactly which bytes were served; the trial
checks it before serving, and the weights policy checks an archive against it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmtrial.core.fileio import sha256_file
from llmtrial.core.record_models import ManifestFile, ManifestRecord
from llmtrial.core.records import load_record
from llmtrial.core.units import MiB

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST_NAME", "visible_files", "build_manifest", "read_manifest", "require_staged", "verify_manifest"]

#: Name of the manifest that :func:`stage_model` writes inside a staged folder. Hidden,
#: so :func:`build_manifest` does not list it.
MANIFEST_NAME = ".llmtrial-manifest.json"


def read_manifest(path: Path) -> ManifestRecord | None:
    """The manifest at ``path`` (a staged or archived folder's :data:`MANIFEST_NAME`) as its model; None,
    logged, when it is missing, unreadable or not a manifest."""
    try:
        return load_record(path, "manifest")
    except (OSError, ValueError) as exc:
        logger.info("ignoring manifest %s: %s", path, exc)
        return None


def visible_files(root: Path) -> Iterator[Path]:
    """Regular files under ``root``, sorted, skipping hidden files and folders."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            file = Path(dirpath) / name
            if file.is_file():
                yield file


def build_manifest(model_dir: Path, *, source: Mapping[str, Any], **parts: Any) -> ManifestRecord:
    """Describe every file of ``model_dir``: relative POSIX path, size and sha256.

    Files are listed sorted by path; hidden files and folders are skipped. Returns the
    manifest ``{"model_dir", "source", "files": [{"path", "size", "sha256"}, ...],
    "total_bytes", "created"}`` with ``created`` an ISO-8601 UTC timestamp, and ``parts``
    (a tiny model's ``generator``).
    """
    root = Path(model_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"model folder not found: {root}")
    started = time.monotonic()
    paths = sorted(visible_files(root), key=lambda f: f.relative_to(root).as_posix())
    logger.info("hashing %d files in %s", len(paths), root)
    files = [ManifestFile(path=file.relative_to(root).as_posix(), size=file.stat().st_size, sha256=sha256_file(file))
             for file in paths]
    total = sum(entry.size for entry in files)
    logger.info(
        "hashed %d files (%.1f MiB) in %s: done in %.1f s",
        len(files), total / MiB, root, time.monotonic() - started,
    )
    return ManifestRecord(model_dir=str(root), source=dict(source), files=files, total_bytes=total,
                          created=datetime.now(UTC).isoformat(timespec="seconds"), **parts)


def verify_manifest(manifest: ManifestRecord | Mapping[str, Any], *, hashes: bool = True) -> list[str]:
    """Check the files a manifest (the model, or its JSON) lists; return the problems found, empty if none.

    Each problem is one readable line naming the file: missing, size mismatch or
    sha256 mismatch (hashes are only compared when sizes agree, and with ``hashes``).
    """
    if isinstance(manifest, ManifestRecord):
        manifest = manifest.model_dump(mode="json")
    problems: list[str] = []
    try:
        root = Path(manifest["model_dir"])
        entries = list(manifest["files"])
    except (KeyError, TypeError):
        return ["manifest lacks 'model_dir' or 'files'"]
    if not root.is_dir():
        return [f"model folder {root} is missing"]
    for entry in entries:
        rel = entry.get("path", "?")
        file = root / rel
        if not file.is_file():
            problems.append(f"{rel}: missing (expected at {file})")
            continue
        size = file.stat().st_size
        if size != entry.get("size"):
            problems.append(f"{rel}: size {size} bytes, manifest says {entry.get('size')}")
            continue
        if not hashes:
            continue
        digest = sha256_file(file)
        if digest != entry.get("sha256"):
            problems.append(f"{rel}: sha256 {digest}, manifest says {entry.get('sha256')}")
    return problems


def require_staged(manifest: ManifestRecord) -> None:
    """FileNotFoundError, naming the first files at fault and how to restage, when a file the manifest lists
    is missing or of another size (a configuration's job checks this before it serves)."""
    missing = verify_manifest(manifest, hashes=False)
    if missing:
        raise FileNotFoundError(
            f"the staged model is not all there ({'; '.join(missing[:3])}): a finished trial's cleanup archives "
            "or deletes it when model.weights.after says so; restage it with `snakemake --forcerun stage_model`")
