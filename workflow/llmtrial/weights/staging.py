"""Model stage: put a servable Hugging Face-format model folder in place and describe it.

A trial serves one model folder. This module produces or checks that folder and writes
a *manifest* (every file with its size and sha256) so later stages and the report can
say exactly which bytes were served.

Source kinds (``model.source`` of the trial file, :class:`llmtrial.core.trial_config.SourceBlock`):

``tiny``
    A small Llama-architecture model generated locally and deterministically from a
    seed (random weights, a byte-level BPE tokenizer trained on a pseudo-word corpus).
    Needs no network and no download; same seed gives byte-identical files: see
    :mod:`llmtrial.weights.tiny`. A generation is kept and copied by the next staging of the
    same model (:mod:`llmtrial.weights.tiny_cache`).
``local``
    An existing Hugging Face-format folder, checked and manifested in place (no copy).
``hub``
    A Hugging Face Hub repository at a revision (resolved to a commit), fetched with
    huggingface_hub into the staging folder: see :mod:`llmtrial.weights.hub`.
``archive``
    The same repository and commit restaged from ``weights.archive_dir`` (see
    :mod:`llmtrial.weights.policy`); a ``hub`` source uses an archive automatically too.
``gguf``
    A GGUF checkpoint (a file, or a file inside an installed Python distribution)
    dequantized into a Hugging Face folder with its tokenizer and chat template: see
    :mod:`llmtrial.weights.gguf`. Reused without converting again while its manifest
    verifies and names the same file (by sha256), dtype and transformers version.

The manifest itself is built and checked in :mod:`llmtrial.weights.manifest`; reading a model's
source before it is staged (config.json, sizes) is :mod:`llmtrial.weights.model_source`; the disk
headroom check is :mod:`llmtrial.host.disk`. Heavy imports (torch, transformers, tokenizers,
huggingface_hub) happen inside the functions that need them, so importing this module is
cheap.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmtrial.core.fileio import replace_dir, sha256_file, sibling_dir
from llmtrial.core.ledger import Action, Ledger
from llmtrial.core.preflight_model import Disk
from llmtrial.core.record_models import GgufOrigin, HubSource, ManifestFile, ManifestRecord
from llmtrial.core.records import as_written, write_record
from llmtrial.core.trial_config import DiskBlock, SourceBlock, WeightsBlock
from llmtrial.core.units import MiB
from llmtrial.host.disk import Need, require_headroom
from llmtrial.weights import gguf, hub
from llmtrial.weights.manifest import (
    MANIFEST_NAME,
    build_manifest,
    new_manifest,
    read_manifest,
    recorded_source,
    same_source,
    verify_manifest,
)
from llmtrial.weights.model_source import check_local_model
from llmtrial.weights.policy import copy_verified, find_archive
from llmtrial.weights.tiny import tiny_parameters
from llmtrial.weights.tiny_cache import generate_or_copy

logger = logging.getLogger(__name__)

__all__ = ["stage_model"]

#: What staging a hub or archive source returns: (manifest files, fetch figures, headroom).
Staged = tuple[list[ManifestFile], hub.FetchFigures, list[Disk]]


@dataclass(frozen=True)
class StagedEntry:
    """The ``weights_staged`` ledger entry of a folder staged here: what cleanup keeps, archives or deletes,
    and where; a Hub source's repository and commit."""

    path: str
    after: str
    archive_dir: str | None
    kind: str
    repo_id: str | None = None
    commit: str | None = None


