"""What happens to staged weights after a trial: ``keep``, ``archive`` or ``delete``.

The model stage writes a ``weights_staged`` ledger entry before its first byte, with the
staged folder, the staging root it must stay inside, the policy and the archive folder.
Cleanup applies the policy from that entry alone:

* ``archive`` copies the staged files to ``<archive_dir>/hub/<org--name>/<commit>`` (or
  ``tiny/<digest>``), hashing as it copies, verifies the copy against the manifest, renames
  it into place and only then removes the staged copy. An archive that already verifies is
  not copied again. A later stage of the same repository and commit restages from it.
* ``delete`` removes only what the trial staged: paths are resolved, anything outside the
  staging root is refused, symlinks are removed and never followed. A file that cannot be
  removed without force (read-only mount, another owner's folder) is a residue with its
  path, size and what was seen; nothing is chowned or forced.

Both report the bytes freed. A folder staged on another node of the trial (its entry
carries the node's ``reach``) is dealt with on that node (:func:`llmtrial.weights.node_weights
.undo_on_node`): ``keep`` leaves it, ``delete`` and ``archive`` remove it (the archive is
made from the first node's copy), under the same rules.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmtrial.core.cleanup_model import WeightsFolder
from llmtrial.core.fileio import file_digest
from llmtrial.core.ledger import Action, Entry, Ledger, by_target, replay
from llmtrial.core.record_base import Residue
from llmtrial.core.record_models import ManifestFile, ManifestRecord
from llmtrial.core.records import load_record, write_record
from llmtrial.core.trial_config import DiskBlock
from llmtrial.core.units import human_bytes
from llmtrial.host.disk import headroom_by_filesystem, headroom_message
from llmtrial.weights.hub import PARTIAL_PREFIX, VerificationError
from llmtrial.weights.manifest import MANIFEST_NAME, read_manifest, verify_files
from llmtrial.weights.node_weights import undo_on_node

log = logging.getLogger(__name__)

POLICIES = ("keep", "archive", "delete")


def archive_path(archive_dir: str | Path, manifest: ManifestRecord) -> Path:
    """Where the archive of a staged model lives: by repository and commit for the Hub, by the GGUF
    file's sha256 and dtype for a dequantized GGUF, by the generator's settings for a tiny model."""
    if manifest.hub is not None:
        return Path(archive_dir) / "hub" / str(manifest.hub.repo_id).replace("/", "--") / str(manifest.hub.commit)
    if manifest.gguf is not None:
        return Path(archive_dir) / "gguf" / f"{manifest.gguf.sha256[:16]}-{manifest.gguf.dtype}"
    key = json.dumps(manifest.generator or manifest.source, sort_keys=True, default=str)
    return Path(archive_dir) / "tiny" / hashlib.sha256(key.encode()).hexdigest()[:16]


def find_archive(archive_dir: str | Path | None, repo_id: str, revision: str) -> tuple[Path, ManifestRecord] | None:
    """The archived copy of ``repo_id`` at ``revision`` (a commit, or the branch or tag it was
    staged from; the newest archive wins), with its manifest, or None."""
    if not archive_dir:
        return None
    base = Path(archive_dir) / "hub" / repo_id.replace("/", "--")
    found: list[tuple[float, Path, ManifestRecord]] = []
    for manifest_path in sorted(base.glob(f"*/{MANIFEST_NAME}")):
        manifest = read_manifest(manifest_path)
        hub = manifest.hub if manifest is not None else None
        if hub is not None and hub.repo_id == repo_id and revision in (hub.commit, hub.revision):
            found.append((manifest.archived_at or 0.0, manifest_path.parent, manifest))
    if not found:
        return None
    _, folder, manifest = max(found, key=lambda item: item[0])
    return folder, manifest


def copy_verified(src: Path, dest: Path, files: Sequence[ManifestFile]) -> list[ManifestFile]:
    """Copy ``files`` (manifest entries) from ``src`` to ``dest``, hashing while copying. Each
    file is written under a hidden partial name and renamed into place once it matches, so a
    killed copy never leaves a short file where a server would load it. Raises
    VerificationError naming the first file whose size or sha256 differs from its entry."""
    copied = []
    for entry in files:
        rel = entry.path
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{PARTIAL_PREFIX}{target.name}")
        try:
            with partial.open("wb") as fout:
                sha256 = file_digest(src / rel, copy_to=fout).hexdigest()
                fout.flush()
                os.fsync(fout.fileno())
                size = fout.tell()
            if size != entry.size or sha256 != entry.sha256:
                raise VerificationError(f"{rel}: copied {size:,} bytes with sha256 {sha256}, the "
                                        f"manifest says {entry.size:,} bytes and {entry.sha256}")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        copied.append(ManifestFile(path=rel, size=size, sha256=entry.sha256))
    return copied


# --------------------------------------------------------------------------- delete


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


@dataclass
class Removal:
    """What removing a staged folder has freed so far, and what it could not remove."""

    freed_bytes: int = 0
    files_removed: int = 0
    residues: list[Residue] = field(default_factory=list)

    def folder(self, path: str, action: str) -> WeightsFolder:
        """The cleanup record's item of the folder ``path`` deleted by the policy."""
        return WeightsFolder(path=path, policy="delete", action=action, freed_bytes=self.freed_bytes,
                             files_removed=self.files_removed, residues=self.residues)


