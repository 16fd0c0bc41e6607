"""The model stage of the workflow with a hub source, against the loopback Hub server:
refusal on short headroom, kill -9 mid-download then a rerun, archive at cleanup then a
rerun that restages from the archive with no Hub."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import DATA, SNAKEFILE
from hub_server import HubServer, model_files
from llmtrial.core.ledger import Ledger
from llmtrial.core.record_models import ManifestRecord
from llmtrial.host.disk import disk_headroom
from llmtrial.weights.hub import DOWNLOAD_META
from llmtrial.weights.manifest import verify_manifest
from served_trials import REPO_ID, TOKEN, hub_env, hub_source
from workflow_helpers import SNAKEMAKE, default_config, snakemake, write_config

SHARD2 = "model-00002-of-00002.safetensors"

pytestmark = pytest.mark.workflow


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with HubServer(token=TOKEN) as server:
        hub_env(monkeypatch, server, tmp_path / "hf-home")
        yield server


def hub_trial(tmp_path, *, after="keep", disk=None, shard_bytes=1 << 20) -> dict:
    config = default_config()
    config["configurations"] = {"tp1": config["configurations"]["tp1"]}
    config["serving"]["args"]["enforce_eager"] = True  # no torch.compile at start-up: these tests are about the weights
    config["services"] = {}
    config["patches"] = {}  # these tests are about the weights
    config["model"] = hub_source(tmp_path / "archive", after=after)
    config["disk"] = disk or {"reserve_fraction": 0.0, "reserve_min_gib": 0.0}
    write_config(tmp_path, config)
    return config


def stage(tmp_path, *extra: str, timeout: float = 180):
    return snakemake(tmp_path, "--cores", "2", "--until", "stage_model", *extra, timeout=timeout)


def manifest(tmp_path) -> dict:
    return json.loads((tmp_path / "results" / "demo" / "model" / "manifest.json").read_text())


@pytest.mark.hostwide  # 8 MiB of free disk between passing preflight and failing staging: the e2e trials write more
def test_short_headroom_stops_the_workflow_before_any_weight_byte(hub, tmp_path):
    hub.add_commit(REPO_ID, model_files(0, shards=2, shard_bytes=16 << 20))
    free = disk_headroom(tmp_path, 0, reserve_fraction=0, reserve_min_gib=0).free_bytes
    # leave 8 MiB above the reserve: preflight passes, the 32 MiB of weights do not fit
    hub_trial(tmp_path, disk={"reserve_fraction": 0.0, "reserve_min_gib": (free - (8 << 20)) / 2**30})
    done = stage(tmp_path)
    assert done.returncode != 0
    log = (tmp_path / "results" / "demo" / "logs" / "stage_model.log").read_text()
    assert "not enough disk to stage org/loopback-model@" in log and "nothing was written" in log
    assert "needs 0.03 GiB (33,554," in log and "free of" in log and "short by" in log
    assert hub.gets() == []  # not one byte of any file was asked for
    assert not list((tmp_path / "staging").rglob("*.safetensors"))


def test_kill_9_mid_download_then_a_rerun_finishes_without_refetching(hub, tmp_path):
    files = model_files(1, shards=2, shard_bytes=24 << 20)
    hub.add_commit(REPO_ID, files)
    release = hub.hold(SHARD2)
    hub_trial(tmp_path)
    folder = tmp_path / "staging" / "demo" / "m"
    cmd = [SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path), "--cores", "2",
           "--until", "stage_model"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            partial = list((folder / DOWNLOAD_META).rglob("*.incomplete")) if folder.exists() else []
            done = [n for n in files if n != SHARD2 and (folder / n).is_file()]
            if len(done) == len(files) - 1 and any(p.stat().st_size > 0 for p in partial):
                break
            assert proc.poll() is None, "the workflow ended before it could be killed"
            time.sleep(0.1)
        else:
            pytest.fail("the download never reached the middle of the last shard")
        os.killpg(proc.pid, signal.SIGKILL)  # snakemake and its job, as a crash would
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    release.set()
    del hub.held[SHARD2]
    before = {name: len(hub.gets(name)) for name in files}
    snakemake(tmp_path, "--unlock")
    done = stage(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    refetched = [n for n in files if len(hub.gets(n)) > before[n]]
    assert refetched == [SHARD2]
    m = manifest(tmp_path)
    assert verify_manifest(ManifestRecord.model_validate(m)) == [] and m["fetch"]["orphans_removed"] >= 1
    assert m["fetch"]["files_reused"] == len(files) - 1
    assert not list((folder / DOWNLOAD_META).rglob("*.incomplete"))
    log = (tmp_path / "results" / "demo" / "logs" / "stage_model.log").read_text()
    assert "removed 1 partial file" in log or "partial file(s)" in log
    assert TOKEN not in log and TOKEN not in json.dumps(m)


def test_archive_at_cleanup_then_a_rerun_restages_from_the_archive_without_the_hub(hub, tmp_path):
    files = model_files(2)
    sha = hub.add_commit(REPO_ID, files)
    hub_trial(tmp_path, after="archive")
    done = stage(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # a person watching the run sees the download's progress, not only the job log
    assert "fetched and verified config.json" in done.stderr and "of 5 files: done in" in done.stderr
    first = manifest(tmp_path)
    assert first["hub"]["commit"] == sha
    done = snakemake(tmp_path, "cleanup", "--cores", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "results" / "demo" / "cleanup" / "on-demand.json").read_text())
    [item] = record["left_behind"]["weights"]  # staged by the earlier run, archived by this (on-demand) one
    assert item["action"] == "archived" and record["weights"]["freed_bytes"] >= first["total_bytes"]
    assert not (tmp_path / "staging" / "demo" / "m").exists()
    actions = [e.action for e in Ledger(tmp_path / "results" / "demo" / "ledger.jsonl").entries()]
    assert actions.index("weights_staged") < actions.index("weights_archive_start") < actions.index("weights_archived")
    # a configuration rerun now finds its weights gone and says how to restage them
    done = snakemake(tmp_path, "--cores", "2", "results/demo/configs/tp1/record.json", timeout=300)
    assert done.returncode != 0
    job_log = (tmp_path / "results" / "demo" / "logs" / "trial" / "tp1.log").read_text()
    assert "the staged model is not all there" in job_log and "--forcerun stage_model" in job_log
    hub.stop()  # no Hub from here on
    done = stage(tmp_path, "--forcerun", "stage_model")
    assert done.returncode == 0, done.stderr[-3000:]
    again = manifest(tmp_path)
    assert again["fetch"]["restaged_from"] == item["archive"] and again["hub"]["commit"] == sha
    assert verify_manifest(ManifestRecord.model_validate(again)) == []
    assert [f["sha256"] for f in again["files"]] == [f["sha256"] for f in first["files"]]


@pytest.mark.e2e
def test_a_trial_serves_weights_staged_from_the_hub_and_deletes_them_after(hub_plugin_trial):
    """tests/served_trials.py's hub_plugin trial: planned from config.json alone before staging,
    served from the staged copy of the Hub's commit, deleted at cleanup; the token is in no
    record, log or report."""
    run, results, work = hub_plugin_trial["run"], hub_plugin_trial["results"], hub_plugin_trial["work"]
    assert run.returncode == 0, run.stderr[-4000:]
    sha, files = hub_plugin_trial["commit"], hub_plugin_trial["files"]
    record = json.loads((results / "configs" / "tp2" / "record.json").read_text())
    assert record["status"] == "ok" and record["scenarios"][0]["pass_results"][0]["summary"]["completed"] == 4
    assert manifest(work)["hub"]["commit"] == sha
    # planned before staging from config.json alone, and the plan held
    assert record["plan"]["verdict"] == "fits"
    row = next(r for r in record["prediction"] if r["name"] == "KV cache tokens")
    assert row["measured"] == record["startup"]["kv_cache_tokens"]["value"] and abs(row["relative_error"]) < 0.001
    served = record["server"]["argv"]
    assert str((work / "staging" / "demo" / "m").resolve()) in served
    cleanup = json.loads((results / "cleanup" / "record.json").read_text())
    item = cleanup["weights"]["folders"][0]
    assert item["policy"] == "delete" and item["action"] == "deleted" and cleanup["restored"]
    assert item["freed_bytes"] >= sum(len(d) for d in files.values())
    assert not (work / "staging" / "demo" / "m").exists()
    report = (results / "report.html").read_text()
    assert f"commit <code>{sha}</code>" in report and "<td>deleted</td>" in report
    assert TOKEN not in report and all(TOKEN not in p.read_text(errors="replace")
                                       for p in results.rglob("*") if p.is_file() and p.suffix in (".log", ".json", ".jsonl"))


def test_the_plan_of_a_hub_model_rests_on_the_hubs_byte_counts_before_any_download(hub, tmp_path):
    """A quantized model on the Hub: the plan sizes its weights from the Hub's listing at the
    resolved commit (only top-level weight files), fetches config.json alone and no weight byte."""
    files = model_files(4, shards=2, shard_bytes=3 << 20)
    files["model-00002-of-00002.safetensors"] = files["model-00002-of-00002.safetensors"][: 5 << 19]
    cfg = json.loads((DATA / "configs" / "Qwen3-30B-A3B.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                  "activation_scheme": "dynamic"}
    files["config.json"] = json.dumps(cfg).encode()
    files["original/consolidated.00.pth"] = b"\0" * (7 << 20)  # not what vLLM loads
    commit = hub.add_commit(REPO_ID, files)
    config = hub_trial(tmp_path)
    config["hardware"] = {"gpus": 1, "gpu_memory_gib": 80}
    write_config(tmp_path, config)
    done = snakemake(tmp_path, "--cores", "2", "results/demo/plans/tp1.json", timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "results" / "demo" / "plans" / "tp1.json").read_text())
    weights = record["facts"]["weights_bytes"]
    assert weights["value"] == (3 << 20) + (5 << 19)
    assert weights["kind"] == "measured"
    assert weights["source"].startswith(f"Hub file sizes of {REPO_ID}@{commit[:12]} (2 weight files")
    rope = record["facts"]["rope_cache_bytes"]
    assert rope["kind"] == "predicted" and rope["value"] > 0  # vLLM's rotary cache, built on the rank
    assert record["plan"]["weights_bytes_per_rank"] == [weights["value"] + rope["value"]]  # one GPU holds it all
    assert record["verdict"] == "fits"
    assert [r.path for r in hub.gets()] and all(r.path.endswith("config.json") for r in hub.gets())
