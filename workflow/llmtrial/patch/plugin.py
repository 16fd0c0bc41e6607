"""Mode plugin: a patch's hook in a folder of the trial's own, loaded by every vLLM process.

:func:`install_plugin` writes the folder (a package and a ``dist-info`` whose ``entry_points.txt``
names the hooks in vLLM's ``vllm.general_plugins`` group), ledger first; :func:`server_env` puts it
first on a server's ``PYTHONPATH``. A configuration spanning several nodes gives each node the patches
in the mode that node asks (:func:`node_plugin_env`): the patch stage's folder when the node wants the
same plugins as this host, else a folder written for that node alone (``for_node`` in the ledger: a
patch in mode file here and plugin there, as seed 000 patched node A's files and injected the same
change into node B, whose site-packages the serving user could not write), carried to the node
(:mod:`llmtrial.patch.node_patches`).
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.ledger import Action, Entry, Ledger, replay
from llmtrial.core.record_models import Plugin
from llmtrial.host.nodes import Node
from llmtrial.patch.node_patches import carry_plugin
from llmtrial.patch.patchdata import (
    PLUGIN_GROUP,
    PLUGIN_MARK,
    PLUGIN_PACKAGE,
    PLUGIN_VERSION,
    EnabledPatch,
    Patch,
    PatchError,
    entry_point_name,
    load_patch,
    record_form,
)

__all__ = ["NodePatches", "is_plugin_dir", "install_plugin", "ray_runtime_env", "server_env", "node_plugin_env"]

log = logging.getLogger(__name__)


def is_plugin_dir(path: Path) -> bool:
    return (path / PLUGIN_MARK).is_file()


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


def install_plugin(patches: list[Patch], ledger: Ledger, plugin_dir: Path, *, for_node: str | None = None) -> Plugin:
    """Write the plugin folder (ledger first) and check that its entry points are found; ``for_node``: a
    folder written for that node alone, not live here. On failure the ledger's entry stays open: the caller
    reverts (all or none)."""
    plugin_dir = plugin_dir.resolve()
    for p in patches:
        if p.hook is None:
            raise PatchError(f"patch {p.name} has no hook for mode plugin")
    entry_points = {p.entry_point: f"{PLUGIN_PACKAGE}.{p.module}:register" for p in patches}
    names = [p.name for p in patches]
    ledger.append(Action.PATCH_PLUGIN, patches=names, dir=str(plugin_dir), entry_points=entry_points, for_node=for_node)
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
        if not is_plugin_dir(plugin_dir):
            raise PatchError(f"{plugin_dir} exists and is not a plugin folder of llmtrial: not replaced")
        shutil.rmtree(plugin_dir)
    os.replace(tmp, plugin_dir)
    found = {ep.name: ep.value for d in md.distributions(path=[str(plugin_dir)]) for ep in d.entry_points
             if ep.group == PLUGIN_GROUP}
    if found != entry_points:
        raise PatchError(f"{plugin_dir}: entry points found {found}, expected {entry_points}")
    ledger.append(Action.PATCH_APPLIED, mode="plugin", patches=names, dir=str(plugin_dir), for_node=for_node)
    log.info("plugin folder %s%s: entry points %s", plugin_dir, f" (for node {for_node})" if for_node else "",
             entry_points)
    return Plugin(dir=str(plugin_dir), entry_points=entry_points,
                  ray=ray_runtime_env(str(plugin_dir), [p.flag for p in patches]))


def server_env(env: Mapping[str, str], plugin_dir: str | None, patches: Sequence[EnabledPatch], *,
               inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment with the plugin folder first on PYTHONPATH (mode plugin) and
    the plugins added to a VLLM_PLUGINS allow-list when one is set. ``env`` is added to
    ``inherited``, what the server inherits (default this process's environment; for a
    rank on another node, what its node adds)."""
    out = dict(env)
    if not plugin_dir:
        return out
    inherited = os.environ if inherited is None else inherited
    path = out.get("PYTHONPATH", inherited.get("PYTHONPATH", ""))
    out["PYTHONPATH"] = os.pathsep.join([plugin_dir, *([path] if path else [])])
    allow = out.get("VLLM_PLUGINS", inherited.get("VLLM_PLUGINS"))
    if allow is not None:
        names = [n for n in allow.split(",") if n]
        wanted = [entry_point_name(p.name) for p in patches if p.mode == "plugin"]
        out["VLLM_PLUGINS"] = ",".join(names + [n for n in wanted if n not in names])
    return out