def _weights_residue(what: str | Path, size: int | None, tried: str, seen: str) -> Residue:
    return Residue(kind="weights", what=str(what), size=size, tried=tried, seen=seen)


def delete_staged(folder: str | Path, root: str | Path) -> WeightsFolder:
    """Remove the staged ``folder``, which must lie inside ``root``: the cleanup record's item, with
    freed bytes, files removed and residues. Never follows a symlink; never forces."""
    root_r = Path(root).resolve()
    given = Path(folder)
    done = Removal()
    if not os.path.lexists(given):
        return done.folder(str(given), "none (already gone)")
    # resolve the parent only: a staged folder that is itself a symlink is unlinked, not followed
    target = given.parent.resolve() / given.name
    if not _inside(target, root_r) or target == root_r or root_r == Path(root_r.anchor):
        done.residues.append(_weights_residue(target, None, "delete", f"refused: not inside the staging root {root_r}"))
        return done.folder(str(given), "refused")
    if target.is_symlink() or not target.is_dir():
        _remove(target, done)
        return done.folder(str(given), "deleted" if not done.residues else "partly deleted")
    for dirpath, dirnames, filenames in os.walk(target, topdown=False, followlinks=False):
        here = Path(dirpath)
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            _remove(here / name, done)
        for name in dirnames:
            sub = here / name
            if not sub.is_symlink() and sub.exists():
                _rmdir(sub, done)
    _rmdir(target, done)
    return done.folder(str(given), "deleted" if not done.residues else "partly deleted")


def _not_forced(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno or 0, 'error')}: {exc.strerror}; not forced"


def _remove(path: Path, done: Removal) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    try:
        path.unlink()
    except OSError as exc:
        done.residues.append(_weights_residue(path, st.st_size, "remove without force", _not_forced(exc)))
        return
    done.files_removed += 1
    if not path.is_symlink():
        done.freed_bytes += st.st_size


def _rmdir(path: Path, done: Removal) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        if any(r.what.startswith(str(path) + os.sep) for r in done.residues):
            return  # not empty because of a residue already listed
        done.residues.append(_weights_residue(path, None, "remove without force", _not_forced(exc)))


# --------------------------------------------------------------------------- archive


def _kept(folder: Path, size: int | None, seen: str, **found: str) -> WeightsFolder:
    """The item of a staged copy the archive policy kept (``seen`` says why), a residue."""
    return WeightsFolder(path=str(folder), policy="archive", residues=[_weights_residue(folder, size, "archive", seen)],
                         **found, action="kept", freed_bytes=0)


def archive_staged(entry: Entry, ledger: Ledger, disk: DiskBlock | None = None) -> WeightsFolder:
    """Archive the staged folder of a ``weights_staged`` entry, verify, then delete it."""
    folder = Path(entry.path)
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        if not folder.exists():
            return WeightsFolder(path=str(folder), policy="archive", residues=[], action="none (already gone)",
                                 freed_bytes=0)
        return _kept(folder, None, f"no manifest at {manifest_path}; the staged copy is kept")
    manifest = load_record(manifest_path, "manifest")
    dest = archive_path(entry.archive_dir, manifest)
    started = time.monotonic()
    if (dest / MANIFEST_NAME).is_file() and not verify_files(dest, manifest.files):
        copy = "archive already present and verified"
    else:
        space = headroom_by_filesystem([("archive", dest.parent, manifest.total_bytes, len(manifest.files))],
                                       disk or DiskBlock(reserve_fraction=0.0, reserve_min_gib=0.0))[0]
        if not space.ok:
            return _kept(folder, manifest.total_bytes, f"staged copy kept: {headroom_message(space, 'archive')}",
                         archive=str(dest))
        problem = _copy_to_archive(folder, dest, manifest, ledger)
        if problem is not None:
            return _kept(folder, manifest.total_bytes, f"staged copy kept: {problem}", archive=str(dest))
        copy = f"copied and verified {len(manifest.files)} files, {human_bytes(manifest.total_bytes)}"
    seconds = round(time.monotonic() - started, 3)
    ledger.append(Action.WEIGHTS_ARCHIVED, path=str(folder), archive=str(dest), bytes=manifest.total_bytes)
    removed = delete_staged(folder, entry.root)
    return WeightsFolder(path=str(folder), policy="archive", residues=list(removed.residues or []), archive=str(dest),
                         archive_copy=copy, archive_seconds=seconds,
                         action="archived" if not removed.residues else "archived, staged copy partly removed",
                         freed_bytes=removed.freed_bytes, files_removed=removed.files_removed)


