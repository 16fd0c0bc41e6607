"""Staged weights on every node (llmtrial.weights.node_weights) on two hosts made on this machine
(tests/hosts.py): the first node's model copied to host B and verified there, reused when B
holds it already, and cleanup undoing each copy on host B from the ledger alone, run as
`snakemake cleanup` would be on host A."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import alone_with_the_stale_check, written
from llmtrial.core.ledger import Action, Ledger, current_run
from llmtrial.core.paths import TrialPaths
from llmtrial.core.record_models import ManifestRecord
from llmtrial.core.records import check_record
from llmtrial.core.trial_config import SourceBlock, WeightsBlock
from llmtrial.host.nodes import NodeError
from llmtrial.weights.manifest import MANIFEST_NAME, build_manifest
from llmtrial.weights.node_weights import copy_to_nodes, stage_on_nodes
from workflow_helpers import default_config, snakemake, write_config

#: run_cleanup on host A as `snakemake cleanup` runs it (with the weights' policy), as this test's run.
CLEANUP = ("import json, sys; from llmtrial.lifecycle.cleanup import run_cleanup; "
           "print(run_cleanup(sys.argv[1], stop_timeout=5, weights=True, run=sys.argv[2]).model_dump_json(exclude_unset=True))")
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\x00" * 4096, "sub/tokenizer.json": b"{}"}


def staged_here(hosts, trial: str) -> dict:
    """A model folder staged on host A (<staging_a>/<trial>/tiny) with its manifest inside."""
    folder = hosts.staging_a / trial / "tiny"
    if (folder / MANIFEST_NAME).is_file():
        return ManifestRecord.model_validate_json((folder / MANIFEST_NAME).read_text())
    for rel, data in FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    manifest = build_manifest(folder, source=SourceBlock(kind="local", path=str(folder)))
    (folder / MANIFEST_NAME).write_text(manifest.model_dump_json(exclude_unset=True))
    return manifest


def cleanup_on_a(hosts, results: Path) -> dict:
    return hosts.python_on_a(CLEANUP, str(results), current_run())


def nodes(hosts, **b):
    return [hosts.node_a(), dataclasses.replace(hosts.node_b(**b), python=sys.executable)]


def stage(hosts, tmp_path, trial: str, after: str, **b) -> dict:
    manifest = copy_to_nodes(staged_here(hosts, trial), nodes(hosts, **b), ledger=Ledger(TrialPaths(tmp_path).ledger),
                             trial=trial, model_name="tiny", weights=WeightsBlock(after=after))
    assert isinstance(manifest, ManifestRecord)
    return written(manifest)


@pytest.mark.slow
def test_the_model_is_copied_to_node_b_verified_then_reused_and_deleted_there_by_cleanup(hosts, tmp_path):
    manifest = stage(hosts, tmp_path, "t1", "delete")
    there = hosts.staging_b / "t1" / "tiny"
    b = manifest["nodes"]["b"]
    assert b["model_dir"] == str(there), b
    assert b["verified"] and not b["reused"] and b["copied_from"] == "a"
    assert (b["files"], b["bytes"]) == (3, sum(map(len, FILES.values())))
    assert manifest["nodes"]["a"]["model_dir"] == manifest["model_dir"] and manifest["same_files"]["status"] == "ok"
    assert {rel: (there / rel).read_bytes() for rel in FILES} == FILES and (there / MANIFEST_NAME).is_file()
    check_record(manifest, "manifest")
    [entry] = [e for e in Ledger(TrialPaths(tmp_path).ledger).entries() if e.action == Action.WEIGHTS_STAGED]
    assert (entry.node, entry.path, entry.root, entry.after) == ("b", str(there), str(there.parent), "delete")
    assert entry.reach["ssh"]["address"] == hosts.addr_b

    again = stage(hosts, tmp_path, "t1", "delete")
    assert again["nodes"]["b"]["reused"] and again["nodes"]["b"]["verified"]

    record = cleanup_on_a(hosts, tmp_path)
    [folder] = record["weights"]["folders"]
    assert (folder["node"], folder["action"], folder["files_removed"]) == ("b", "deleted", 4)
    assert record["restored"] and not there.exists() and (hosts.staging_a / "t1" / "tiny").is_dir()
    check_record(record, "cleanup")
    done = [e for e in Ledger(TrialPaths(tmp_path).ledger).entries() if e.action == Action.WEIGHTS_DONE]
    assert [(e.node, len(e.undoes)) for e in done] == [("b", 2)]
    assert cleanup_on_a(hosts, tmp_path)["weights"]["folders"] == []  # nothing left to do


@pytest.mark.parametrize(("after", "left"), [("keep", True), ("archive", False)])
@pytest.mark.slow
def test_keep_leaves_node_bs_copy_and_archive_removes_it(hosts, tmp_path, after, left):
    stage(hosts, tmp_path, f"t-{after}", after)
    record = cleanup_on_a(hosts, tmp_path)
    [folder] = record["weights"]["folders"]
    assert folder["node"] == "b" and folder["action"] == ("kept" if left else "deleted")
    assert (hosts.staging_b / f"t-{after}" / "tiny").is_dir() is left and record["restored"]


@pytest.mark.slow
def test_a_node_cleanup_cannot_reach_is_a_residue_naming_it_and_stays_outstanding(hosts, tmp_path):
    stage(hosts, tmp_path, "t2", "delete")
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    [entry] = [e for e in ledger.entries() if e.action == Action.WEIGHTS_STAGED]
    lines = TrialPaths(tmp_path).ledger.read_text().replace(str(hosts.key), str(hosts.wrong_key))
    TrialPaths(tmp_path).ledger.write_text(lines)
    record = cleanup_on_a(hosts, tmp_path)
    [residue] = record["residues"]
    assert residue["node"] == "b" and residue["what"] == entry.path and not record["restored"]
    assert "Permission denied (publickey)" in residue["seen"] and (hosts.staging_b / "t2" / "tiny").is_dir()
    check_record(record, "cleanup")
    TrialPaths(tmp_path).ledger.write_text(TrialPaths(tmp_path).ledger.read_text().replace(str(hosts.wrong_key),
                                                                                         str(hosts.key)))
    [folder] = cleanup_on_a(hosts, tmp_path)["weights"]["folders"]
    assert folder["action"] == "deleted" and not (hosts.staging_b / "t2" / "tiny").exists()


@pytest.mark.slow
def test_cleanup_refuses_a_node_folder_outside_its_root(hosts, tmp_path):
    outside = hosts.staging_b / "not-the-trials"
    outside.mkdir()
    Ledger(TrialPaths(tmp_path).ledger).append(Action.WEIGHTS_STAGED, node="b", reach=hosts.node_b().describe(),
                                               path=str(outside), root=str(hosts.staging_b / "t3"), after="delete")
    record = cleanup_on_a(hosts, tmp_path)
    [residue] = record["residues"]
    assert residue["node"] == "b" and residue["seen"].startswith("refused: not inside the staging root")
    assert outside.is_dir()


def test_a_copy_that_cannot_reach_node_b_fails_naming_it(hosts, tmp_path):
    with pytest.raises(NodeError, match=r"^node b \(ssh root@"):
        stage(hosts, tmp_path, "t4", "delete", identity_file=str(hosts.wrong_key))


def test_a_trial_without_nodes_keeps_its_manifest_as_it_is(tmp_path):
    manifest = ManifestRecord(model_dir=str(tmp_path), source={}, files=[], total_bytes=0, created="now")
    assert stage_on_nodes(manifest, {"nodes": {}, "staging_dir": "s"}, ledger=Ledger(tmp_path / "l"), trial="t",
                          model_name="m") is manifest
    assert not Path(tmp_path / "l").exists()


@pytest.mark.workflow
@pytest.mark.hostwide  # its stale-process check sees every vLLM this machine runs
@pytest.mark.stale_check
def test_snakemake_stages_on_both_hosts_and_its_cleanup_deletes_node_bs_copy(hosts, tmp_path):
    config = default_config()
    config["trial"] = "mn"
    config["nodes"] = hosts.node_blocks()
    config["configurations"]["tp1"]["nodes"] = ["a", "b"]
    config["patches"] = {"demo-worker-log": {"mode": "plugin"}}  # a file patch cannot reach node b
    config["model"]["weights"] = {"after": "delete"}
    write_config(tmp_path, config)
    paths = TrialPaths.of("mn")
    with alone_with_the_stale_check():
        out = snakemake(tmp_path, "--cores", "1", str(paths.manifest), via=hosts.on_a([]), timeout=300)
    log = (tmp_path / paths.log("preflight")).read_text()
    if out.returncode != 0 and "nodes: stale_processes:" in log and "python_patch_level" not in log:
        pytest.skip("a vLLM of another trial runs on this machine, and both hosts share its processes")
    assert out.returncode == 0, out.stderr[-3000:]
    manifest = json.loads((tmp_path / paths.manifest).read_text())
    there = hosts.staging_b / "mn" / "tiny-llama"
    assert manifest["nodes"]["b"]["model_dir"] == str(there) and manifest["same_files"]["status"] == "ok"
    assert manifest["nodes"]["a"]["model_dir"] == manifest["model_dir"] == str(tmp_path / "staging/mn/tiny-llama")
    assert sorted(p.name for p in there.iterdir()) == sorted([MANIFEST_NAME, *(f["path"] for f in manifest["files"])])
    out = snakemake(tmp_path, "--cores", "1", "cleanup", via=hosts.on_a([]))
    assert out.returncode == 0, out.stderr[-3000:]
    assert not there.exists() and not (tmp_path / "staging/mn/tiny-llama").exists()


def test_the_manifest_copied_to_a_node_is_its_model_with_nodes_and_same_files(tmp_path, monkeypatch):
    """copy_to_nodes without a second host: node b a double whose copy lands as sent."""
    import llmtrial.weights.node_weights as node_weights
    from llmtrial.core.fileio import sha256_file

    folder = tmp_path / "tiny"
    for rel, data in FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    manifest = build_manifest(folder, source=SourceBlock(kind="local", path=str(folder)))

    class NodeB:
        name, staging_dir = "b", "/b/staging"

        def describe(self):
            return {"ssh": {"address": "b"}}

        def sha256(self, paths):
            return {p: None for p in paths}  # nothing there yet

        def label(self):
            return "node b"

    monkeypatch.setattr(node_weights, "_folder", lambda node, op, path, root=None: node_weights.FolderAnswer(path=path))
    monkeypatch.setattr(node_weights, "send_files", lambda node, src, rels, dest: {r: sha256_file(src / r) for r in rels})
    out = copy_to_nodes(manifest, [SimpleNamespace(name="a"), NodeB()], ledger=Ledger(tmp_path / "ledger.jsonl"),
                        trial="t", model_name="tiny")
    assert isinstance(out, ManifestRecord) and written(manifest) == {k: v for k, v in written(out).items()
                                                                     if k not in ("nodes", "same_files")}
    size = sum(map(len, FILES.values()))
    copy_s = out.nodes["b"].copy_s
    assert written(out)["nodes"] == {
        "a": {"model_dir": str(folder), "files": 3, "bytes": size, "copy_s": 0.0, "verified": True, "reused": False,
              "copied_from": None},
        "b": {"model_dir": "/b/staging/t/tiny", "files": 3, "bytes": size, "copy_s": copy_s, "verified": True,
              "reused": False, "copied_from": "a"}}
    assert written(out)["same_files"]["status"] == "ok" and written(out)["same_files"]["name"] == "model_files"
    check_record(out, "manifest")
