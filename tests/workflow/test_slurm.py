"""Trials through a real one-node SLURM (tests/slurm_cluster.py) with `--profile profiles/slurm`.

The default trial (tp1, its scenarios one pass each, eager) runs through the profile, one allocation
for its whole host group, and records what a local run does. Real vLLM (CPU build): about 1.5 minutes.

Then two trials that need no vLLM, submitted at once: the first's quiet stage is killed on the node
while it stops a service (its job's process, as the OOM killer would), the second pends behind it
and stops after its own quiet stage. The first's allocation gives the node back before it ends, so
the second never waits for the host lock: sent from the submitting side after the allocation, that
cleanup would queue behind the second's allocation, which waits for the lock only the cleanup
releases. The second's allocation, a partial run, gives its node back before it ends too.
(scancel mid-configuration then `snakemake cleanup` from the submitting side:
tests/workflow/test_slurm_two_nodes.py, on two nodes.)
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from conftest import REPO, SNAKEFILE, wait_until
from llmtrial.core.ledger import Entry, Ledger
from llmtrial.core.records import load_record
from llmtrial.host.process_groups import port_open
from llmtrial.lifecycle.cleanup import outstanding
from llmtrial.patch.patching import revert_patches
from slurm_cluster import SlurmCluster
from workflow_helpers import NO_VLLM, SNAKEMAKE, default_config

pytestmark = [pytest.mark.e2e, pytest.mark.workflow, pytest.mark.long]

DEMO_PORT = 8190
PROFILE = str(REPO / "profiles" / "slurm")
#: Faster status checks than the profile's (MinJobAge is 300 s here, so squeue still sees ended jobs).
QUICK = ("--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2")


def trial_file(work: Path, name: str, **slurm) -> Path:
    """The default trial, tp1 only, one pass per scenario, eager; named ``name``."""
    config = default_config()
    config["trial"] = name
    del config["configurations"]["tp2"]
    for scenario in config["scenarios"].values():
        scenario.update({"num_prompts": 4, "passes": 1, "warmup": False})
    config["serving"]["args"]["enforce_eager"] = True
    config["slurm"] = {"runtime_min": 20, "setup_runtime_min": 10, **slurm}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    return path


def submit(work: Path, slurm: SlurmCluster, path: Path, *args: str) -> subprocess.Popen:
    cmd = [SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(work), "--profile", PROFILE,
           "--configfile", str(path), *QUICK, *args]
    return subprocess.Popen(cmd, cwd=REPO, env=slurm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@dataclass
class Seen:
    """What the default trial did, watched from the login side."""

    a_out: str = ""
    a_rc: int | None = None
    a_jobs: set[str] = field(default_factory=set)
    a_shown: dict[str, str] = field(default_factory=dict)  # job id -> `scontrol show job`, read as it ended


def ledger(work: Path, trial: str) -> list[Entry]:
    return Ledger(work / "results" / trial / "ledger.jsonl").entries()


def states(slurm: SlurmCluster, names: dict[str, str]) -> dict[str, str]:
    """Each trial's SLURM job state, by the run's job name; ids are collected by the caller."""
    return {trial: row["state"] for row in slurm.jobs() for trial, name in names.items() if row["name"] == name}


def watch_until(proc_done, slurm: SlurmCluster, names: dict[str, str], seen: Seen, timeout: float,
                until=lambda: False) -> None:
    deadline = time.monotonic() + timeout
    while not proc_done() and not until():
        assert time.monotonic() < deadline, f"not done within {timeout} s: {slurm.jobs()}"
        seen.a_jobs |= {r["id"] for r in slurm.jobs() if r["name"] == names.get("demo")}
        time.sleep(1)


def run_name(work: Path, trial: str, timeout: float = 300) -> str:
    """The SLURM job name of a trial's run: the plugin's run id, from its log line."""
    deadline = time.monotonic() + timeout
    log = work / f"{trial}.out"
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith("SLURM run ID: "):
                return line.split(": ", 1)[1].strip()
        time.sleep(0.5)
    raise AssertionError(f"{trial}: no SLURM run id in {log}")


def pump(proc: subprocess.Popen, path: Path) -> None:
    """The snakemake's output into a file as it comes (a background thread)."""
    def copy():
        with path.open("w") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
    threading.Thread(target=copy, daemon=True).start()


