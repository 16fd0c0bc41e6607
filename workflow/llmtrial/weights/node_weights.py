"""Staged weights on the other nodes of a trial: copied from the first node, verified there,
and undone there from the ledger alone.

The first node (the one running the workflow) stages the model as a one-host trial does
(:func:`llmtrial.weights.staging.stage_model`). :func:`copy_to_nodes` then puts the same files in
``<node staging_dir>/<trial>/<model name>`` on every other node a configuration spans, the
layout of the first node's own staging folder: a ``weights_staged`` ledger entry naming the
node, with its ``reach`` (:meth:`llmtrial.host.nodes.Node.describe`), the folder, the root it
must stay inside and the policy, is written before the first byte; the files travel as a
tar stream (:meth:`llmtrial.host.nodes.Node.copy_to`) and every sha256 is checked on the node.
A node that already holds the same files (every hash checked there) keeps them: its copy
is ``reused``. The manifest gains ``nodes`` (per node: ``model_dir``, ``files``, ``bytes``,
``copy_s``, ``verified``, ``reused``, ``copied_from``) and ``same_files``, the check that the
files hash the same on every node (:func:`llmtrial.host.crossnode.same_files`).

:func:`undo_on_node` is what cleanup does with such an entry (:func:`llmtrial.weights.policy
.apply_policy`): rebuild the node from the entry, then ``keep`` leaves the copy, while
``delete`` and ``archive`` both remove it (the archive is made from the first node's copy).
Removal runs on the node as :mod:`llmtrial.onnode.weights_folder`, the rules of
:func:`llmtrial.weights.policy.delete_staged` written for the node's own Python: nothing outside
the entry's root, symlinks removed and never followed, nothing forced. A node that cannot
be reached is a residue naming it, and the entry stays outstanding.
"""

from __future__ import annotations

import logging
import os
import posixpath
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from llmtrial.core.cleanup_model import WeightsFolder
from llmtrial.core.fileio import sha256_file
from llmtrial.core.ledger import Action, Entry, Ledger
from llmtrial.core.record_base import Residue
from llmtrial.core.record_models import ManifestRecord, NodeCopy, SameFiles
from llmtrial.core.trial_config import WeightsBlock
from llmtrial.host.crossnode import same_files
from llmtrial.host.nodes import Node, NodeError, trial_nodes
from llmtrial.onnode import weights_folder
from llmtrial.weights.manifest import MANIFEST_NAME, recorded_source

__all__ = ["stage_on_nodes", "copy_to_nodes", "undo_on_node", "send_files"]

log = logging.getLogger(__name__)

#: Seconds a node may take to resolve, size or remove a folder.
FOLDER_TIMEOUT_S = 600.0

class FolderAnswer(BaseModel):
    """What :mod:`llmtrial.onnode.weights_folder` prints: a folder resolved (``path``), sized (``exists``,
    ``bytes``) or deleted (``path``, ``action``, the bytes freed, files removed and residues)."""

    path: str | None = None
    exists: bool = False
    bytes: int = 0
    action: str | None = None
    freed_bytes: int = 0
    files_removed: int = 0
    residues: list[Residue] = []


def _folder(node: Node, op: str, path: str, root: str | None = None) -> FolderAnswer:
    return FolderAnswer.model_validate(node.program(weights_folder, {"op": op, "path": path, "root": root},
                                                    FOLDER_TIMEOUT_S))


def _expected(manifest: ManifestRecord) -> dict[str, str]:
    """Path relative to the model folder -> sha256 of what every node must hold: the
    manifest's files, and the manifest itself when the first node's folder has one."""
    folder = Path(manifest.model_dir)
    files = {str(f.path): str(f.sha256) for f in manifest.files}
    if (folder / MANIFEST_NAME).is_file():
        files[MANIFEST_NAME] = sha256_file(folder / MANIFEST_NAME)
    return files


def send_files(node: Node, folder: Path, rels: Sequence[str], dest: str) -> dict[str, str]:
    """Copy exactly ``rels`` of ``folder`` to ``dest`` on the node (a folder of symlinks
    to them travels: the tar stream follows links); the hashes verified on the node (the
    manifest :meth:`llmtrial.host.nodes.Node.copy_to` returns)."""
    with tempfile.TemporaryDirectory(prefix="llmtrial-send-") as tmp:
        for rel in rels:
            link = Path(tmp) / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink((folder / rel).resolve(), link)
        return node.copy_to(tmp, dest)


