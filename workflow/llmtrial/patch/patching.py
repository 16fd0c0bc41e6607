"""Patch vLLM behind a flag, reversibly: patches as data, two ways in, one way out.

A patch is a folder ``workflow/llmtrial/patches/<name>/``: ``patch.yaml`` (the vLLM versions it
applies to, the environment flag that guards the changed behaviour, why it exists, and a
log pattern that shows it ran), a unified diff and an import-time hook making the same
change. The flag is the switch: with the patch applied and the flag unset, vLLM behaves as
unpatched; a serving configuration sets the flag in its env.

* Mode ``file`` changes the installed files. The installed vLLM must be in the patch's
  version range, and every target file must match the distribution's ``RECORD`` hash (a
  file someone already changed is caught). The whole diff is applied in memory first: a
  hunk that does not match exactly fails naming the file and the hunk, and nothing is
  touched. Then, file by file, the original is backed up, the ledger entry is written
  (with the RECORD, before and after hashes) and the file is replaced atomically, keeping
  its mode and owner. All files or none: a failure part way reverts what was written.
* Mode ``plugin`` leaves site-packages alone. The hooks go into a folder of the trial's own
  holding a package and a ``dist-info`` whose ``entry_points.txt`` names them in vLLM's
  ``vllm.general_plugins`` group; the trial job puts the folder on the server's
  ``PYTHONPATH``. vLLM loads general plugins in every process it starts (API server, engine
  core, workers; under Ray each worker through ``WorkerWrapperBase.init_worker``), and each
  hook logs ``llmtrial patch <name>: hook installed in pid N``. A plugin that fails to load
  is only logged by vLLM, so the trial job reads the log (:func:`evidence`). The folder and what
  a configuration spanning several nodes carries to each other node: :mod:`llmtrial.patch.plugin`.
  Mode file changes this host only: a patch may be in mode file here and a plugin on the other
  nodes (``nodes:`` of its block), never a file patch on another node.
* Revert, from the ledger alone: restore each backup when the file still holds what the
  patch wrote, then verify it against ``RECORD`` again; a mismatch is a residue naming the
  file, never forced. The plugin folder is removed, here and on every node it was carried
  to. Reverting twice changes nothing.

Patches as data, diffs and RECORD live in :mod:`llmtrial.patch.patchdata`. Python's bytecode cache needs nothing: a ``.pyc`` records
its source's mtime and size, and both change on apply and on revert.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.cleanup_model import PatchRevert
from llmtrial.core.configuration_model import PatchSeen
from llmtrial.core.fileio import atomic_write_bytes
from llmtrial.core.ledger import Action, Entry, Ledger, OpenChange, by_target, replay
from llmtrial.core.record_base import Residue
from llmtrial.core.record_models import PatchApplied, PatchedFile, PatchesRecord, VllmDistribution
from llmtrial.core.records import as_written
from llmtrial.core.trial_config import PatchBlock
from llmtrial.logs.lines import find_lines
from llmtrial.patch.node_patches import remove_copies
from llmtrial.patch.patchdata import (
    PATCHES_DIR,
    EnabledPatch,
    FileDiff,
    HunkPlace,
    Patch,
    PatchError,
    apply_file_diff,
    available_patches,
    check_version,
    file_hash,
    hook_pattern,
    load_patch,
    parse_diff,
    patch_modes,
    record_hash,
    record_of,
    site_root,
    verify_files,
    vllm_distribution,
)
from llmtrial.patch.plugin import install_plugin, is_plugin_dir

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ mode file


@dataclass
class PreparedFile:
    """One target file with its patched content computed (the dry run), nothing written."""

    path: str
    target: Path
    patches: list[str]
    record_hash: str
    before_hash: str
    after_hash: str
    after: bytes
    hunks: list[HunkPlace]


def prepare_file_patches(patches: list[Patch], dist: md.Distribution) -> list[PreparedFile]:
    """The dry run of every file patch together: each target in RECORD, unchanged since
    install and writable, every hunk matching. Raises PatchError; touches nothing."""
    root, record = site_root(dist), record_of(dist)
    dist_label = f"{dist.metadata['Name']} {dist.version}"
    by_path: dict[str, list[tuple[Patch, FileDiff]]] = {}
    for p in patches:
        assert p.diff is not None
        for fd in parse_diff(p.diff.read_text(encoding="utf-8"), source=str(p.diff)):
            by_path.setdefault(fd.path, []).append((p, fd))
    prepared = []
    for rel, diffs in by_path.items():
        target = root / rel
        expected = record.get(rel)
        if expected is None:
            raise PatchError(f"{target}: not listed with a hash in {dist_label}'s RECORD, so its content cannot be "
                             "verified; nothing was changed (mode plugin does not need RECORD)")
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            raise PatchError(f"{target}: listed in {dist_label}'s RECORD but missing; nothing was changed") from None
        before = record_hash(data)
        if before != expected:
            raise PatchError(f"{target}: does not match {dist_label}'s RECORD ({before}, RECORD says {expected}): "
                             "it was modified since install (an earlier patch not reverted?); nothing was changed")
        if target.is_symlink():
            raise PatchError(f"{target}: a symbolic link; nothing was changed (patch the file it points to)")
        if not (os.access(target, os.W_OK) and os.access(target.parent, os.W_OK)):
            raise PatchError(f"{target}: not writable (a read-only site-packages?); nothing was changed; "
                             "mode plugin patches without writing site-packages")
        text, hunks = data.decode("utf-8"), []
        for p, fd in diffs:
            text, applied = apply_file_diff(fd, text, label=f"patch {p.name}: {rel}")
            hunks.extend(a.model_copy(update={"patch": p.name}) for a in applied)
        after = text.encode("utf-8")
        prepared.append(PreparedFile(rel, target, [p.name for p, _ in diffs], expected, before,
                                     record_hash(after), after, hunks))
    return prepared


def _replace_contents(target: Path, data: bytes, like: os.stat_result) -> None:
    """Write ``data`` to ``target`` atomically (a temporary file beside it, then rename) with
    the mode and owner of ``like``."""
    atomic_write_bytes(target, data, mode=stat.S_IMODE(like.st_mode), owner=(like.st_uid, like.st_gid))


def _backup(src: Path, dst: Path, expected: str) -> None:
    """``cp -p`` to ``dst`` (atomically), then check the copy's hash."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copy2(src, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dst)
    if file_hash(dst) != expected:
        raise PatchError(f"backup {dst} of {src} does not match the original's hash {expected}")