@pytest.fixture(scope="module")
def default_trial(slurm: SlurmCluster, tmp_path_factory) -> tuple[Path, Seen]:
    if any(port_open("127.0.0.1", p) for p in (DEMO_PORT, 8100)):
        pytest.skip("the default trial's ports (8190, 8100) are in use here (`make stop-demo-service`?)")
    work = tmp_path_factory.mktemp("slurm")
    demo = [str(Path(SNAKEMAKE).parent / "python"), "-m", "llmtrial.host.demo_service", "--port", str(DEMO_PORT),
            "--state", str(work / ".demo-service")]
    assert subprocess.run([*demo[:3], "start", *demo[3:]], cwd=work, timeout=60).returncode == 0
    seen = Seen()
    try:
        a = submit(work, slurm, trial_file(work, "demo"))
        pump(a, work / "demo.out")
        names = {"demo": run_name(work, "demo")}
        watch_until(lambda: a.poll() is not None, slurm, names, seen, 600)
        seen.a_rc = a.wait(timeout=120)
        seen.a_out = (work / "demo.out").read_text()
        deadline = time.monotonic() + 60
        while states(slurm, names).get("demo") == "COMPLETING":
            assert time.monotonic() < deadline, slurm.jobs()
            time.sleep(0.5)
        seen.a_shown = {job: slurm.run("scontrol", "show", "job", job).stdout for job in seen.a_jobs}
        yield work, seen
    finally:
        revert_patches(Ledger(work / "results" / "demo" / "ledger.jsonl"))  # vLLM is never left patched
        subprocess.run([*demo[:3], "stop", *demo[3:]], cwd=work, timeout=60)


def test_the_default_trial_under_the_slurm_profile_records_what_a_local_run_does(default_trial):
    work, seen = default_trial
    assert seen.a_rc == 0, seen.a_out[-4000:]
    results = work / "results" / "demo"
    assert load_record(results / "configs" / "tp1" / "record.json", "configuration").status == "ok"
    cleanup = load_record(results / "cleanup" / "record.json", "cleanup")
    assert cleanup.restored and cleanup.residues == []
    assert [s.name for s in cleanup.services_restored] == ["demo-web"]
    assert [p.path for p in cleanup.patches_reverted] == ["vllm/v1/worker/cpu_worker.py"]
    assert [row.outcome for row in cleanup.host_lock] == ["released"]
    quiet = load_record(results / "services" / "quieted.json", "quiet")
    assert [(s.name, s.action) for s in quiet.services] == [("demo-web", "stopped")]
    assert (results / "report.html").exists() and "Host lock" in (results / "report.html").read_text()
    entries = ledger(work, "demo")
    # every change was made on SLURM's node, none on the login side (this machine's hostname)
    assert {e.machine for e in entries} == {"llmtrial-n1"} and outstanding_kinds(entries) == {}


def outstanding_kinds(entries: list[Entry]) -> dict:
    return {kind: changes for kind, changes in outstanding(entries).items() if changes}


def test_one_allocation_holds_the_whole_host_group_with_the_trial_files_resources(default_trial):
    work, seen = default_trial
    [job] = seen.a_jobs  # preflight, plan, staging, quiet, patch, tp1 and the cleanup: one SLURM job
    shown = seen.a_shown[job]
    assert "NodeList=llmtrial-n1" in shown and "TimeLimit=00:30:00" in shown  # 10 setup + 1 x 20 minutes
    assert "OverSubscribe=NO" in shown and "JobState=COMPLETED" in shown
    assert "Group job host" in seen.a_out and "Select jobs to execute" in seen.a_out


def test_seed_003_asks_one_allocation_of_four_gpus_for_four_configurations_and_is_refused_here(slurm, tmp_path):
    """The 4-GPU trial of seed 003 (hardware.gpus: 4, four configurations) against this one-GPU node:
    one sbatch for its whole host group, asking what the trial file says; SLURM refuses it before
    anything on the node changed."""
    run = subprocess.run([SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path),
                          "--profile", PROFILE, "--configfile", str(REPO / "config" / "trials" / "seed003-qwen3-235b-4gpu.yaml"),
                          *QUICK, "--verbose"], cwd=REPO, env=slurm.env(), capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    [call] = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("sbatch call: ")]
    argv = call.split(" --wrap=")[0].split()
    assert "--gpus=4" in argv and argv[argv.index("-t") + 1] == "270"  # 30 setup + 4 x 60 minutes
    assert "--exclusive" in argv and "-p" in argv and argv[argv.index("-p") + 1] == "trials"
    entries = Ledger(tmp_path / "results" / "seed003-qwen3-235b" / "ledger.jsonl").entries()
    assert {e.action for e in entries} <= {"cleanup_start", "cleanup_done"}  # onerror's; nothing changed


#: The first no-vLLM trial's stop command for its service, found by its argv on the node and killed with its job.
STUCK_STOP = ["sleep", "613"]


def no_vllm_trial(work: Path, name: str, stop: list[str]) -> Path:
    """A trial of one configuration whose server exits at start-up and one command service, ``gate``: up
    while the file gate.up exists; started with touch, stopped with ``stop``; the host lock a file of the
    test's own, waited on 240 s at most."""
    config = default_config()
    flag = str(work / "gate.up")
    gate = {"kind": "command", "status": ["test", "-e", flag], "stopped_exit_codes": [1], "stop": stop,
            "start": ["touch", flag], "timeouts": {"stop_s": 700}}
    config.update(trial=name, services={"gate": gate}, patches={}, configurations={"noenc": NO_VLLM["noenc"]})
    config["host_lock"] = {"path": str(work / "host-lock.json"), "wait_s": 240}
    config["slurm"] = {"runtime_min": 20, "setup_runtime_min": 10}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    return path