def _copy_one(node: Node, manifest: ManifestRecord, expected: Mapping[str, str], *, ledger: Ledger,
              trial: str, model_name: str, weights: WeightsBlock | None, first: str) -> tuple[NodeCopy, dict]:
    """Stage the model on one node: (its entry of the manifest's ``nodes``, its hashes)."""
    root = _folder(node, "resolve", posixpath.join(node.staging_dir, trial)).path
    if root is None:
        raise NodeError(f"{node.label()}: the staging folder did not resolve")
    dest = posixpath.join(root, model_name)
    source = recorded_source(manifest)
    ledger.append(Action.WEIGHTS_STAGED, node=node.name, reach=node.describe(), path=dest, root=root,
                  after=weights.after if weights else "keep", archive_dir=None,
                  kind=source.kind if source else None, copied_from=first)
    started = time.monotonic()
    there = node.sha256([posixpath.join(dest, rel) for rel in expected])
    hashes = {rel: there.get(posixpath.join(dest, rel)) for rel in expected}
    reused = hashes == dict(expected)
    if not reused:
        _folder(node, "delete", dest, root)  # another model's files never mix with these
        hashes = send_files(node, Path(manifest.model_dir), list(expected), dest)
    took = round(time.monotonic() - started, 3)
    log.info("%s %s on %s in %.1f s", "found a verified copy of" if reused else "copied", model_name, node.label(), took)
    entry = NodeCopy(model_dir=dest, files=len(manifest.files), bytes=int(manifest.total_bytes), copy_s=took,
                     verified=True, reused=reused, copied_from=first)
    return entry, hashes


def copy_to_nodes(manifest: ManifestRecord, nodes: Sequence[Node], *, ledger: Ledger, trial: str, model_name: str,
                  weights: WeightsBlock | None = None) -> ManifestRecord:
    """The first node's ``manifest`` with the model copied to every other of ``nodes`` (see
    the module's docstring); ``nodes`` and ``same_files`` added. Raises :class:`NodeError`
    naming the node when a copy fails or does not verify there."""
    first, *others = nodes
    expected = _expected(manifest)
    model_files = {str(f.path) for f in manifest.files}
    placed = {first.name: NodeCopy(model_dir=manifest.model_dir, files=len(manifest.files),
                                   bytes=int(manifest.total_bytes), copy_s=0.0, verified=True, reused=False,
                                   copied_from=None)}
    hashes = {first.name: {rel: expected[rel] for rel in model_files}}
    for node in others:
        placed[node.name], there = _copy_one(node, manifest, expected, ledger=ledger, trial=trial,
                                             model_name=model_name, weights=weights, first=first.name)
        hashes[node.name] = {rel: there.get(rel) for rel in model_files}
    check = same_files(hashes)
    if check.status == "fail":
        raise NodeError(f"the staged model differs across nodes: {check.detail}")
    return manifest.model_copy(update={"nodes": placed, "same_files": SameFiles(**check.model_dump(exclude_unset=True))})


def stage_on_nodes(manifest: ManifestRecord, spanned: Mapping[str, Any] | None, *, ledger: Ledger, trial: str,
                   model_name: str, weights: WeightsBlock | None = None) -> ManifestRecord:
    """:func:`copy_to_nodes` over the nodes any configuration spans (``spanned``:
    :func:`llmtrial.host.nodes.spanned_nodes`); the manifest unchanged when the trial lists none."""
    if not spanned or not spanned.get("nodes"):
        return manifest
    return copy_to_nodes(manifest, list(trial_nodes(spanned).values()), ledger=ledger, trial=trial,
                         model_name=model_name, weights=weights)


def undo_on_node(entry: Entry, ledger: Ledger) -> WeightsFolder:
    """Apply the policy of a ``weights_staged`` entry of another node, on that node: the
    cleanup record's item for the folder (its residues name the node)."""
    name, path, policy = entry.node, str(entry.path), entry.after or "keep"
    try:
        node = Node.from_reach(name, entry.reach)
        if policy == "keep":
            found = _folder(node, "size", path)
            return WeightsFolder(path=path, node=name, policy=policy, freed_bytes=0, residues=[],
                                 action="kept" if found.exists else "none (already gone)", kept_bytes=found.bytes)
        ledger.append(Action.WEIGHTS_DELETE_START, node=name, path=path)
        done = _folder(node, "delete", path, str(entry.root))
    except (NodeError, ValueError, KeyError, TypeError) as err:
        residue = Residue(kind="weights", what=path, node=name, size=None, tried=f"{policy} on node {name} from the ledger",
                          seen=str(err))
        return WeightsFolder(path=path, node=name, policy=policy, freed_bytes=0, residues=[residue], action="not reached")
    return WeightsFolder(path=path, node=name, policy=policy, action=done.action, freed_bytes=done.freed_bytes,
                         files_removed=done.files_removed,
                         residues=[r.model_copy(update={"node": name}) for r in done.residues])