def write_file_patches(prepared: list[PreparedFile], ledger: Ledger, backup_dir: Path,
                       dist: md.Distribution) -> list[PatchedFile]:
    """For each prepared file: back up, ledger entry, replace, check. All or none. Each file
    changed carries ``patches``, the names of the patches that changed it."""
    written: list[PatchedFile] = []
    try:
        for f in prepared:
            backup = (backup_dir / f.path).resolve()
            _backup(f.target, backup, f.before_hash)
            ledger.append(Action.PATCH_FILE, patches=f.patches, dist=dist.metadata["Name"], version=dist.version,
                          path=f.path, file=str(f.target), backup=str(backup), record_hash=f.record_hash,
                          before_hash=f.before_hash, after_hash=f.after_hash, hunks=[as_written(h) for h in f.hunks])
            _replace_contents(f.target, f.after, f.target.stat())
            now = file_hash(f.target)
            if now != f.after_hash:
                raise PatchError(f"{f.target}: after writing it hashes to {now}, not the expected {f.after_hash}")
            written.append(PatchedFile(path=f.path, file=str(f.target), patches=f.patches, backup=str(backup),
                                       record_hash=f.record_hash, before_hash=f.before_hash, after_hash=f.after_hash,
                                       hunks=[as_written(h) for h in f.hunks]))
            log.info("patched %s (%s -> %s)", f.target, f.before_hash, f.after_hash)
    except BaseException:
        log.error("file patching failed part way: reverting what was written")
        for r in revert_patches(ledger).residues:
            log.error("RESIDUE %s: %s", r.what, r.seen)
        raise
    ledger.append(Action.PATCH_APPLIED, mode="file", patches=sorted({n for f in prepared for n in f.patches}),
                  files=[f.path for f in prepared])
    return written