def _reusable(manifest_path: Path, staging_dir: Path, source: SourceBlock, *,
              generator: dict[str, int] | None = None, origin: GgufOrigin | None = None) -> ManifestRecord | None:
    """The stored manifest if the staged model can be reused as is, else None (logged): it came from the
    same ``source`` and the same ``generator`` (a tiny model's) or GGUF file ``origin``, and still verifies."""
    if not manifest_path.is_file():
        return None
    old = read_manifest(manifest_path)
    if old is None:
        return None
    if not same_source(old, source) or old.generator != generator or old.gguf != origin:
        logger.info("staged model in %s came from another source; regenerating", staging_dir)
        return None
    if old.model_dir != str(staging_dir.resolve()):
        logger.info("manifest %s describes another folder; regenerating", manifest_path)
        return None
    problems = verify_manifest(old)
    if problems:
        logger.info("staged model in %s fails its manifest (%s); regenerating",
                    staging_dir, "; ".join(problems))
        return None
    return old


def _staged_weights_entry(folder: Path, weights: WeightsBlock | None, source: SourceBlock,
                          commit: str | None = None) -> StagedEntry:
    """The ``weights_staged`` ledger entry of ``folder`` (no policy given: the model's default, and no
    archive); a Hub source's repository with the ``commit`` staged."""
    policy = weights or WeightsBlock()
    archive_dir = weights.archive_dir if weights else None
    return StagedEntry(path=str(folder.resolve()), after=policy.after,
                       archive_dir=str(Path(archive_dir).resolve()) if archive_dir else None, kind=source.kind,
                       repo_id=source.repo_id if commit else None, commit=commit)


def _reuse_staged_hub(folder: Path, source: SourceBlock, commit: str | None) -> ManifestRecord | None:
    """The manifest of a hub model already staged in ``folder`` from the same repository,
    commit (or, with no commit known, the same revision) and patterns, if every file is
    unchanged since it verified."""
    manifest = read_manifest(folder / MANIFEST_NAME) if (folder / MANIFEST_NAME).is_file() else None
    origin = manifest.hub if manifest is not None else None
    recorded = recorded_source(manifest) if manifest is not None else None
    if manifest is None or origin is None or recorded is None:
        return None
    same = (origin.repo_id == source.repo_id
            and (origin.commit == commit if commit else source.revision in (origin.revision, origin.commit))
            and (recorded.allow_patterns, recorded.ignore_patterns) == (source.allow_patterns, source.ignore_patterns))
    verified = hub.VerifiedFiles(folder)
    if not same or any(verified.sha256(f.path, folder / f.path, sha256=f.sha256) is None for f in manifest.files):
        return None
    return manifest


def _hub_commit(source: SourceBlock, repo_id: str) -> tuple[str | None, str | None]:
    """(commit, why the Hub is not used): the commit the source's revision names, from the Hub unless
    the source is an archive, HF_HUB_OFFLINE is set or the Hub cannot be reached."""
    revision = source.revision
    if hub.COMMIT.match(revision):
        return revision, None
    if source.kind == "archive":
        return None, "the source is an archive"
    if hub.offline():
        return None, "HF_HUB_OFFLINE is set"
    try:
        commit = hub.resolve_commit(repo_id, revision)
    except Exception as exc:
        if not hub.unreachable(exc):
            raise
        return None, f"the Hub at {hub.endpoint()} cannot be reached ({type(exc).__name__})"
    logger.info("%s@%s is commit %s", repo_id, revision, commit)
    return commit, None


def _restage_from_archive(archive: Path, archived: ManifestRecord, folder: Path, verified: hub.VerifiedFiles,
                          disk: DiskBlock | None, record_write: Callable[[], None]) -> Staged:
    """Copy (hashing) what ``folder`` lacks from an archive; (files, fetch figures, headroom)."""
    todo = [f for f in archived.files if verified.sha256(f.path, folder / f.path, sha256=f.sha256) is None]
    todo_bytes = sum(f.size for f in todo)
    what = f"{archived.hub.repo_id}@{archived.hub.commit}" if archived.hub else str(archive)
    headroom = require_headroom([("staging", folder, todo_bytes, len(todo))], disk, f"{what} from the archive {archive}")
    record_write()
    _remove_stale(folder, {f.path for f in archived.files})
    logger.info("restaging %s from the archive %s (%d files, %.1f MiB to copy); the Hub is not used",
                what, archive, len(todo), todo_bytes / MiB)
    started = time.monotonic()
    for f in copy_verified(archive, folder, todo):
        verified.add(f.path, folder / f.path, f.sha256)
    fetch = hub.FetchFigures(files_copied=len(todo), bytes_copied=todo_bytes, files_downloaded=0, bytes_downloaded=0,
                             seconds=round(time.monotonic() - started, 3), restaged_from=str(archive))
    return list(archived.files), fetch, headroom