@dataclass
class Stuck:
    """What the two no-vLLM trials did: each one's exit status and output, every SLURM job name seen and each
    trial's job state at each poll."""

    rc: dict[str, int] = field(default_factory=dict)
    out: dict[str, str] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    snapshots: list[dict[str, str]] = field(default_factory=list)
    killed: str = ""

    def watch(self, slurm: SlurmCluster, names: dict[str, str]) -> None:
        rows = slurm.jobs()
        self.names |= {row["name"] for row in rows}
        self.snapshots.append({t: r["state"] for r in rows for t, n in names.items() if r["name"] == n})


@pytest.fixture(scope="module")
def killed_then_next(slurm: SlurmCluster, tmp_path_factory) -> tuple[Path, Stuck]:
    work = tmp_path_factory.mktemp("slurm-stuck")
    (work / "gate.up").touch()
    stuck = Stuck()
    first = submit(work, slurm, no_vllm_trial(work, "stuck", STUCK_STOP))
    pump(first, work / "stuck.out")
    names = {"stuck": run_name(work, "stuck")}

    def stopping() -> psutil.Process | None:
        stuck.watch(slurm, names)
        return next((p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == STUCK_STOP), None)
    try:
        stop = wait_until(stopping, "the quiet stage stopping gate on the node", timeout=300, poll=0.5)
        second = submit(work, slurm, no_vllm_trial(work, "next", ["rm", "-f", str(work / "gate.up")]),
                        "results/next/services/quieted.json")  # a partial run: up to its quiet stage
        pump(second, work / "next.out")
        names["next"] = run_name(work, "next")
        wait_until(lambda: stuck.watch(slurm, names) or stuck.snapshots[-1].get("next") == "PENDING",
                   "the second trial's job pending", timeout=120)
        script = stop.parent()  # the quiet stage's script, a process of the first trial's job
        stuck.killed = " ".join(script.cmdline())
        script.kill()
        for name, proc in (("stuck", first), ("next", second)):
            deadline = time.monotonic() + 600
            while proc.poll() is None:
                assert time.monotonic() < deadline, f"{name} not done in 600 s: {slurm.jobs()}"
                stuck.watch(slurm, names)
                time.sleep(1)
            stuck.rc[name] = proc.returncode
            stuck.out[name] = (work / f"{name}.out").read_text()
        yield work, stuck
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if proc.info["cmdline"] == STUCK_STOP:
                proc.kill()


def test_a_job_killed_on_the_node_is_cleaned_up_there_before_its_allocation_ends(killed_then_next):
    work, stuck = killed_then_next
    assert "quiet_services" in stuck.killed, stuck.killed
    assert stuck.rc["stuck"] != 0
    record = load_record(work / "results" / "stuck" / "cleanup" / "at-allocation-end.json", "cleanup")
    assert record.restored and [s.name for s in record.services_restored] == ["gate"]
    assert [row.outcome for row in record.host_lock] == ["released"]
    entries = ledger(work, "stuck")
    assert {e.machine for e in entries if e.action in ("cleanup_start", "cleanup_done")} == {"llmtrial-n1"}
    # the submitting side's onerror found the node given back: it says so, and sent nothing to the node
    assert "llmtrial cleanup after error: host restored: yes (gate running and healthy)" in stuck.out["stuck"]
    assert "llmtrial-cleanup-stuck" not in stuck.names, stuck.names
    assert outstanding_kinds(entries).keys() <= {"weights"}  # kept for the rerun, as after any failed job


def test_a_second_trial_submitted_at_once_waits_for_the_node_while_the_first_holds_it(killed_then_next):
    _, stuck = killed_then_next
    both = [s for s in stuck.snapshots if "stuck" in s and "next" in s]
    assert any(s["stuck"] == "RUNNING" and s["next"] == "PENDING" for s in both), stuck.snapshots
    assert not any(s.get("stuck") == "RUNNING" and s.get("next") == "RUNNING" for s in stuck.snapshots)


def test_the_trial_behind_it_gets_the_node_with_the_host_lock_free(killed_then_next):
    work, stuck = killed_then_next
    assert stuck.rc["next"] == 0, stuck.out["next"][-4000:]
    assert "waiting for the host" not in stuck.out["next"]
    given_back = max(e.t for e in ledger(work, "stuck") if e.action == "cleanup_done")
    [locked] = [e for e in ledger(work, "next") if e.action == "host_locked"]
    assert locked.t > given_back and locked.earlier is None
    # a partial run (up to its quiet stage): its allocation gave the node back before it ended, too
    cleanup = load_record(work / "results" / "next" / "cleanup" / "at-allocation-end.json", "cleanup")
    assert cleanup.restored and [s.name for s in cleanup.services_restored] == ["gate"]
    assert [row.outcome for row in cleanup.host_lock] == ["released"]
    assert (work / "gate.up").exists() and not (work / "host-lock.json").exists()