def check_patches(names: Iterable[str] | None = None, *, patches_dir: Path = PATCHES_DIR,
                  dist: md.Distribution | None = None) -> list[dict[str, Any]]:
    """Without changing anything: per patch, whether the installed vLLM is in its range,
    whether each target file matches RECORD (a file left patched does not), and whether the
    diff applies. ``llmtrial patches`` prints it."""
    dist = dist or vllm_distribution()
    out = []
    for name in available_patches(patches_dir) if names is None else names:
        p = load_patch(name, patches_dir)
        item: dict[str, Any] = {"name": name, "vllm_range": p.vllm, "installed": dist.version, "flag": p.flag,
                                "files": [], "dry_run": None}
        try:
            check_version(p, dist)
            item["version_ok"] = True
        except PatchError:
            item["version_ok"] = False
        if p.diff is not None:
            item["files"] = verify_files([fd.path for fd in parse_diff(p.diff.read_text(encoding="utf-8"), str(p.diff))],
                                         dist)
            try:
                prepare_file_patches([p], dist)
                item["dry_run"] = "applies"
            except PatchError as exc:
                item["dry_run"] = str(exc)
        out.append(item)
    return out


# ------------------------------------------------------------------ the stage


def apply_patches(patches_cfg: Mapping[str, PatchBlock], *, ledger: Ledger, work_dir: Path,
                  patches_dir: Path = PATCHES_DIR, dist: md.Distribution | None = None,
                  here: str | None = None) -> PatchesRecord:
    """The patch stage: revert what an earlier run left patched, then apply every patch named
    in ``patches_cfg`` (the trial file's ``patches``: each block's mode on this host, file or plugin; ``here``:
    this host's node name in the trial file). Returns the patches record; raises PatchError with nothing left
    changed when a patch cannot be applied."""
    started = time.time()
    leftover = revert_patches(ledger)
    if leftover.residues:
        raise PatchError("an earlier patch could not be reverted: " + "; ".join(
            f"{r.what}: {r.seen}" for r in leftover.residues) + "; fix it, then run `snakemake cleanup`")
    chosen = [(load_patch(name, patches_dir), mode) for name, mode in patch_modes(patches_cfg, here).items()]
    vllm, applied = _apply_chosen(chosen, ledger, Path(work_dir), dist or vllm_distribution()) if chosen else (None, [])
    finished = time.time()
    return PatchesRecord(started=started, reverted_first=leftover.items, vllm=vllm, patches=applied,
                         finished=finished, apply_seconds=round(finished - started, 4))


def _apply_chosen(chosen: list[tuple[Patch, str]], ledger: Ledger, work_dir: Path,
                  dist: md.Distribution) -> tuple[VllmDistribution, list[PatchApplied]]:
    """Apply each ``(patch, mode)`` to ``dist``, all or none across both modes: the vLLM patched, and per
    patch what was applied."""
    vllm = VllmDistribution(distribution=dist.metadata["Name"], version=dist.version, site_packages=str(site_root(dist)))
    for p, mode in chosen:
        check_version(p, dist)
        if (mode == "file" and p.diff is None) or (mode == "plugin" and p.hook is None):
            raise PatchError(f"patch {p.name} has no {'diff' if mode == 'file' else 'hook'} for mode {mode}")
    prepared = prepare_file_patches([p for p, m in chosen if m == "file"], dist)
    files = write_file_patches(prepared, ledger, work_dir / "backup", dist) if prepared else []
    plugin_patches = [p for p, m in chosen if m == "plugin"]
    try:
        plugin = install_plugin(plugin_patches, ledger, work_dir / "plugin") if plugin_patches else None
    except BaseException:
        revert_patches(ledger)  # all or none across both modes
        raise
    applied_at = time.time()
    return vllm, [PatchApplied(name=p.name, description=p.description, vllm_range=p.vllm, flag=p.flag,
                               evidence=p.evidence, diff=str(p.diff) if p.diff else None,
                               hook=str(p.hook) if p.hook else None, mode=mode, applied_at=applied_at,
                               files=[f for f in files if p.name in f.patches],
                               plugin=plugin if mode == "plugin" else None) for p, mode in chosen]


def live_patches(entries: list[Entry]) -> dict[str, Entry]:
    """Patches applied here and not reverted since, by name: the ``patch_applied`` entry (its mode, its folder).
    A plugin folder written for another node alone (``for_node``) is not live here."""
    live: dict[str, Entry] = {}
    for e in entries:
        if e.for_node:
            continue
        if e.action == Action.PATCH_APPLIED:
            for name in e.patches or []:
                live[name] = e
        elif e.action in (Action.PATCH_FILE, Action.PATCH_PLUGIN, Action.PATCH_REVERTED, Action.PATCH_PLUGIN_REMOVED):
            for name in e.patches or []:
                live.pop(name, None)  # being applied again, or reverted
    return live


