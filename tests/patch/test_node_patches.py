"""A mode-plugin patch on every node (llmtrial.patch.node_patches) on two hosts made on this machine
(tests/hosts.py): the real plugin folder of the demo patch, written by the patch stage on
host A, carried to host B and verified there, reused while it verifies, put on B's ranks'
PYTHONPATH, and removed on B by cleanup from the ledger alone, run on host A as `snakemake
cleanup` runs after a `kill -9`. No vLLM process starts."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from llmtrial.core.ledger import Action, Entry, Ledger, current_run
from llmtrial.core.paths import TrialPaths
from llmtrial.core.records import check_record
from llmtrial.core.trial_config import PatchBlock
from llmtrial.host.nodes import NodeError
from llmtrial.lifecycle.cleanup import outstanding
from llmtrial.lifecycle.ledger_tables import patches_table
from llmtrial.patch.node_patches import PLUGIN_FOLDER, carry_plugin, plugin_files
from llmtrial.patch.patchdata import PLUGIN_GROUP, PatchError, entry_point_name, load_patch
from llmtrial.patch.patching import apply_patches, ensure_patched, live_patches
from llmtrial.patch.plugin import node_plugin_env

DEMO = "demo-worker-log"
FLAG = "LLMTRIAL_DEMO_WORKER_LOG"
#: run_cleanup on host A in a fresh process, as `snakemake cleanup` runs it, as this test's run.
CLEANUP = ("import json, sys; from llmtrial.lifecycle.cleanup import run_cleanup; "
           "print(run_cleanup(sys.argv[1], stop_timeout=5, run=sys.argv[2]).model_dump_json(exclude_unset=True))")
#: On a node: the vllm.general_plugins entry points its Python finds on its PYTHONPATH.
ENTRY_POINTS = ("import json, sys; from importlib.metadata import entry_points; "
                "print(json.dumps(sorted(ep.name for ep in entry_points(group=sys.argv[1]))))")


def node_b(hosts, **ssh):
    return dataclasses.replace(hosts.node_b(**ssh), python=sys.executable)  # shared filesystem: the venv's Python


def plugin_here(tmp_path) -> tuple[Ledger, Path]:
    """The patch stage on host A in mode plugin: the trial's ledger and the plugin folder."""
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    record = apply_patches({DEMO: PatchBlock(mode="plugin")}, ledger=ledger, work_dir=tmp_path / "patches")
    return ledger, Path(record.patches[0].plugin.dir)


def of(ledger: Ledger, action: Action) -> list[Entry]:
    return [e for e in ledger.entries() if e.action == action]


