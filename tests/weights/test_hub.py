"""Hub staging against the loopback Hub server, with the real huggingface_hub client:
fresh download, rerun, resume after kill -9, faults, corruption, headroom, branch to
commit, archive and restage, delete, residues, offline reuse, the token kept out."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import written
from hub_server import HubServer, model_files
from llmtrial.core.ledger import Ledger
from llmtrial.core.record_models import ManifestRecord
from llmtrial.core.records import load_record
from llmtrial.core.trial_config import DiskBlock, SourceBlock, WeightsBlock
from llmtrial.host.disk import HeadroomError, disk_headroom
from llmtrial.weights import hub as hubmod
from llmtrial.weights.hub import HubError, VerificationError
from llmtrial.weights.manifest import MANIFEST_NAME, verify_manifest
from llmtrial.weights.policy import apply_policy, delete_staged
from llmtrial.weights.staging import stage_model

REPO_ID = "org/tiny-model"
TOKEN = "hf_loopbackSECRETtoken123"
SHARD = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture
def hub(monkeypatch):
    from huggingface_hub import constants

    with HubServer(token=TOKEN, page_size=3) as server:
        # what HF_ENDPOINT sets when huggingface_hub is imported (workflow tests set HF_ENDPOINT)
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield server


def source(**kw):
    return SourceBlock.model_validate({"kind": "hub", "repo_id": REPO_ID, "revision": "main", "retry_backoff_s": 0.05,
                                       "progress_interval_s": 0.05, **kw})


def stage(tmp_path, src=None, *, after="keep", disk=None, trial="t1"):
    ledger = Ledger(tmp_path / "results" / trial / "ledger.jsonl")
    folder = tmp_path / "staging" / trial / "m"
    manifest = stage_model(src or source(), folder, ledger=ledger, root=tmp_path / "staging" / trial,
                           weights=WeightsBlock(after=after, archive_dir=str(tmp_path / "archive")),
                           disk=DiskBlock.model_validate(disk or {"reserve_fraction": 0.0, "reserve_min_gib": 0.0}))
    assert isinstance(manifest, ManifestRecord)
    return written(manifest), folder, ledger


def test_a_fresh_download_is_verified_and_manifested_with_its_commit(hub, tmp_path, caplog):
    files = model_files(1)
    sha = hub.add_commit(REPO_ID, files)
    caplog.set_level(logging.INFO)
    hub.rate = 4 << 20  # slow enough for progress lines
    manifest, folder, ledger = stage(tmp_path)
    assert manifest["hub"]["commit"] == sha and manifest["hub"]["revision"] == "main"
    by_path = {f["path"]: f for f in manifest["files"]}
    assert set(by_path) == set(files)
    for path, data in files.items():
        assert by_path[path]["size"] == len(data)
        assert by_path[path]["sha256"] == hashlib.sha256(data).hexdigest()
        assert (folder / path).read_bytes() == data
    assert verify_manifest(ManifestRecord.model_validate(manifest)) == []
    assert manifest["fetch"]["bytes_downloaded"] == sum(len(d) for d in files.values())
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("staging org/tiny-model@")]
    # the last line states the whole: all bytes and files, a rate in some unit (its figure is the machine's)
    assert progress and re.search(r": 2\.00 MiB of 2\.00 MiB \(100\.0 %\), [\d,.]+ (B|KiB|MiB|GiB)/s, .*"
                                  rf"{len(files)} of {len(files)} files", progress[-1]), progress
    # every request used the commit once it was known
    resolves = [r.path for r in hub.requests if "/resolve/" in r.path]
    assert resolves and all(f"/resolve/{sha}/" in p for p in resolves)
    # the ledger has the staged folder before the first byte, with what cleanup needs
    entry = next(e for e in ledger.entries() if e.action == "weights_staged")
    assert entry.path == str(folder.resolve()) and entry.after == "keep" and entry.commit == sha


def test_a_rerun_fetches_nothing_and_a_rerun_offline_reuses_the_copy(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub.add_commit(REPO_ID, model_files(2))
    first, folder, _ = stage(tmp_path)
    before = len(hub.requests)
    again, _, _ = stage(tmp_path)
    new = hub.requests[before:]
    assert [r for r in new if "/resolve/" in r.path or "/tree/" in r.path] == []
    assert again["files"] == first["files"] and again["fetch"]["bytes_downloaded"] == 0
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    before = len(hub.requests)
    offline, _, _ = stage(tmp_path)
    assert hub.requests[before:] == [] and offline["files"] == first["files"]


def test_faults_are_retried_per_file(hub, tmp_path):
    files = model_files(3)
    hub.add_commit(REPO_ID, files)
    hub.fault(SHARD, "drop", "error", "truncate")
    hub.fault(SHARD2, "error")
    manifest, folder, _ = stage(tmp_path)
    assert verify_manifest(ManifestRecord.model_validate(manifest)) == []
    retried = manifest["fetch"]["retries"]
    assert {r["file"] for r in retried} == {SHARD, SHARD2}
    assert len([r for r in retried if r["file"] == SHARD]) >= 2  # the reset and the 503 at least
    assert not list((folder / hubmod.DOWNLOAD_META).rglob("*.incomplete"))


def test_a_corrupted_file_fails_the_stage_naming_it_and_is_not_left_to_load(hub, tmp_path):
    hub.add_commit(REPO_ID, model_files(4))
    hub.fault(SHARD2, "corrupt")
    with pytest.raises(VerificationError, match=f"{SHARD2}: sha256 [0-9a-f]{{64}}, the Hub says"):
        stage(tmp_path)
    folder = tmp_path / "staging" / "t1" / "m"
    assert not (folder / SHARD2).exists() and (folder / SHARD).exists()
    assert not (folder / MANIFEST_NAME).exists()
    hub.corrupt.clear()  # the Hub fixed; a rerun fetches only the bad file
    gets = len(hub.gets(SHARD))
    manifest, _, _ = stage(tmp_path)
    assert verify_manifest(ManifestRecord.model_validate(manifest)) == [] and len(hub.gets(SHARD)) == gets


def test_short_headroom_refuses_before_any_byte_naming_needed_and_free(hub, tmp_path):
    hub.add_commit(REPO_ID, model_files(5))
    free = disk_headroom(tmp_path, 0, reserve_fraction=0, reserve_min_gib=0).free_bytes
    with pytest.raises(HeadroomError) as err:
        stage(tmp_path, disk={"reserve_fraction": 0.0, "reserve_min_gib": (free + (1 << 30)) / 2**30})
    message = str(err.value)
    assert "needs 0.00 GiB (2,097," in message and "free of" in message and "short by" in message
    assert "staging" in message and "nothing was written" in message
    assert hub.gets() == []
    folder = tmp_path / "staging" / "t1" / "m"
    assert not [p for p in folder.rglob("*") if p.is_file() and p.suffix == ".safetensors"]


def test_a_branch_resolves_to_its_commit_and_a_moved_branch_restages(hub, tmp_path):
    old = hub.add_commit(REPO_ID, model_files(6), tags=("v1",))
    first, folder, _ = stage(tmp_path, source(revision="v1"))
    assert first["hub"]["commit"] == old and first["hub"]["resolved_by"] == "hub"
    new_files = model_files(7, shards=3)
    new = hub.add_commit(REPO_ID, new_files)
    moved, _, _ = stage(tmp_path)
    assert moved["hub"]["commit"] == new != old
    assert sorted(p.name for p in folder.glob("*.safetensors")) == sorted(p for p in new_files if p.endswith(".safetensors"))
    assert verify_manifest(ManifestRecord.model_validate(moved)) == []
    with pytest.raises(HubError, match="revision 'nope' not found"):
        stage(tmp_path, source(revision="nope"))


def test_patterns_select_files(hub, tmp_path):
    hub.add_commit(REPO_ID, model_files(8))
    manifest, folder, _ = stage(tmp_path, source(allow_patterns=["*.json", "*.safetensors"], ignore_patterns=[SHARD2]))
    assert sorted(f["path"] for f in manifest["files"]) == ["config.json", SHARD, "tokenizer.json"]


def test_archive_then_restage_from_the_archive_without_the_hub(hub, tmp_path):
    files = model_files(9)
    sha = hub.add_commit(REPO_ID, files)
    manifest, folder, ledger = stage(tmp_path, after="archive")
    result = apply_policy(ledger.entries(), ledger)
    item = result.folders[0]
    assert item.action == "archived" and not result.residues
    # the weights plus the stage's own small files (manifest, verified list, download metadata)
    assert manifest["total_bytes"] <= result.freed_bytes < manifest["total_bytes"] + (64 << 10)
    assert not folder.exists()
    archive = Path(item.archive)
    assert archive == tmp_path / "archive" / "hub" / "org--tiny-model" / sha
    assert verify_manifest(load_record(archive / MANIFEST_NAME, "manifest")) == []
    # idempotent: a second cleanup changes nothing
    assert apply_policy(ledger.entries(), ledger).folders == []  # the staging's policy is applied once
    hub.stop()  # no Hub at all: a later trial of the same branch restages from the archive
    again, folder2, _ = stage(tmp_path, trial="t2")
    assert again["fetch"]["restaged_from"] == str(archive) and again["hub"]["commit"] == sha
    assert again["hub"]["resolved_by"] == "archive"
    assert verify_manifest(ManifestRecord.model_validate(again)) == [] and folder2 != folder
    assert {f["sha256"] for f in again["files"]} == {hashlib.sha256(d).hexdigest() for d in files.values()}


def test_delete_removes_only_the_staged_folder_and_never_follows_a_link(hub, tmp_path):
    hub.add_commit(REPO_ID, model_files(10))
    manifest, folder, ledger = stage(tmp_path, after="delete")
    outside = tmp_path / "precious.bin"
    outside.write_bytes(b"x" * 1000)
    (folder / "link-out").symlink_to(outside)
    (folder / "dir-out").symlink_to(tmp_path, target_is_directory=True)
    result = apply_policy(ledger.entries(), ledger)
    assert not folder.exists() and outside.read_bytes() == b"x" * 1000
    assert result.freed_bytes >= manifest["total_bytes"] and result.residues == []
    (tmp_path / "elsewhere").mkdir()
    refused = delete_staged(tmp_path / "elsewhere", tmp_path / "staging")
    assert refused.action == "refused" and (tmp_path / "elsewhere").exists()
    escape = tmp_path / "staging" / "t1" / ".." / ".." / "elsewhere"
    assert delete_staged(escape, tmp_path / "staging").action == "refused"


def test_a_file_that_cannot_be_removed_is_a_residue_not_forced(hub, tmp_path):
    hub.add_commit(REPO_ID, model_files(11))
    manifest, folder, ledger = stage(tmp_path, after="delete")
    sub = folder / "ro"
    sub.mkdir()
    (sub / "kept.bin").write_bytes(b"y" * 4096)
    script = ("import json, sys; from llmtrial.core.ledger import Ledger; from llmtrial.weights.policy import apply_policy; "
              "l = Ledger(sys.argv[1]); r = apply_policy(l.entries(), l); "
              "print(json.dumps({'freed_bytes': r.freed_bytes, 'residues': [x.model_dump() for x in r.residues]}))")
    # a read-only mount of one folder, in a mount namespace of the cleanup process only
    argv = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$1" "$1" && exec "$2" -c "$3" "$4"', "sh",
            str(sub), sys.executable, script, str(ledger.path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    result = json.loads(done.stdout)
    residue = next(r for r in result["residues"] if r["what"].endswith("kept.bin"))
    assert residue["size"] == 4096 and "EROFS" in residue["seen"] and "not forced" in residue["seen"]
    assert (sub / "kept.bin").read_bytes() == b"y" * 4096  # untouched
    assert not (folder / SHARD).exists()  # everything else went
    assert result["freed_bytes"] >= manifest["total_bytes"]


def test_kill_9_mid_download_then_a_rerun_fetches_only_what_is_missing(hub, tmp_path):
    hub.add_commit(REPO_ID, model_files(12, shards=2, shard_bytes=24 << 20))  # over 10 MiB: the client writes in 10 MiB chunks
    release = hub.hold(SHARD2)
    folder = tmp_path / "staging" / "t1" / "m"
    code = ("import sys; from pathlib import Path; from llmtrial.core.trial_config import DiskBlock, SourceBlock; "
            "from llmtrial.weights.staging import stage_model; "
            "stage_model(SourceBlock.model_validate_json(sys.argv[1]), Path(sys.argv[2]), "
            "disk=DiskBlock(reserve_fraction=0, reserve_min_gib=0))")
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, source(max_workers=2).model_dump_json(), str(folder)],
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            partial = list((folder / hubmod.DOWNLOAD_META).rglob("*.incomplete")) if folder.exists() else []
            if (folder / SHARD).is_file() and any(p.stat().st_size > 0 for p in partial):
                break
            assert proc.poll() is None, "the stage ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("the download never reached the middle of the second shard")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert list((folder / hubmod.DOWNLOAD_META).rglob("*.incomplete")), "kill -9 leaves a partial file"
    release.set()
    del hub.held[SHARD2]
    shard1_gets = len(hub.gets(SHARD))
    manifest, _, _ = stage(tmp_path)
    assert len(hub.gets(SHARD)) == shard1_gets  # the completed shard was not fetched again
    assert manifest["fetch"]["orphans_removed"] >= 1 and manifest["fetch"]["files_reused"] >= 1
    assert not list((folder / hubmod.DOWNLOAD_META).rglob("*.incomplete"))
    assert verify_manifest(ManifestRecord.model_validate(manifest)) == []


def test_the_token_reaches_no_log_and_no_record(hub, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    hub.add_commit(REPO_ID, model_files(13))
    hub.fault(SHARD, "error")
    manifest, folder, ledger = stage(tmp_path)
    assert manifest["hub"]["token"].startswith("set")
    everything = caplog.text + json.dumps(manifest) + ledger.path.read_text()
    everything += "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file() and p.stat().st_size < 1 << 16)
    assert TOKEN not in everything


def test_without_the_token_the_stage_says_access_is_missing(hub, tmp_path, monkeypatch):
    hub.add_commit(REPO_ID, model_files(14))
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(HubError, match="repository not found, or HF_TOKEN lacks access"):
        stage(tmp_path)


def test_the_planner_reads_config_json_alone_from_the_hub_then_from_the_archive(hub, tmp_path):
    from llmtrial.weights.model_source import model_config_for

    files = model_files(15)
    hub.add_commit(REPO_ID, files)
    expected = json.loads(files["config.json"])
    assert model_config_for(source(), archive_dir=tmp_path / "archive") == expected
    assert hub.gets(SHARD) == [] and hub.gets(SHARD2) == []  # no weights for a plan
    _, _, ledger = stage(tmp_path, after="archive")
    apply_policy(ledger.entries(), ledger)
    hub.stop()
    assert model_config_for(source(), archive_dir=tmp_path / "archive") == expected
    assert model_config_for(source(kind="archive"), archive_dir=tmp_path / "archive") == expected