@dataclass(frozen=True)
class Patched:
    """The patches a configuration's servers run with (:func:`ensure_patched`): each patch's description
    with its mode, the plugin folder (mode plugin) and whether they had to be applied again."""

    reapplied: bool
    patches: list[EnabledPatch]
    plugin_dir: str | None
    work_dir: Path  # where a plugin folder for another node is written (llmtrial.patch.plugin.node_plugin_env)


def ensure_patched(patches_cfg: Mapping[str, PatchBlock], *, ledger: Ledger, work_dir: Path,
                   patches_dir: Path = PATCHES_DIR, here: str | None = None) -> Patched:
    """Before a configuration's server starts: make the live patches what the config asks for on this host
    (``here``: its node name in the trial file; a configuration rerun on its own after cleanup reverted them
    applies them again)."""
    want = patch_modes(patches_cfg, here)
    live = live_patches(ledger.entries())
    reapplied = False
    if {n: v.mode for n, v in live.items()} != want or _outstanding_unapplied(ledger.entries()):
        log.info("applying patches %s first (live: %s)", want, {n: v.mode for n, v in live.items()})
        apply_patches(patches_cfg, ledger=ledger, work_dir=work_dir, patches_dir=patches_dir, here=here)
        live = live_patches(ledger.entries())
        reapplied = True
    dirs = sorted({v.dir for v in live.values() if v.mode == "plugin" and v.dir})
    patches = [load_patch(name, patches_dir).enabled(mode, default=patches_cfg[name].mode,
                                                     nodes=patches_cfg[name].nodes) for name, mode in want.items()]
    return Patched(reapplied=reapplied, patches=patches, plugin_dir=dirs[0] if dirs else None, work_dir=Path(work_dir))


def _outstanding_unapplied(entries: list[Entry]) -> bool:
    """A file or plugin change recorded but never completed (an apply interrupted by a crash)."""
    state = outstanding(entries)
    applied = set(live_patches(entries))
    return any(not set(o.entry.patches or []) <= applied for o in [*state["files"].values(), *state["plugins"].values()])


_PID = re.compile(r"\bin pid (\d+)")


def evidence(patches: Sequence[EnabledPatch], log_text: str, env: Mapping[str, str],
             source: str = "server.log") -> list[PatchSeen]:
    """Per patch: whether the configuration set its flag, the log lines that show the patched
    behaviour ran (with the process and pid that logged each), the hook lines (mode plugin),
    and whether what was seen is what the flag asked for."""
    names: dict[int, str] = {}  # pid -> the last name vLLM gave the process (Worker -> Worker_TP0)
    for x in find_lines(log_text, re.compile(r"^\(\S+ pid=\d+\)"), source):
        names[x["pid"]] = x["process"]
    out = []
    for p in patches:
        flag_on = env.get(p.flag) == "1"
        lines = find_lines(log_text, re.compile(p.evidence), source)
        hooks = find_lines(log_text, re.compile(hook_pattern(p.name)), source)
        for x in [*lines, *hooks]:  # a hook prints before vLLM's prefix exists: its pid is in the text
            m = _PID.search(x["line"])
            if x["pid"] is None and m:
                x["pid"] = int(m[1])
            if x["pid"] is not None:
                x["process"] = names.get(x["pid"], x["process"])
        out.append(PatchSeen(name=p.name, mode=p.mode, flag=p.flag, flag_on=flag_on, observed=bool(lines),
                             as_expected=bool(lines) == flag_on,
                             processes=sorted({f"{x['process']} pid {x['pid']}" for x in lines if x["pid"] is not None}),
                             lines=lines, hooks=hooks))
    return out


# ------------------------------------------------------------------ revert


def patch_key(e: Entry) -> str | None:
    return e.file or e.dir


def group_patches(changes: dict[str, Entry]) -> dict[str, dict[str, OpenChange]]:
    """Outstanding patch changes (by id, as :func:`llmtrial.core.ledger.replay` gives them) by file
    or folder: ``files``, ``plugins`` (here) and ``copies`` (plugin folders carried to another
    node, by ``node:folder``). A file changed more than once and not reverted keeps its first
    entry (the one whose backup holds the original); its ``undo_ids`` list every change a revert
    of it undoes."""
    def group(e: Entry) -> str:
        return "copies" if e.action == Action.PATCH_PLUGIN_COPY else "files" if e.action == Action.PATCH_FILE else "plugins"

    return {name: by_target({i: e for i, e in changes.items() if group(e) == name},
                            (lambda e: f"{e.node}:{e.dir}") if name == "copies" else patch_key)
            for name in ("files", "plugins", "copies")}