def _fetch_from_hub(source: SourceBlock, repo_id: str, commit: str, folder: Path, verified: hub.VerifiedFiles,
                    disk: DiskBlock | None, weights: WeightsBlock | None,
                    record_write: Callable[[], None]) -> Staged:
    """Fetch (verifying) what ``folder`` lacks from the Hub; (files, fetch figures, headroom)."""
    from huggingface_hub import constants

    remote = hub.list_files(repo_id, commit, allow_patterns=source.allow_patterns, ignore_patterns=source.ignore_patterns)
    record_write()
    todo, removed_bad = hub.plan_fetch(folder, remote, verified)
    needs: list[Need] = [("staging", folder, sum(f.size for f in todo), len(todo)), ("cache", constants.HF_HUB_CACHE, 0, 0)]
    if weights is not None and weights.after == "archive" and weights.archive_dir:
        needs.append(("archive", weights.archive_dir, sum(f.size for f in remote), len(remote)))
    headroom = require_headroom(needs, disk, f"{repo_id}@{commit}")
    _remove_stale(folder, {f.path for f in remote})
    logger.info("%d of %d files already staged and verified; %d to fetch", len(remote) - len(todo), len(remote), len(todo))
    fetch = hub.download(repo_id, commit, todo, folder, verified, max_workers=source.max_workers, retries=source.retries,
                         backoff_s=float(source.retry_backoff_s), progress_interval=float(source.progress_interval_s)) \
        if todo else hub.FetchFigures(files_downloaded=0, bytes_downloaded=0, seconds=0.0, bytes_per_s=None, retries=[])
    fetch.files_reused = len(remote) - len(todo)
    fetch.corrupt_removed = removed_bad
    return hub.manifest_files(folder, remote, verified), fetch, headroom


def _stage_hub(source: SourceBlock, folder: Path, *, disk: DiskBlock | None,
               weights: WeightsBlock | None, record_write: Callable[[StagedEntry], None]) -> ManifestRecord:
    """Stage a ``hub`` (or ``archive``) source into ``folder``: a staged copy that verifies,
    else the archive of the same repository and commit, else the Hub. See llmtrial.weights.hub."""
    repo_id = source.repo_id
    if not repo_id:
        raise ValueError(f"source kind {source.kind!r} needs 'repo_id' (such as Qwen/Qwen3-8B)")
    revision = source.revision
    archive_dir = weights.archive_dir if weights else None
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    with hub.stage_lock(folder):
        orphans, _ = hub.remove_orphans(folder)
        commit, why_no_hub = _hub_commit(source, repo_id)
        staged = _reuse_staged_hub(folder, source, commit)
        if staged is not None and staged.hub is not None:
            record_write(_staged_weights_entry(folder, weights, source, commit=str(staged.hub.commit)))
            logger.info("reusing staged %s@%s in %s (every file verified): done in %.1f s",
                        repo_id, staged.hub.commit, folder, time.monotonic() - started)
            fetch = hub.FetchFigures(files_downloaded=0, bytes_downloaded=0, reused=True, orphans_removed=orphans)
            return staged.model_copy(update={"fetch": as_written(fetch)})
        found = find_archive(archive_dir, repo_id, commit or revision)
        if found is None and commit is None:
            raise hub.HubError(f"cannot stage {repo_id}@{revision}: {why_no_hub}, and there is no verified copy "
                               f"in {folder} and no archive of it in {archive_dir or '(no archive_dir)'}")
        resolved_by = "given" if hub.COMMIT.match(revision) else "hub" if commit else "archive"
        commit = commit or str(found[1].hub.commit)  # found by its hub origin
        ledger_entry = _staged_weights_entry(folder, weights, source, commit=commit)
        verified = hub.VerifiedFiles(folder)
        if found is not None:
            files, fetch, headroom = _restage_from_archive(found[0], found[1], folder, verified, disk,
                                                           lambda: record_write(ledger_entry))
        else:
            files, fetch, headroom = _fetch_from_hub(source, repo_id, commit, folder, verified, disk, weights,
                                                     lambda: record_write(ledger_entry))
        fetch.orphans_removed = orphans
        origin = HubSource(repo_id=repo_id, revision=revision, commit=commit, endpoint=hub.endpoint(),
                           token=hub.token_state(), resolved_by=resolved_by)
        manifest = new_manifest(folder.resolve(), source, files, hub=origin, fetch=as_written(fetch), headroom=headroom)
        write_record(folder / MANIFEST_NAME, manifest, schema="manifest")
    logger.info("staged %s@%s in %s: done in %.1f s", repo_id, commit, folder, time.monotonic() - started)
    return manifest


