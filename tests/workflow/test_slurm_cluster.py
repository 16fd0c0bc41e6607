"""The one-node SLURM the SLURM profile's tests run on (tests/slurm_cluster.py): its node name, its
one GPU, scancel, and that it leaves nothing behind."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import slurm_cluster as helper
from conftest import wait_until
from slurm_cluster import (
    ETC,
    KILL_WAIT,
    LINKED,
    PREFIX,
    SlurmCluster,
    SlurmUnavailable,
    clean_stale,
    leftovers,
    slurm_cluster,
)

pytestmark = [pytest.mark.hostwide, pytest.mark.long]  # a SLURM of this machine's, with its /etc/slurm links and daemons


def until(what: str, check: Callable[[], object], timeout: float = 60) -> object:
    """``check()``'s first true result (a guard against hanging only: a job starts in a second or two on an idle
    machine)."""
    return wait_until(check, what, timeout=timeout, poll=0.1)


def submit(cluster: SlurmCluster, *args: str) -> str:
    proc = cluster.run("sbatch", "--parsable", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    return next((j for j in cluster.jobs() if j["id"] == job_id), {})


def sleeps(cluster: SlurmCluster, job_id: str) -> list[psutil.Process]:
    procs = []
    for proc in cluster.job_processes(job_id):
        try:
            if proc.cmdline() == ["sleep", "300"]:
                procs.append(proc)
        except psutil.Error:
            pass
    return procs


def test_teardown_leaves_nothing_even_when_the_body_raised():
    """First in the module, so that where no other cluster holds /etc/slurm (the session's starts with
    the next test) it makes the links too, and shows them removed; otherwise a cluster without them."""
    link_etc = not any((ETC / name).exists() or (ETC / name).is_symlink() for name in LINKED)
    with pytest.raises(RuntimeError, match="the body failed"), slurm_cluster(link_etc=link_etc) as cluster:
        assert [os.readlink(p) for p in cluster.links] == ([str(cluster.root / n) for n in LINKED] if link_etc else [])
        job_id = submit(cluster, "--chdir", str(cluster.root), "--wrap", "sleep 300 & sleep 300")
        until("both sleeps of the job", lambda: len(sleeps(cluster, job_id)) == 2)
        raise RuntimeError("the body failed")
    assert leftovers(cluster.root) == []
    assert not cluster.job_processes(job_id)
    assert not [n for n in LINKED if (ETC / n).is_symlink() and os.readlink(ETC / n).startswith(str(cluster.root))]
    # how long bring-up and teardown took is the machine's business (about 1.5 s each on an idle one): shown
    print(f"cluster setup {cluster.setup_s:.1f} s, teardown {cluster.teardown_s:.1f} s", file=sys.stderr)


def test_clean_stale_removes_what_a_dead_run_left(tmp_path: Path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    parent, etc = tmp_path, tmp_path / "etc"
    etc.mkdir()
    dead = parent / f"{PREFIX}{gone.pid}-0-abcdefgh"
    live = parent / f"{PREFIX}{os.getpid()}-0-abcdefgh"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "slurm.conf").write_text("")
    (etc / "slurm.conf").symlink_to(dead / "slurm.conf")
    (etc / "gres.conf").symlink_to(live / "slurm.conf")
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=dead, start_new_session=True)
    try:
        until("the planted process", lambda: psutil.Process(daemon.pid).cwd() == str(dead), timeout=10)
        removed = clean_stale(parent=parent, etc=etc)
        assert daemon.wait(timeout=10) is not None
    finally:
        daemon.kill()
    assert set(removed) == {f"process {daemon.pid}", str(etc / "slurm.conf"), str(dead)}
    assert not dead.exists() and live.exists() and (etc / "gres.conf").is_symlink()


def test_a_failed_bring_up_says_why_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(helper, "_topology", lambda: "CPUs=2 RealMemory=lots")
    try:
        with slurm_cluster(link_etc=False):
            pytest.fail("a cluster came up with an invalid node line")
    except SlurmUnavailable as exc:
        message = str(exc)
    if "not idle" not in message:
        pytest.skip(message)  # this machine cannot make any cluster
    assert re.search(r"slurm(ctld|d-llmtrial-n1) exited 1", message) and "RealMemory value (lots) is not a valid number" in message
    root = Path(re.search(rf"/run/{PREFIX}\S+", message).group(0).rstrip(":"))
    assert leftovers(root) == []


#: A process that makes a cluster, starts a job in it and sleeps until it is killed.
CRASHING = Path(__file__).parents[1] / "programs" / "crashing_cluster.py"


def test_the_next_cluster_removes_what_a_killed_run_left():
    """A process killed (SIGKILL) inside its cluster leaves the daemons and a job running: the next
    cluster's clean_stale removes them, and the folder."""
    crashing = subprocess.Popen([sys.executable, str(CRASHING)],
                                stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([crashing.stdout], [], [], 90)
        line = crashing.stdout.readline().split() if ready else []
        if len(line) != 3:
            pytest.skip(f"no cluster in a fresh process (exit {crashing.poll()})")
        cluster, job_id = SlurmCluster(root=Path(line[0]), conf=Path(line[1])), line[2]
        until("the job's processes", lambda: cluster.job_processes(job_id))
    finally:
        crashing.kill()
        crashing.wait(timeout=10)
    assert leftovers(cluster.root), "the killed run left nothing to clean"
    assert str(cluster.root) in clean_stale()
    assert leftovers(cluster.root) == []
    assert not cluster.job_processes(job_id)


def test_gpu_job_runs_on_the_named_node(slurm: SlurmCluster, tmp_path: Path):
    assert os.readlink(ETC / "slurm.conf") == str(slurm.conf)
    proc = slurm.run("sbatch", "--wait", "--gpus=1", "--chdir", str(tmp_path), "-o", "job.log",
                     "--wrap", "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES > out", timeout=60)
    assert proc.returncode == 0, proc.stderr + (tmp_path / "job.log").read_text()
    assert (tmp_path / "out").read_text().split() == [slurm.node, "0"]
    assert slurm.node == "llmtrial-n1"


def test_the_gpu_is_scheduled_once(slurm: SlurmCluster):
    first = submit(slurm, "--gpus=1", "--chdir", "/tmp", "-o", "/dev/null", "--wrap", "sleep 300")
    second = ""
    try:
        until("the first job running", lambda: job(slurm, first).get("state") == "RUNNING")
        second = submit(slurm, "--gpus=1", "--chdir", "/tmp", "-o", "/dev/null", "--wrap", "sleep 60")
        # the scheduler's verdict on the second, once it gave one (sched_interval=1: a busy slurmctld takes longer)
        until("the second job judged", lambda: job(slurm, second).get("reason") not in (None, "None"))
        assert job(slurm, first)["state"] == "RUNNING"
        assert {k: job(slurm, second)[k] for k in ("state", "reason")} == {"state": "PENDING", "reason": "Resources"}
        assert slurm.run("scancel", first).returncode == 0
        until("the second job running once the first is gone", lambda: job(slurm, second).get("state") == "RUNNING")
    finally:
        slurm.run("scancel", first, *([second] if second else []))
    slurm.wait_idle(timeout=KILL_WAIT + 60)  # a guard against hanging only


#: A batch shell and its background child that each wait on a ``sleep 300`` and note a SIGTERM in a file of
#: their own; SIGKILL (KillWait after SIGTERM) would leave no file. The child only gets SIGTERM if scancel
#: signals every process of the job: the batch shell does not pass it on. The batch shell's trap waits for the
#: child before it exits: once the batch shell is gone the step's processes are SIGKILLed at once, and under
#: load the child's own trap may not have run yet.
TRAPPED = ("sh -c 'trap \"touch child.term; exit 0\" TERM; sleep 300 & wait' & "
           "trap 'touch shell.term; wait; exit 0' TERM; sleep 300 & wait")
TERMS = ["child.term", "shell.term"]


def test_scancel_ends_the_job_and_its_processes(slurm: SlurmCluster, tmp_path: Path):
    job_id = submit(slurm, "--chdir", str(tmp_path), "-o", "/dev/null", "--wrap", TRAPPED)
    try:
        until("both sleeps of the job", lambda: len(sleeps(slurm, job_id)) == 2)
        assert slurm.run("scancel", job_id).returncode == 0
        until("no sleep of the job", lambda: not sleeps(slurm, job_id))
        # SIGTERM reached both, the batch shell's child too: each trap leaves a file. A trap runs its touch once
        # the signal has ended its wait, so the files may come a moment after the sleeps are gone; waited for
        # (KillWait gives each shell that long before SIGKILL)
        until("a file from each trap", lambda: sorted(p.name for p in tmp_path.glob("*.term")) == TERMS,
              timeout=KILL_WAIT + 30)
        until("the job cancelled", lambda: job(slurm, job_id).get("state") == "CANCELLED")
    finally:
        slurm.run("scancel", job_id)


def test_a_second_cluster_with_links_is_refused(slurm: SlurmCluster):
    with pytest.raises(SlurmUnavailable, match="one SLURM test cluster with /etc/slurm links"), slurm_cluster():
        pass
    assert os.readlink(ETC / "slurm.conf") == str(slurm.conf)


def test_slurm_reads_the_host_lists_as_the_workflow_does(slurm: SlurmCluster):
    from llmtrial.host.slurm_hosts import expand_hostlist

    for text in ("gpu[07-08]", "gpu[07-08,11],login2", "n[001-003]", "a100-[8-10]", "llmtrial-n1"):
        shown = slurm.run("scontrol", "show", "hostnames", text)
        assert shown.returncode == 0 and shown.stdout.split() == expand_hostlist(text), (text, shown.stderr)
    refused = slurm.run("scontrol", "show", "hostnames", "n[001-003]-ib")
    assert "Invalid hostlist" in refused.stderr and not refused.stdout  # a suffix: tests/host/test_slurm_hosts.py refuses it too


def test_a_host_slurm_has_down_is_named_with_its_reason_and_sent_no_job(slurm: SlurmCluster,
                                                                          monkeypatch: pytest.MonkeyPatch):
    """A cleanup reaching a SLURM node as a job of its own (outside the allocation) asks SLURM for the host's state
    first: srun would queue a job for a down host until it came back, and run it then, unasked."""
    from llmtrial.host.nodes import Node, NodeError, unavailable
    from llmtrial.host.slurm_hosts import node_state

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    node = Node(name="b", reach="slurm", slurm_host=slurm.node)
    assert node_state(slurm.node).available and unavailable(node) is None
    reason = "llmtrial test: set down"
    assert slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=down", f"reason={reason}").returncode == 0
    try:
        state = node_state(slurm.node)
        assert state.state.startswith("DOWN") and state.reason.startswith(reason) and not state.available, state
        with pytest.raises(NodeError, match=f"node b \\(SLURM host {slurm.node}\\): SLURM has host {slurm.node} DOWN"):
            node.run(["true"], timeout=60)
        assert not [j for j in slurm.jobs() if j["state"] == "PENDING"]  # nothing queued for the down host
    finally:
        assert slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume").returncode == 0
    until("the host back", lambda: node_state(slurm.node).available)
    assert node.run(["sh", "-c", "echo $SLURMD_NODENAME"], timeout=60).stdout.split() == [slurm.node]