def outstanding(entries: list[Entry]) -> dict[str, dict[str, OpenChange]]:
    """File and plugin changes the ledger records and no later revert undid (of any run),
    by file or folder, and plugin copies on other nodes (:func:`group_patches`)."""
    return group_patches(replay(entries).outstanding["patches"])


def _record_hash_now(entry: Entry) -> str | None:
    """The RECORD hash of the entry's file, read from RECORD again (the ledger's copy when
    the distribution is gone)."""
    try:
        return record_of(md.distribution(str(entry.dist))).get(str(entry.path))
    except md.PackageNotFoundError:
        return entry.record_hash


def _restore(backup: Path, target: Path) -> None:
    like = backup.stat()
    _replace_contents(target, backup.read_bytes(), target.stat() if target.exists() else like)
    os.utime(target, ns=(like.st_atime_ns, like.st_mtime_ns))  # the original's times, as cp -p kept them


@dataclass
class Reverted:
    """What :func:`revert_patches` did: each file, plugin folder and node's copy, and the residues."""

    items: list[PatchRevert]
    residues: list[Residue]


def revert_patches(ledger: Ledger) -> Reverted:
    """Undo every outstanding patch the ledger records; idempotent. A file is restored from
    its backup only while it holds what the patch wrote (anything else is left as found and
    reported); each file is then checked against RECORD, and a mismatch is a residue naming
    it. Plugin folders carried to other nodes are removed there first
    (:func:`llmtrial.patch.node_patches.remove_copies`)."""
    state = outstanding(ledger.entries())
    done = Reverted([], [])
    done.items.extend(remove_copies(list(state["copies"].values()), ledger, done.residues))
    for change in reversed(list(state["files"].values())):
        done.items.append(_revert_file(change, ledger, done.residues))
    for directory, change in reversed(list(state["plugins"].items())):
        done.items.append(_remove_plugin(directory, change, ledger, done.residues))
    return done


def _file_outcome(e: Entry, found: str | None, backup: Path, target: Path) -> str:
    """Restore a patched file from its backup while it holds what the patch wrote; what was done."""
    if found == e.after_hash:
        if file_hash(backup) != e.before_hash:
            return "not restored: the backup does not match the original's hash"
        _restore(backup, target)
        return "restored from backup"
    if found == e.before_hash:
        return "none (already the original)"
    if found is None:
        return "not restored: the file is missing"
    return "not restored: changed since the patch was applied (left as found)"


def _revert_file(change: OpenChange, ledger: Ledger, residues: list[Residue]) -> PatchRevert:
    e = change.entry
    target, backup = Path(str(e.file)), Path(str(e.backup))
    found = file_hash(target)
    action = _file_outcome(e, found, backup, target)
    record, now = _record_hash_now(e), file_hash(target)
    item = PatchRevert(path=e.path, file=e.file, patches=e.patches, run=e.run, found_hash=found,
                       action=action, hash=now, record_hash=record, matches_record=now is not None and now == record)
    if item.matches_record:
        ledger.append(Action.PATCH_REVERTED, patches=e.patches, path=e.path, file=e.file,
                      undoes=change.undo_ids, outcome=action, hash=now, matches_record=True)
    else:
        ledger.append(Action.PATCH_REVERT_FAILED, patches=e.patches, path=e.path, file=e.file,
                      outcome=action, hash=now, record_hash=record)
        residues.append(Residue(kind="file", what=str(e.file), tried=f"restore {backup}",
                                seen=f"{action}; hash {now} does not match RECORD {record}"))
    log.info("revert %s: %s (matches RECORD: %s)", e.file, action, item.matches_record)
    return item


def _remove_plugin(directory: str, change: OpenChange, ledger: Ledger, residues: list[Residue]) -> PatchRevert:
    e = change.entry
    path, head = Path(directory), {"dir": directory, "patches": e.patches, "run": e.run}
    if not path.exists():
        action = "none (already gone)"
    elif is_plugin_dir(path):
        shutil.rmtree(path)
        action = "removed"
    else:
        residues.append(Residue(kind="file", what=directory, tried="remove the plugin folder",
                                seen="it holds no llmtrial plugin dist-info; left as found"))
        return PatchRevert(**head, action="not removed: not a plugin folder of llmtrial")
    ledger.append(Action.PATCH_PLUGIN_REMOVED, patches=e.patches, dir=directory, undoes=change.undo_ids, outcome=action)
    return PatchRevert(**head, action=action)