def _remove_stale(folder: Path, keep: set[str]) -> None:
    """Remove visible files that are not part of the model (another revision's shards), so
    a server never loads them."""
    for rel in hub.stale_files(folder, keep):
        logger.warning("removing %s from %s: not part of the selected files", rel, folder)
        hub.forget_download(folder, rel)


def _stage_tiny(source: SourceBlock, folder: Path, *, weights: WeightsBlock | None,
                record_write: Callable[[StagedEntry], None]) -> ManifestRecord:
    """The tiny model generated into ``folder`` (or reused when its manifest still verifies)."""
    started = time.monotonic()
    generator = tiny_parameters(source)
    manifest_path = folder / MANIFEST_NAME
    reused = _reusable(manifest_path, folder, source, generator=generator)
    record_write(_staged_weights_entry(folder, weights, source))
    if reused is not None:
        logger.info("reusing staged tiny model in %s (manifest verifies): done in %.1f s",
                    folder, time.monotonic() - started)
        return reused
    generate_or_copy(folder, generator)
    manifest = build_manifest(folder, source=source, generator=generator)
    write_record(manifest_path, manifest, schema="manifest")
    logger.info("staged tiny model in %s: done in %.1f s", folder, time.monotonic() - started)
    return manifest


def _stage_gguf(source: SourceBlock, folder: Path, *, disk: DiskBlock | None,
                weights: WeightsBlock | None, record_write: Callable[[StagedEntry], None]) -> ManifestRecord:
    """A GGUF checkpoint dequantized into ``folder`` (or the folder reused when its manifest verifies and
    names the same file, dtype and transformers version)."""
    import transformers

    started = time.monotonic()
    file = gguf.find_gguf(source)
    dtype = source.dtype
    header = gguf.read_header(file)
    logger.info("hashing %s (%.1f MiB)", file, file.stat().st_size / MiB)
    origin = GgufOrigin(file=str(file), size=file.stat().st_size, sha256=sha256_file(file), package=source.package,
                        package_version=gguf.package_version(source), architecture=header.architecture, dtype=dtype,
                        transformers=transformers.__version__)
    manifest_path = folder / MANIFEST_NAME
    reused = _reusable(manifest_path, folder, source, origin=origin)
    if reused is not None:
        record_write(_staged_weights_entry(folder, weights, source))
        logger.info("reusing %s dequantized in %s (manifest verifies): done in %.1f s",
                    file.name, folder, time.monotonic() - started)
        return reused
    need, files = gguf.staged_size(header, dtype)
    headroom = require_headroom([("staging", folder.parent, need, files)], disk, f"{file.name} dequantized to {dtype}")
    record_write(_staged_weights_entry(folder, weights, source))
    tmp = sibling_dir(folder, "tmp")
    try:
        conversion = gguf.convert(file, tmp, dtype=dtype)
        replace_dir(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest = build_manifest(folder, source=source, gguf=origin, conversion=conversion, headroom=headroom)
    write_record(manifest_path, manifest, schema="manifest")
    logger.info("staged %s as a %s Hugging Face folder in %s: done in %.1f s", file.name, dtype, folder,
                time.monotonic() - started)
    return manifest


def stage_model(source: SourceBlock, staging_dir: Path, *, ledger: Ledger | None = None, root: Path | None = None,
                weights: WeightsBlock | None = None, disk: DiskBlock | None = None) -> ManifestRecord:
    """Stage the model a trial serves and return its manifest.

    Dispatches on ``source.kind``:

    * ``"tiny"``: generate with :func:`llmtrial.weights.tiny.generate_tiny_model` (or copy a kept
      generation, :mod:`llmtrial.weights.tiny_cache`) into ``staging_dir`` from
      ``source.seed`` and the sizes in ``source.tiny``, then write the manifest to
      ``staging_dir / MANIFEST_NAME``. A model already staged there is reused, without
      regenerating, when that manifest came from the same source and still verifies.
      The manifest also carries ``"generator"``: the seed and sizes.
    * ``"local"``: check ``source.path`` with :func:`llmtrial.weights.model_source.check_local_model` and manifest
      it in place (no copy; nothing is written, ``staging_dir`` is unused).
    * ``"hub"``: resolve ``revision`` to its commit and fetch the selected files with
      huggingface_hub (a verified staged copy or an archive of that commit is used
      instead); ``"archive"``: the same from ``weights.archive_dir`` only, never the Hub.
    * ``"gguf"``: dequantize the checkpoint (:mod:`llmtrial.weights.gguf`) into ``staging_dir``.

    ``ledger`` (a :class:`llmtrial.core.ledger.Ledger`) gets a ``weights_staged`` entry before
    the first byte is written, with ``root`` (the staging root cleanup must stay inside)
    and ``weights`` (``after``: keep, archive or delete; ``archive_dir``). ``disk`` holds
    the reserve settings of the headroom check.

    Raises:
        ValueError: missing ``path`` or ``repo_id``.
        FileNotFoundError: a ``local`` model folder or one of its files is missing.
        llmtrial.host.disk.HeadroomError: a filesystem would fall below its reserve.
        llmtrial.weights.hub.HubError, llmtrial.weights.hub.VerificationError: the Hub failed or a file
            does not match its metadata.
    """
    started = time.monotonic()
    folder = Path(staging_dir)

    def record_write(entry: StagedEntry) -> None:
        if ledger is not None:  # with all cleanup needs: the root it stays inside, the archive's reserve
            origin = {"repo_id": entry.repo_id, "commit": entry.commit} if entry.commit else {}
            ledger.append(Action.WEIGHTS_STAGED, path=entry.path, after=entry.after, archive_dir=entry.archive_dir,
                          kind=entry.kind, **origin, root=str(Path(root or folder.parent).resolve()),
                          disk=disk.model_dump() if disk else None)

    if source.kind == "tiny":
        return _stage_tiny(source, folder, weights=weights, record_write=record_write)
    if source.kind == "local":
        if not source.path:
            raise ValueError("source kind 'local' needs a 'path' to a Hugging Face-format model folder")
        model_dir = check_local_model(Path(source.path))
        manifest = build_manifest(model_dir, source=source)
        logger.info("staged local model %s in place: done in %.1f s", model_dir, time.monotonic() - started)
        return manifest
    if source.kind in ("hub", "archive"):
        return _stage_hub(source, folder, disk=disk, weights=weights, record_write=record_write)
    return _stage_gguf(source, folder, disk=disk, weights=weights, record_write=record_write)
