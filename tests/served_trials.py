"""Trials that the tests of more than one package read. Each is served once per session (its
fixture is in tests/conftest.py) and each package's tests assert what that package owns.

``hub_plugin``: the default trial's tp2 with its weights from the loopback Hub (deleted after),
the demo patch in mode plugin with its flag on, and snakemake under a read-only site-packages.
tests/weights/test_hub_workflow.py reads it for the weights, tests/patch/test_patching.py for the
plugin that reached every vLLM process.

``sweep``: config/trials/onset-sweep-cpu.yaml (one tp1 server with a 1,024-token KV cache: a
concurrency sweep, then a scenario with a latency target) with the workloads operators bring added
after its own scenarios: ``own`` sends the operator's prompts from a JSONL file (staged and hashed),
``shared`` is vLLM's prefix_repetition dataset, served with prefix caching on by a relaunch of its
own. tests/serve/test_sweep.py reads it for the sweep, tests/workflow/test_workloads.py for the
workloads; one trial run saves the second one's start-ups (about a minute here).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SNAKEFILE, free_base_port, free_ports
from hub_server import HubServer
from llmtrial.core.ledger import Ledger
from llmtrial.patch.patching import revert_patches, site_root, vllm_distribution
from llmtrial.weights.tiny import generate_tiny_model
from workflow_helpers import SNAKEMAKE, default_config, snakemake, write_config

REPO_ID = "org/loopback-model"
TOKEN = "hf_workflowSECRET456"
DEMO = "demo-worker-log"
FLAG = "LLMTRIAL_DEMO_WORKER_LOG"
SITE = site_root(vllm_distribution())
READ_ONLY = 'mount --bind -o ro "$0" "$0" && exec "$@"'


def read_only_site_packages(argv: list[str]) -> list[str]:
    """``argv`` in a mount namespace of its own where site-packages is mounted read-only."""
    return ["unshare", "-m", "sh", "-c", READ_ONLY, str(SITE), *argv]


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: any write shows."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


def hub_env(mp: pytest.MonkeyPatch, server: HubServer, hf_home: Path) -> None:
    """What a trial needs to reach the loopback Hub, set in this process (snakemake inherits it)."""
    mp.setenv("HF_ENDPOINT", server.endpoint)
    mp.setenv("HF_TOKEN", TOKEN)
    mp.setenv("HF_HOME", str(hf_home))
    mp.setenv("HF_HUB_DISABLE_XET", "1")
    mp.delenv("HF_HUB_OFFLINE", raising=False)


def hub_source(archive_dir: Path, after: str = "keep") -> dict:
    """The trial file's ``model`` for the loopback Hub's repository."""
    return {"name": "m", "source": {"kind": "hub", "repo_id": REPO_ID, "revision": "main",
                                    "retry_backoff_s": 0.1, "progress_interval_s": 0.5},
            "weights": {"after": after, "archive_dir": str(archive_dir)}}


def hub_plugin_config(work: Path) -> dict:
    config = default_config()
    tp2 = config["configurations"]["tp2"]
    tp2["env"][FLAG] = "1"
    config["configurations"] = {"tp2": tp2}
    config["patches"] = {DEMO: {"mode": "plugin"}}
    config["services"] = {}
    config["model"] = hub_source(work / "archive", after="delete")
    config["disk"] = {"reserve_fraction": 0.0, "reserve_min_gib": 0.0}
    config["scenarios"] = {"c2": {"concurrency": 2, "num_prompts": 4, "input_len": 32, "output_len": 8, "passes": 1}}
    config["serving"]["base_port"] = free_ports(1)[0]
    config["serving"]["args"]["enforce_eager"] = True  # no torch.compile at start-up: not what these tests are about
    return config


def hub_plugin(tmp_path_factory: pytest.TempPathFactory):
    """Serve the trial once; yield what its tests read: ``work``, ``results``, ``run`` (snakemake's
    completed process), ``commit`` (the Hub's), ``files`` (the model's bytes by path) and
    ``site_before`` (site-packages before the run)."""
    work = tmp_path_factory.mktemp("hub-plugin")
    tiny = generate_tiny_model(tmp_path_factory.mktemp("hub-tiny") / "model", seed=3)
    files = {p.relative_to(tiny).as_posix(): p.read_bytes() for p in sorted(tiny.rglob("*")) if p.is_file()}
    results = work / "results" / "demo"
    with HubServer(token=TOKEN) as server, pytest.MonkeyPatch.context() as mp:  # the Hub's env for this run only
        hub_env(mp, server, work / "hf-home")
        commit = server.add_commit(REPO_ID, files)
        write_config(work, hub_plugin_config(work))
        before = tree_state(SITE)
        argv = [SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(work), "--cores", "all"]
        try:
            run = subprocess.run(read_only_site_packages(argv), capture_output=True, text=True, timeout=900, check=False)
        finally:
            revert_patches(Ledger(results / "ledger.jsonl"))  # whatever happened, vLLM is not left patched
    yield {"work": work, "results": results, "run": run, "commit": commit, "files": files, "site_before": before}


SWEEP_FILE = REPO / "config" / "trials" / "onset-sweep-cpu.yaml"
#: The operator's prompts of scenario ``own``, one JSON object a line in config/prompts.jsonl.
PROMPTS = [f"Question {i}: which word rhymes with {word}, and why?" for i, word in
           enumerate(["cat", "tree", "blue", "stone", "light", "rain", "door", "sand"], start=1)]
#: vLLM's CPU build caches whole KV blocks of 128 tokens: a prefix of two blocks can be found again.
PREFIX_LEN = 256
#: The workloads added to the sweep trial: four output tokens each, at concurrency 2. The shared
#: scenario's two requests hold 6 of the KV cache's 8 blocks at most, so it never preempts.
WORKLOADS = {
    "own": {"dataset": "custom", "prompts": "config/prompts.jsonl", "num_prompts": len(PROMPTS),
            "concurrency": 2, "output_len": 4},
    "shared": {"dataset": "prefix_repetition", "prefix_len": PREFIX_LEN, "input_len": PREFIX_LEN + 32,
               "num_prefixes": 2, "num_prompts": 8, "concurrency": 2, "output_len": 4},
}


def write_prompts(work: Path, lines: list[str]) -> Path:
    """The operator's prompt file at <work>/config/prompts.jsonl, one line each."""
    path = work / "config" / "prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def sweep_with_workloads(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Serve the sweep trial with the workloads once; what its tests read: ``work``, ``run``, ``results``,
    ``config``, ``record`` (tp1's, as written; None when the run failed) and ``prompts`` (the file)."""
    work = tmp_path_factory.mktemp("sweep")
    config = yaml.safe_load(SWEEP_FILE.read_text())
    config["serving"]["base_port"] = free_base_port(18600, 1)
    config["scenarios"].update(WORKLOADS)
    prompts = write_prompts(work, [json.dumps({"prompt": p}) for p in PROMPTS])
    write_config(work, config)
    run = snakemake(work, "--cores", "all", timeout=1200)
    results = work / "results" / config["trial"]
    record = json.loads((results / "configs" / "tp1" / "record.json").read_text()) if run.returncode == 0 else None
    return {"work": work, "run": run, "results": results, "config": config, "record": record, "prompts": prompts}