@pytest.mark.slow
def test_the_plugin_is_carried_to_node_b_verified_reused_on_its_path_and_removed_there_by_cleanup(hosts, tmp_path):
    ledger, plugin = plugin_here(tmp_path)
    b = node_b(hosts)
    there = carry_plugin(ledger, b, plugin, trial="t1")
    assert there == str(hosts.staging_b / PLUGIN_FOLDER / "t1")
    files = plugin_files(plugin)
    assert any(rel.endswith("entry_points.txt") for rel in files) and len(files) >= 4
    on_b = b.sha256([f"{there}/{rel}" for rel in files])
    assert {rel: on_b[f"{there}/{rel}"] for rel in files} == files
    [copy] = of(ledger, Action.PATCH_PLUGIN_COPY)
    assert (copy.node, copy.dir, copy.patches, copy.source) == ("b", there, [DEMO], str(plugin))
    assert copy.reach["ssh"]["address"] == hosts.addr_b
    [mark] = of(ledger, Action.PATCH_PLUGIN_COPIED)
    assert (mark.copy_id, mark.node, mark.files) == (copy.id, "b", files)

    assert carry_plugin(ledger, b, plugin, trial="t1") == there  # verifies: reused, nothing new
    assert len(of(ledger, Action.PATCH_PLUGIN_COPY)) == 1
    # the node's copy leaves this host's patches as they are: live here, not applied again
    assert {n: (e.mode, e.dir) for n, e in live_patches(ledger.entries()).items()} == {DEMO: ("plugin", str(plugin))}
    assert not ensure_patched({DEMO: PatchBlock(mode="plugin")}, ledger=ledger, work_dir=tmp_path / "patches").reapplied

    (Path(there) / next(rel for rel in files if rel.endswith(".py") and "__init__" not in rel)).write_text("# changed")
    patches = [load_patch(DEMO).enabled("plugin")]
    env = node_plugin_env(ledger, [hosts.node_a(), b], str(plugin), patches, {FLAG: "1"}, trial="t1",
                          work_dir=tmp_path / "patches").envs
    assert len(of(ledger, Action.PATCH_PLUGIN_COPY)) == 2  # B's copy no longer verified: copied again
    on_b = b.sha256([f"{there}/{rel}" for rel in files])
    assert {rel: on_b[f"{there}/{rel}"] for rel in files} == files
    assert env["a"]["PYTHONPATH"].split(os.pathsep)[0] == str(plugin) and env["a"][FLAG] == "1"
    assert env["b"] == {FLAG: "1", "PYTHONPATH": there}
    found = b.run([b.python, "-c", ENTRY_POINTS, PLUGIN_GROUP], timeout=60, check=True, env=env["b"])
    assert entry_point_name(DEMO) in json.loads(found.stdout)  # what vLLM's plugin loader finds on B

    rows = [r for r in patches_table(ledger.entries()) if r.copy_of]
    assert [(r.node, r.target, r.copy_of) for r in rows] == [("b", there, str(plugin))] * 2
    assert all(r.applied_at and r.reverted_at is None for r in rows)

    record = hosts.python_on_a(CLEANUP, str(tmp_path), current_run())
    assert record["restored"] and not Path(there).exists() and not plugin.exists()
    check_record(record, "cleanup")
    assert [(p.get("node"), p["action"]) for p in record["patches_reverted"]] == [("b", "removed"), (None, "removed")]
    [undo] = of(ledger, Action.PATCH_PLUGIN_COPY_REMOVED)
    assert (undo.node, undo.dir, undo.outcome) == ("b", there, "removed")
    assert sorted(undo.undoes) == sorted(e.id for e in of(ledger, Action.PATCH_PLUGIN_COPY))
    assert {(r["node"], r["revert_outcome"]) for r in record["patches"]} == {("b", "removed"), ("local", "removed")}
    assert outstanding(ledger.entries())["patches"] == []
    assert hosts.python_on_a(CLEANUP, str(tmp_path), current_run())["patches_reverted"] == []  # nothing left


@pytest.mark.slow
def test_a_patch_in_mode_file_here_is_a_plugin_written_for_node_b_alone_and_carried_there(hosts, tmp_path):
    """Seed 000: the patch in mode file on node A (the patch stage's, not applied here: this test changes no
    installed file) and as a plugin on node B, whose site-packages the serving user could not write. A's servers
    get no plugin; B's ranks get a folder written for B alone, which is not live here and is removed by cleanup."""
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    block = PatchBlock(mode="file", nodes={"b": "plugin"})
    [patch] = [load_patch(DEMO).enabled("file", default=block.mode, nodes=block.nodes)]
    assert (patch.mode, patch.on("b").mode, patch.on("c").mode) == ("file", "plugin", "file")
    b = node_b(hosts)
    served = node_plugin_env(ledger, [hosts.node_a(), b], None, [patch], {FLAG: "1"}, trial="t4",
                             work_dir=tmp_path / "patches")
    env = served.envs
    assert env["a"] == {FLAG: "1"}  # no plugin on A: the file patch is its change
    assert [(p.name, p.mode) for p in served.patches["b"]] == [(DEMO, "plugin")]
    there = env["b"]["PYTHONPATH"]
    [written] = of(ledger, Action.PATCH_PLUGIN)
    assert (written.for_node, written.patches, written.dir) == ("b", [DEMO], str(tmp_path / "patches" / "plugin-for-b"))
    [copy] = of(ledger, Action.PATCH_PLUGIN_COPY)
    assert (copy.node, copy.source, copy.dir) == ("b", written.dir, there)
    found = b.run([b.python, "-c", ENTRY_POINTS, PLUGIN_GROUP], timeout=60, check=True, env=env["b"])
    assert entry_point_name(DEMO) in json.loads(found.stdout)
    assert live_patches(ledger.entries()) == {}  # B's folder is not a patch of this host's

    again = node_plugin_env(ledger, [hosts.node_a(), b], None, [patch], {FLAG: "1"}, trial="t4",
                            work_dir=tmp_path / "patches")
    assert again.envs == env and len(of(ledger, Action.PATCH_PLUGIN)) == 1  # the folder and its copy reused
    record = hosts.python_on_a(CLEANUP, str(tmp_path), current_run())
    assert [(p.get("node"), p["action"]) for p in record["patches_reverted"]] == [("b", "removed"), (None, "removed")]
    assert not Path(written.dir).exists() and not Path(there).exists() and outstanding(ledger.entries())["patches"] == []