def _copy_to_archive(folder: Path, dest: Path, manifest: ManifestRecord, ledger: Ledger) -> OSError | VerificationError | None:
    """Copy the staged ``folder`` to the archive ``dest`` through a partial folder, verified before it is renamed
    into place with its manifest; the failure, or None."""
    ledger.append(Action.WEIGHTS_ARCHIVE_START, path=str(folder), archive=str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        copy_verified(folder, tmp, manifest.files)
        problems = verify_files(tmp, manifest.files)
        if problems:
            raise VerificationError("; ".join(problems))
        archived = manifest.model_copy(update={"model_dir": str(dest), "archived_at": time.time(),
                                               "archived_from": str(folder)})
        write_record(tmp / MANIFEST_NAME, archived, schema="manifest")
        if dest.exists():
            shutil.rmtree(dest)  # an archive that failed verification above
        os.replace(tmp, dest)
    except (OSError, VerificationError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return exc
    return None


def outstanding_weights(entries: Sequence[Entry]) -> dict[str, Entry]:
    """The ``weights_staged`` entries (of any run) whose policy no cleanup has applied, by id
    (:func:`llmtrial.core.ledger.replay`)."""
    return replay(entries).outstanding["weights"]


def _apply_here(path: str, entry: Entry, ledger: Ledger) -> WeightsFolder:
    """The policy of one folder staged on this host: the cleanup record's item for it."""
    policy = entry.after or "keep"
    if policy == "keep":
        size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink()) \
            if Path(path).is_dir() else 0
        return WeightsFolder(path=path, policy="keep", action="kept", freed_bytes=0, kept_bytes=size, residues=[])
    if policy == "archive":
        return archive_staged(entry, ledger, DiskBlock.model_validate(entry.disk) if entry.disk else None)
    ledger.append(Action.WEIGHTS_DELETE_START, path=path)
    return delete_staged(path, entry.root)


@dataclass
class PolicyApplied:
    """What :func:`apply_policy` did: each staged folder and the policy's outcome, and the residues."""

    folders: list[WeightsFolder]
    residues: list[Residue]

    @property
    def freed_bytes(self) -> int:
        """The bytes freed in all."""
        return sum(int(f.freed_bytes or 0) for f in self.folders)


def apply_policy(entries: Sequence[Entry], ledger: Ledger) -> PolicyApplied:
    """Apply the policy (keep, archive or delete) of each staged folder no cleanup has dealt
    with yet (the folder's latest ``weights_staged`` entry on its node holds the staging
    root, the archive folder and its reserve), on this host or, for an entry that carries a
    node's ``reach``, on that node; the ``weights_done`` entry names the node and every
    staging it settles. A policy that leaves residues (a node that cannot be reached) stays
    outstanding, so a later cleanup tries again."""
    done = PolicyApplied([], [])
    for (node, path), staged in by_target(outstanding_weights(entries), lambda e: (e.node, str(e.path)), latest=True).items():
        entry = staged.entry
        policy = entry.after or "keep"
        item = (undo_on_node(entry, ledger) if entry.reach else _apply_here(path, entry, ledger)).model_copy(
            update={"run": entry.run})
        residues = list(item.residues or [])
        if item.freed_bytes:
            log.info("weights %s on node %s: %s, freed %s", path, node, item.action, human_bytes(item.freed_bytes))
        ledger.append(Action.WEIGHTS_DONE if not residues else Action.WEIGHTS_POLICY_FAILED, node=node,
                      path=path, policy=policy, undoes=staged.undo_ids if not residues else None,
                      outcome=item.action, freed_bytes=item.freed_bytes or 0, residues=len(residues))
        done.folders.append(item)
        done.residues.extend(residues)
    return done
