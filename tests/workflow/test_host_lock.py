"""Two trials on one host, as two operators start them (two checkouts, one resident demo service):
the second never changes the host while the first holds it, not even after the first was killed
with kill -9, and goes on once `snakemake cleanup` of the first gave the host back. No vLLM: the
trials run to their quiet stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import SNAKEFILE, free_ports, wait_until
from llmtrial.core.hostlock import read_holder
from llmtrial.core.ledger import Ledger
from workflow_helpers import SNAKEMAKE, default_config, demo_service, snakemake, write_config

pytestmark = pytest.mark.workflow

QUIETED = "results/{trial}/services/quieted.json"


def trial_dir(tmp_path: Path, trial: str, services: dict, wait_s: float) -> Path:
    work = tmp_path / trial
    config = default_config()
    config.update(trial=trial, patches={}, services=services)
    config["configurations"] = {"tp1": config["configurations"]["tp1"]}
    config["host_lock"] = {"wait_s": wait_s}  # the path: the test's own (LLMTRIAL_HOST_LOCK, tests/conftest.py)
    write_config(work, config)
    return work


def start(work: Path, target: str) -> subprocess.Popen:
    out = open(work / "snakemake.out", "w")  # noqa: SIM115 - the child writes it
    return subprocess.Popen([SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(work), "--cores", "1",
                             target], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def quieting(work: Path, trial: str, name: str) -> bool:
    entries = Ledger(work / "results" / trial / "ledger.jsonl").entries()
    return any(e.action == "service_quiet" and e.service["name"] == name for e in entries)


def test_a_second_trial_waits_for_the_first_even_killed_and_goes_on_once_its_cleanup_gave_the_host_back(
        tmp_path, own_host_lock):
    port, = free_ports(1)
    demo = demo_service(tmp_path / "demo-state", port)
    subprocess.run(demo["start"], check=True, timeout=60)
    try:
        # trial a quiets the demo service, then a service whose stop hangs; it is killed there (kill -9, every process)
        slow = {"kind": "command", "status": ["true"], "stop": ["sleep", "60"], "start": ["true"]}
        a = trial_dir(tmp_path, "a", {"demo-web": demo, "slow": slow}, wait_s=0)
        first = start(a, QUIETED.format(trial="a"))
        wait_until(lambda: quieting(a, "a", "slow") or first.poll() is not None, "trial a to quiet its services",
                   timeout=180, poll=0.3)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        held = read_holder(own_host_lock)
        assert held.trial == "a" and held.pid == first.pid and not held.alive()
        assert subprocess.run(demo["status"], timeout=30).returncode != 0  # a left it stopped

        # trial b refuses after its wait, naming a, and changes nothing
        b = trial_dir(tmp_path, "b", {"demo-web": demo}, wait_s=2)
        refused = snakemake(b, "--cores", "1", QUIETED.format(trial="b"), timeout=300)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0
        assert "refusing to change the host" in said and "held by trial a" in said and f"pid {first.pid} not running" in said
        assert "`snakemake cleanup`" in said
        b_ledger = Ledger(b / "results" / "b" / "ledger.jsonl")
        assert not [e for e in b_ledger.entries() if e.action in ("service_quiet", "weights_staged", "host_locked")]
        assert subprocess.run(demo["status"], timeout=30).returncode != 0  # b neither recorded nor restarted it

        # trial b again, willing to wait: it waits while a holds the host, and goes on once a's cleanup gave it back
        b = trial_dir(tmp_path, "b", {"demo-web": demo}, wait_s=300)
        second = start(b, QUIETED.format(trial="b"))
        wait_until(lambda: "waiting for the host" in (b / "snakemake.out").read_text() or second.poll() is not None,
                   "trial b to wait for the host", timeout=180, poll=0.3)
        assert second.poll() is None and read_holder(own_host_lock).trial == "a"
        cleanup = snakemake(a, "cleanup", "--cores", "1", timeout=300)
        assert cleanup.returncode == 0, cleanup.stdout[-3000:] + cleanup.stderr[-3000:]
        record = json.loads((a / "results" / "a" / "cleanup" / "on-demand.json").read_text())
        assert record["restored"] and [lock["outcome"] for lock in record["host_lock"]] == ["released"]
        assert second.wait(timeout=300) == 0, (b / "snakemake.out").read_text()[-3000:]
        quiet = json.loads((b / QUIETED.format(trial="b")).read_text())
        [web] = quiet["services"]
        assert web["name"] == "demo-web" and web["was_running"] and web["action"] == "stopped"  # a had given it back
        assert subprocess.run(demo["status"], timeout=30).returncode == 0  # b's own cleanup started it again
        assert read_holder(own_host_lock) is None  # and released the host
        b_entries = Ledger(b / "results" / "b" / "ledger.jsonl").entries()
        assert [e.action for e in b_entries].count("host_locked") == 1
        assert [e.outcome for e in b_entries if e.action == "host_unlocked"] == ["released"]
    finally:
        subprocess.run(demo["stop"], timeout=60)
