"""Trials that the tests of more than one package read. Each is served once per session (its
fixture is in tests/conftest.py) and each package's tests assert what that package owns.

``hub_plugin``: the default trial's tp2 with its weights from the loopback Hub (deleted after),
the demo patch in mode plugin with its flag on, and snakemake under a read-only site-packages.
tests/weights/test_hub_workflow.py reads it for the weights, tests/patch/test_patching.py for the
plugin that reached every vLLM process.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import SNAKEFILE, free_ports
from hub_server import HubServer
from llmtrial.core.ledger import Ledger
from llmtrial.patch.patching import revert_patches, site_root, vllm_distribution
from llmtrial.weights.tiny import generate_tiny_model
from workflow_helpers import SNAKEMAKE, default_config, write_config

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
