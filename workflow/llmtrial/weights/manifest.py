"""A staged model's manifest: every file with its size and sha256, built and checked.

The model stage writes the manifest (:data:`MANIFEST_NAME`, hidden inside the staged
folder) so later stages and the report can say exactly which bytes were served; the trial
checks it before serving, and the weights policy checks an archive against it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmtrial.core.fileio import sha256_file
from llmtrial.core.record_models import ManifestFile, ManifestRecord
from llmtrial.core.records import load_record
from llmtrial.core.trial_config import SourceBlock
from llmtrial.core.units import MiB

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST_NAME", "visible_files", "build_manifest", "new_manifest", "read_manifest", "recorded_source", "require_staged",
           "same_source",
           "verify_files", "verify_manifest"]

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


def recorded_source(manifest: ManifestRecord) -> SourceBlock | None:
    """The source ``manifest`` records, as the trial file's block (its defaults filled); None when it is not one."""
    try:
        return SourceBlock.model_validate(manifest.source)
    except ValidationError:
        return None


def same_source(manifest: ManifestRecord, source: SourceBlock) -> bool:
    """Whether ``manifest`` records the source ``source`` (with the trial file's defaults filled on both sides)."""
    recorded = recorded_source(manifest)
    return recorded is not None and recorded.model_dump() == source.model_dump()


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


def build_manifest(model_dir: Path, *, source: SourceBlock, **parts: Any) -> ManifestRecord:
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
    return new_manifest(root, source, files, **parts)


def new_manifest(model_dir: Path, source: SourceBlock, files: list[ManifestFile], **parts: Any) -> ManifestRecord:
    """The manifest of ``files`` in ``model_dir`` staged from ``source`` (its keys sorted, as the record holds
    it), made now, with ``parts`` (a tiny model's ``generator``, a Hub source's ``hub`` and ``fetch``, ...)."""
    recorded = json.loads(json.dumps(source.model_dump(mode="json"), sort_keys=True))
    return ManifestRecord(model_dir=str(model_dir), source=recorded, files=files, total_bytes=sum(f.size for f in files),
                          created=datetime.now(UTC).isoformat(timespec="seconds"), **parts)


def verify_files(root: Path, files: Sequence[ManifestFile], *, hashes: bool = True) -> list[str]:
    """Check ``files`` (a manifest's entries) in the folder ``root``; return the problems found, empty if none.

    Each problem is one readable line naming the file: missing, size mismatch or
    sha256 mismatch (hashes are only compared when sizes agree, and with ``hashes``).
    """
    if not root.is_dir():
        return [f"model folder {root} is missing"]
    problems: list[str] = []
    for entry in files:
        file = root / entry.path
        if not file.is_file():
            problems.append(f"{entry.path}: missing (expected at {file})")
            continue
        size = file.stat().st_size
        if size != entry.size:
            problems.append(f"{entry.path}: size {size} bytes, manifest says {entry.size}")
            continue
        if not hashes:
            continue
        digest = sha256_file(file)
        if digest != entry.sha256:
            problems.append(f"{entry.path}: sha256 {digest}, manifest says {entry.sha256}")
    return problems


def verify_manifest(manifest: ManifestRecord, *, hashes: bool = True) -> list[str]:
    """Check the files a manifest lists in its folder (:func:`verify_files`); the problems found, empty if none."""
    return verify_files(Path(manifest.model_dir), manifest.files, hashes=hashes)


def require_staged(manifest: ManifestRecord) -> None:
    """FileNotFoundError, naming the first files at fault and how to restage, when a file the manifest lists
    is missing or of another size (a configuration's job checks this before it serves)."""
    missing = verify_manifest(manifest, hashes=False)
    if missing:
        raise FileNotFoundError(
            f"the staged model is not all there ({'; '.join(missing[:3])}): a finished trial's cleanup archives "
            "or deletes it when model.weights.after says so; restage it with `snakemake --forcerun stage_model`")