def _node_folder(ledger: Ledger, node: Node, names: list[str], work_dir: Path) -> Path:
    """The plugin folder written here for ``node`` alone with patches ``names``: the one still open in the
    ledger for it when it holds those patches, else a new one (ledger first)."""
    folder = (Path(work_dir) / f"plugin-for-{node.name}").resolve()
    state = replay(ledger.entries())
    open_dirs = {e.dir for e in state.open("patches") if e.action == Action.PATCH_PLUGIN and e.for_node == node.name
                 and sorted(e.patches or []) == sorted(names)}
    if str(folder) in open_dirs and is_plugin_dir(folder) and _applied(ledger.entries(), str(folder)):
        return folder
    install_plugin([load_patch(name) for name in names], ledger, folder, for_node=node.name)
    return folder


def _applied(entries: list[Entry], directory: str) -> bool:
    return any(e.action == Action.PATCH_APPLIED and e.dir == directory for e in entries)


def _reached_by_file(ledger: Ledger, node: Node, names: set[str]) -> set[str]:
    """The patches among ``names`` (mode file here) whose patched files ``node`` reads as this host wrote them: a
    site-packages on a file system both share (a venv on NFS), which the file patch changed for the node too. A
    plugin there would apply the same change twice."""
    files = [e for e in replay(ledger.entries()).open("patches")
             if e.action == Action.PATCH_FILE and set(e.patches or []) & names]
    if not files:
        return set()
    there = node.sha256([str(e.file) for e in files], timeout=60.0)
    same = {e.file: (h := there.get(str(e.file))) is not None and record_form(bytes.fromhex(h)) == e.after_hash
            for e in files}
    return {n for n in names if all(same[e.file] for e in files if n in (e.patches or []))}


@dataclass(frozen=True)
class NodePatches:
    """What each node of a configuration spanning several serves with, by node name: its environment, and the
    patches in the mode they have there (what the review of its log reads)."""

    envs: dict[str, dict[str, str]]
    patches: dict[str, list[EnabledPatch]]


def node_plugin_env(ledger: Ledger, nodes: list[Node], plugin_dir: str | None, patches: Sequence[EnabledPatch],
                    spec_env: Mapping[str, str], *, trial: str, work_dir: Path) -> NodePatches:
    """Each node's serving environment and patches, by node name, for a configuration spanning ``nodes``
    (the first one this host): each other node gets the patches in the mode the trial file gives it
    (:meth:`EnabledPatch.on`; mode file where its vLLM files are this host's, patched: a shared file system);
    its plugins (this host's folder ``plugin_dir`` when they are this host's, else
    a folder written for the node under ``work_dir``) carried there (ledger first) and put first on that
    node's PYTHONPATH, with the patches' allow-list, as :func:`server_env` does here; ``spec_env`` (the
    patches' flags) on every node. A rank's environment is added to its node's own ``env``, so that is
    what it inherits."""
    first, *others = nodes
    here = sorted(p.name for p in patches if p.mode == "plugin")
    out = NodePatches(envs={first.name: server_env(spec_env, plugin_dir, patches)}, patches={first.name: list(patches)})
    for node in others:
        there = [p.on(node.name) for p in patches]
        moved = {p.name for p, q in zip(patches, there, strict=True) if p.mode == "file" and q.mode == "plugin"}
        shared = _reached_by_file(ledger, node, moved) if moved else set()
        if shared:
            log.info("%s reads this host's patched vLLM files (a shared file system): %s in mode file there too, "
                     "no plugin", node.label(), ", ".join(sorted(shared)))
        there = [p if p.name in shared else q for p, q in zip(patches, there, strict=True)]
        wanted = sorted(p.name for p in there if p.mode == "plugin")
        folder = (Path(plugin_dir) if plugin_dir and wanted == here else
                  _node_folder(ledger, node, wanted, work_dir) if wanted else None)
        copy = carry_plugin(ledger, node, folder, trial=trial) if folder else None
        out.envs[node.name] = server_env(spec_env, copy, there, inherited=dict(node.env))
        out.patches[node.name] = there
    return out
