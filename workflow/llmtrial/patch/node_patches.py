"""A mode-plugin patch on the other nodes of a trial: the plugin folder carried to each node,
verified there, and removed there from the ledger alone.

A headless vLLM rank on another host imports the plugin from that host's files, so the folder
:func:`llmtrial.patch.patching.install_plugin` wrote here must be on the node too. :func:`carry_plugin`
puts it in ``<node staging_dir>/.llmtrial-plugin/<trial>``: a ``patch_plugin_copy`` ledger entry
naming the node, with its ``reach`` (:meth:`llmtrial.host.nodes.Node.describe`), the folder on the
node, the patches and the source folder here, is written before the copy; the files travel as
a tar stream and every sha256 is checked on the node (:meth:`llmtrial.host.nodes.Node.copy_to`);
``patch_plugin_copied`` marks the verified copy. A copy still outstanding in the ledger whose
files hash the same on the node as here is reused: no new entry, no copy. The node's copy is a
change of kind ``patches`` of its own action, not a ``patch_plugin``: which patches are live
here (:func:`llmtrial.patch.patching.live_patches`) never depends on another node.

:func:`remove_copies` is what :func:`llmtrial.patch.patching.revert_patches` (and so cleanup) does
with every copy still outstanding: rebuild the node from the entry, remove the folder there
only when it is an llmtrial plugin folder (the test applied here: :data:`PLUGIN_MARK` inside
it), and write ``patch_plugin_copy_removed`` naming the node. A node that cannot be reached,
or a folder that is not a plugin folder, is a residue naming the node; the entry stays
outstanding.

Mode ``file`` cannot reach another node (it rewrites this host's site-packages only): the trial
file's model refuses it on any other node of a configuration spanning nodes
(:func:`llmtrial.core.trial_checks.file_patches_elsewhere`); such a patch is a plugin there
(:func:`llmtrial.patch.plugin.node_plugin_env`).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from llmtrial.core.cleanup_model import PatchRevert
from llmtrial.core.fileio import sha256_file
from llmtrial.core.ledger import Action, Entry, Ledger, OpenChange, replay
from llmtrial.core.record_base import Residue
from llmtrial.host.nodes import Node, NodeError
from llmtrial.onnode import plugin_folder
from llmtrial.patch.patchdata import PLUGIN_MARK, PatchError
from llmtrial.weights.node_weights import send_files

__all__ = ["PLUGIN_FOLDER", "plugin_files", "carry_plugin", "remove_copies"]

log = logging.getLogger(__name__)

#: The folder under a node's staging folder that holds each trial's plugin copy.
PLUGIN_FOLDER = ".llmtrial-plugin"
#: Seconds a node may take to inspect or remove a plugin folder.
FOLDER_TIMEOUT_S = 60.0

class PluginFolderState(BaseModel):
    """What :mod:`llmtrial.onnode.plugin_folder` prints: the folder's absolute path on the node, whether it
    exists, whether it is an llmtrial plugin folder and whether it was removed."""

    path: str
    exists: bool
    plugin: bool
    removed: bool


def _inspect(node: Node, directory: str, *, remove: bool = False) -> PluginFolderState:
    return PluginFolderState.model_validate(node.program(
        plugin_folder, {"dir": directory, "mark": PLUGIN_MARK, "remove": remove}, FOLDER_TIMEOUT_S))


def plugin_files(plugin_dir: Path) -> dict[str, str]:
    """Path relative to the plugin folder -> sha256 of each file a node's copy must hold
    (bytecode caches left out: a process that imported the plugin writes them)."""
    files = sorted(p for p in Path(plugin_dir).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {p.relative_to(plugin_dir).as_posix(): sha256_file(p) for p in files}


def _plugin_patches(entries: list[Entry], plugin_dir: Path) -> list[str]:
    """The patches of the outstanding ``patch_plugin`` that wrote ``plugin_dir`` here."""
    for e in replay(entries).open("patches"):
        if e.action == Action.PATCH_PLUGIN and e.dir == str(plugin_dir):
            return list(e.patches or [])
    return []


def _verified_copy(entries: list[Entry], node: Node, dest: str, files: Mapping[str, str]) -> bool:
    """True when an outstanding copy to ``dest`` on ``node`` holds ``files`` there now."""
    if not any(e.action == Action.PATCH_PLUGIN_COPY and e.node == node.name and e.dir == dest
               for e in replay(entries).open("patches")):
        return False
    there = node.sha256([posixpath.join(dest, rel) for rel in files], timeout=FOLDER_TIMEOUT_S)
    return {rel: there.get(posixpath.join(dest, rel)) for rel in files} == dict(files)


def carry_plugin(ledger: Ledger, node: Node, plugin_dir: Path, *, trial: str) -> str:
    """Carry the plugin folder ``plugin_dir`` (here) to ``node`` (see the module's docstring)
    and return the folder's absolute path on the node. Raises :class:`NodeError` naming the
    node when it cannot be reached or the copy does not verify there, and PatchError when the
    path on the node holds something that is not an llmtrial plugin folder."""
    plugin_dir = Path(plugin_dir).resolve()
    files = plugin_files(plugin_dir)
    found = _inspect(node, posixpath.join(node.staging_dir, PLUGIN_FOLDER, trial))
    dest = found.path
    entries = ledger.entries()
    if _verified_copy(entries, node, dest, files):
        log.info("plugin folder on %s verified at %s: reused", node.label(), dest)
        return dest
    if found.exists and not found.plugin:
        raise PatchError(f"{node.label()}: {dest} exists and is not a plugin folder of llmtrial: not replaced")
    entry = ledger.append(Action.PATCH_PLUGIN_COPY, node=node.name, reach=node.describe(), dir=dest,
                          patches=_plugin_patches(entries, plugin_dir), source=str(plugin_dir))
    if found.exists:
        _inspect(node, dest, remove=True)  # an older copy's files never mix with these
    copied = send_files(node, plugin_dir, list(files), dest)
    ledger.append(Action.PATCH_PLUGIN_COPIED, node=node.name, copy=entry.id, dir=dest, files=copied)
    log.info("plugin folder %s copied to %s at %s (%d files verified)", plugin_dir, node.label(), dest, len(copied))
    return dest


def _remove_one(change: OpenChange, ledger: Ledger, residues: list[Residue]) -> PatchRevert:
    e = change.entry
    name, directory = e.node, str(e.dir)
    head = {"dir": directory, "node": name, "patches": e.patches, "run": e.run}
    try:
        found = _inspect(Node.from_reach(name, e.reach), directory, remove=True)
    except (NodeError, ValueError, KeyError, TypeError) as err:
        residues.append(Residue(kind="file", what=directory, node=name,
                                tried=f"remove the plugin folder on node {name} from the ledger", seen=str(err)))
        return PatchRevert(**head, action="not reached")
    if found.exists and not found.removed:
        residues.append(Residue(kind="file", what=directory, node=name, tried="remove the plugin folder",
                                seen="it holds no llmtrial plugin dist-info; left as found"))
        return PatchRevert(**head, action="not removed: not a plugin folder of llmtrial")
    item = PatchRevert(**head, action="removed" if found.removed else "none (already gone)")
    ledger.append(Action.PATCH_PLUGIN_COPY_REMOVED, node=name, patches=e.patches, dir=directory,
                  undoes=change.undo_ids, outcome=item.action)
    return item


def remove_copies(copies: list[OpenChange], ledger: Ledger, residues: list[Residue]) -> list[PatchRevert]:
    """Remove, newest first, each outstanding plugin copy on its node (``copies`` as
    :func:`llmtrial.patch.patching.group_patches` gives them). Returns what
    was done to each; adds to ``residues`` what could not be removed, each naming the node."""
    items = []
    for change in reversed(copies):
        item = _remove_one(change, ledger, residues)
        log.info("plugin copy %s on node %s: %s", item.dir, item.node, item.action)
        items.append(item)
    return items