@pytest.mark.slow
def test_a_node_cleanup_cannot_reach_is_a_residue_naming_it_and_its_copy_stays_outstanding(hosts, tmp_path):
    ledger, plugin = plugin_here(tmp_path)
    with pytest.raises(NodeError, match=r"^node b \(ssh root@"):
        carry_plugin(ledger, node_b(hosts, identity_file=str(hosts.wrong_key)), plugin, trial="t2")
    assert of(ledger, Action.PATCH_PLUGIN_COPY) == []  # nothing written: nothing was changed on B

    there = carry_plugin(ledger, node_b(hosts), plugin, trial="t2")
    path = TrialPaths(tmp_path).ledger
    path.write_text(path.read_text().replace(str(hosts.key), str(hosts.wrong_key)))
    record = hosts.python_on_a(CLEANUP, str(tmp_path), current_run())
    [residue] = record["residues"]
    assert (residue["node"], residue["what"], residue["kind"]) == ("b", there, "file") and not record["restored"]
    assert "Permission denied (publickey)" in residue["seen"] and Path(there).is_dir()
    check_record(record, "cleanup")
    assert of(ledger, Action.PATCH_PLUGIN_COPY_REMOVED) == []
    [left] = outstanding(ledger.entries())["patches"]
    assert (left.action, left.node, left.dir) == (Action.PATCH_PLUGIN_COPY, "b", there)

    path.write_text(path.read_text().replace(str(hosts.wrong_key), str(hosts.key)))
    again = hosts.python_on_a(CLEANUP, str(tmp_path), current_run())
    assert again["restored"] and not Path(there).exists()
    assert outstanding(ledger.entries())["patches"] == []


@pytest.mark.slow
def test_a_folder_on_the_node_that_is_no_plugin_folder_is_never_replaced_nor_removed(hosts, tmp_path):
    ledger, plugin = plugin_here(tmp_path)
    theirs = hosts.staging_b / PLUGIN_FOLDER / "t3"
    theirs.mkdir(parents=True)
    (theirs / "keep.txt").write_text("someone else's")
    with pytest.raises(PatchError, match="is not a plugin folder of llmtrial: not replaced"):
        carry_plugin(ledger, node_b(hosts), plugin, trial="t3")
    assert of(ledger, Action.PATCH_PLUGIN_COPY) == [] and (theirs / "keep.txt").read_text() == "someone else's"
    ledger.append(Action.PATCH_PLUGIN_COPY, node="b", reach=node_b(hosts).describe(), dir=str(theirs),
                  patches=[DEMO], source=str(plugin))
    record = hosts.python_on_a(CLEANUP, str(tmp_path), current_run())
    [residue] = record["residues"]
    assert residue["node"] == "b" and residue["seen"].startswith("it holds no llmtrial plugin dist-info")
    assert (theirs / "keep.txt").is_file()
