"""A real two-node SLURM on this machine: one slurmd in each host of tests/hosts.py.

Host A and host B are two network namespaces joined by a veth pair. The cluster's controller and
node ``llmtrial-a``'s slurmd run on host A (``NodeAddr`` its address), node ``llmtrial-b``'s slurmd
on host B; one munge key, one partition (tests/slurm_cluster.py with two :class:`SlurmNode`). Every
SLURM client runs on host A, the cluster's login node too, as the trial's snakemake does.

On it, config/trials/two-nodes-slurm.yaml (tensor parallel 2, one rank per node, real vLLM, CPU
build) runs through profiles/slurm three times in one results folder: served to its report beside a
copy whose rank on b is killed mid-benchmark; again, its login snakemake killed and its allocation
cancelled once b's rank serves, then `snakemake cleanup` from host A; and with node b on another
Python, which the preflight in the allocation refuses. About four and a half minutes here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SNAKEFILE, alone_with_the_stale_check, free_base_port, wait_until
from hosts import INTERFACE, SSHD, TwoHosts, two_hosts
from llmtrial.core.cleanup_model import CleanupRecord
from llmtrial.core.ledger import Entry, Ledger
from llmtrial.core.records import load_record
from llmtrial.host.nodes import Node
from llmtrial.host.process_groups import group_members, port_open
from llmtrial.lifecycle.cleanup import outstanding
from slurm_cluster import SlurmCluster, SlurmNode, SlurmUnavailable, leftovers, slurm_cluster
from workflow_helpers import SNAKEMAKE, open_pass

pytestmark = [pytest.mark.hostwide, pytest.mark.stale_check, pytest.mark.long]  # a SLURM of this machine's, with its /etc/slurm links and daemons

NODES = ("llmtrial-a", "llmtrial-b")


def inside(ns: str) -> tuple[str, ...]:
    """The argv prefix that runs a command in network namespace ``ns`` and nothing else of it: slurmd needs this
    machine's /sys/fs/cgroup, which ``ip netns exec``'s fresh /sys mount hides."""
    return ("nsenter", f"--net=/run/netns/{ns}")


@contextlib.contextmanager
def two_node_slurm(subnet: str = "10.231.9", port: int = 2229,
                   link_etc: bool = True) -> Iterator[tuple[TwoHosts, SlurmCluster]]:
    """Hosts A and B (tests/hosts.py) with a SLURM of one node on each, removed on exit (the cluster first,
    then the hosts), also when the body raised; ``link_etc`` as :func:`slurm_cluster`'s."""
    with two_hosts(subnet=subnet, port=port) as h:
        nodes = [SlurmNode(NODES[0], h.addr_a, inside(h.ns_a)), SlurmNode(NODES[1], h.addr_b, inside(h.ns_b))]
        with slurm_cluster(nodes=nodes, link_etc=link_etc) as c:
            yield h, c


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[TwoHosts, SlurmCluster]]:
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing: `make test` installs openssh-server (as root)")
    try:
        with two_node_slurm() as made:
            yield made
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))


def test_each_node_runs_its_tasks_in_its_own_host(cluster, tmp_path: Path):
    h, c = cluster
    out = tmp_path / "where"
    show = f"echo $SLURMD_NODENAME $(ip -4 -o addr show {INTERFACE} | awk '{{print $4}}') >> {out}.$SLURM_PROCID"
    run = c.run("srun", "--nodes=2", "--ntasks=2", "bash", "-c", show, timeout=60)
    assert run.returncode == 0, run.stderr + c.log_tail()
    assert sorted((tmp_path / f"where.{rank}").read_text().split() for rank in (0, 1)) == [
        [NODES[0], f"{h.addr_a}/24"], [NODES[1], f"{h.addr_b}/24"]]


def test_a_step_of_a_two_node_allocation_reaches_its_second_node(cluster, tmp_path: Path):
    """As the trial's host group does from its first node: a step on the second node of its own allocation."""
    _, c = cluster
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n"
                      f"echo $SLURMD_NODENAME $SLURM_JOB_NODELIST > {tmp_path}/batch\n"
                      f"srun --jobid=$SLURM_JOB_ID --overlap --nodes=1 --ntasks=1 --nodelist={NODES[1]} "
                      f"bash -c 'echo $SLURMD_NODENAME' > {tmp_path}/step\n")
    run = c.run("sbatch", "--wait", "--nodes=2", "--exclusive", f"--output={tmp_path}/out", str(script), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr + (tmp_path / "out").read_text() + c.log_tail()
    assert (tmp_path / "batch").read_text().split() == [NODES[0], ",".join(NODES)]
    assert (tmp_path / "step").read_text().split() == [NODES[1]]


def test_the_two_node_cluster_leaves_nothing_behind_even_when_the_body_raised():
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing")
    with pytest.raises(RuntimeError, match="the body failed"), two_node_slurm(
            subnet="10.231.10", port=2230, link_etc=False) as (h, c):  # beside the module's cluster
        root, namespaces = c.root, (h.ns_a, h.ns_b)
        assert c.run("sbatch", "--nodes=2", "--wrap", "sleep 600").returncode == 0
        raise RuntimeError("the body failed")
    assert leftovers(root) == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [ns for ns in namespaces if ns in listed]


#: Quiets the services given as JSON (argv 2) for the trial at argv 1, on the node SLURM runs it on.
QUIET_HERE = ("import json, sys; from pathlib import Path; from llmtrial.host.services import quiet_host; "
              "quiet_host(Path(sys.argv[1]), json.loads(sys.argv[2]))")


def test_a_cleanup_of_changes_both_nodes_made_undoes_each_on_its_node_and_sends_none_on(cluster, tmp_path: Path):
    """A trial's jobs run on whichever node of the allocation SLURM gives each (a quiet on b, the rest on a, in one
    run here), so both nodes can have changes open. The cleanup from the login side sends one cleanup to each node,
    which undoes that node's own and sends none on: sent on, a's would send one to b, b's one back to a, without end
    (a run of the flake hunt had 450 of them when it was stopped, the machine's memory spent)."""
    h, c = cluster
    results = tmp_path / "results" / "both"
    for n, node in zip("ab", NODES, strict=True):
        flag = tmp_path / f"gate-{n}.up"
        flag.touch()
        service = {k: v for k, v in gate(flag, n).items() if k != "node"}  # on the node the quiet runs on
        quiet = c.run("srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", sys.executable, "-c", QUIET_HERE,
                      str(results), json.dumps({f"gate-{n}": service}), timeout=120)
        assert quiet.returncode == 0 and not flag.exists(), quiet.stdout + quiet.stderr
    quieted = [e for e in entries_of_results(results) if e.action == "service_quiet"]
    assert sorted((e.machine, e.service["name"]) for e in quieted) == [(NODES[0], "gate-a"), (NODES[1], "gate-b")]
    try:
        done = subprocess.run(h.on_a([sys.executable, "-m", "llmtrial.cli", "cleanup", str(results)]), cwd=REPO,
                              env=c.env(), capture_output=True, text=True, timeout=300)
    finally:
        c.run("scancel", "--name=llmtrial-cleanup-both")  # what a cleanup that never ends would have left queued
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert said.count("sending the cleanup there") == 2, said[-3000:]  # to a and to b, and from neither on
    restored = [e for e in entries_of_results(results) if e.action == "service_restored"]
    assert sorted((e.machine, e.undoes) for e in restored) == sorted((e.machine, e.id) for e in quieted)
    assert (tmp_path / "gate-a.up").exists() and (tmp_path / "gate-b.up").exists()
    assert {kind: changes for kind, changes in outstanding(entries_of_results(results)).items() if changes} == {}


# ---- the two-node trial served through the profile (real vLLM, CPU build)

TRIAL_FILE = REPO / "config" / "trials" / "two-nodes-slurm.yaml"
CONFIGURATION = "tp2-two-nodes"
KILLED = "tp2-two-nodes-b-killed"  # the same again, its rank on node b killed mid-benchmark
PROFILE = str(REPO / "profiles" / "slurm")
#: Faster status checks than the profile's (MinJobAge is 300 s here, so squeue still sees ended jobs).
QUICK = ("--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2")


def gate(flag: Path, node: str) -> dict:
    """A command service on ``node``: up while ``flag`` exists."""
    return {"kind": "command", "node": node, "status": ["test", "-e", str(flag)], "stopped_exit_codes": [1],
            "stop": ["rm", "-f", str(flag)], "start": ["touch", str(flag)]}


def trial_config(h: TwoHosts, work: Path) -> dict:
    """config/trials/two-nodes-slurm.yaml on the two hosts: node a the allocation's first host (address and
    interface on the veth pair), node b its second; one service to quiet on each; this test's ports."""
    config = yaml.safe_load(TRIAL_FILE.read_text())
    config["staging_dir"] = str(work / "staging")
    config["serving"]["base_port"] = free_base_port(18900, 1)
    config["nodes"]["a"].update(address=h.addr_a, interface=INTERFACE, env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    config["nodes"]["b"].update(address=h.addr_b, interface=INTERFACE, python=sys.executable,
                                staging_dir=str(h.staging_b), env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    config["configurations"][KILLED] = {**config["configurations"][CONFIGURATION],
                                        "description": "The same, its rank on node b killed mid-benchmark."}
    config["services"] = {f"gate-{n}": gate(work / f"gate-{n}.up", n) for n in ("a", "b")}
    # passes of several seconds, so that the kill lands inside one whatever the machine's speed (the trial file's 8
    # prompts can end between two polls)
    config["scenarios"]["c2"]["num_prompts"] = 48
    config["slurm"] = {"runtime_min": 20, "setup_runtime_min": 10}
    return config


@dataclass
class Served:
    """The trial's run as the login side saw it."""

    run: subprocess.CompletedProcess[str] | None = None
    wall_s: float = 0.0
    shown: str = ""  # `scontrol show job` of the allocation while it ran
    killed: str = ""  # the pass in flight when the KILLED configuration's rank on b was killed
    squeue: list[dict[str, str]] = field(default_factory=list)  # its squeue row while it ran


def submit_and_watch(h: TwoHosts, c: SlurmCluster, work: Path, config_path: Path, seen: Served) -> None:
    cmd = h.on_a([SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(work), "--profile", PROFILE,
                  "--configfile", str(config_path), *QUICK, "--verbose"])
    started = time.monotonic()
    with subprocess.Popen(cmd, cwd=REPO, env=c.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
        reader.start()
        while proc.poll() is None:
            assert time.monotonic() - started < 1500, f"not done in 1500 s: {c.jobs()}"
            seen.killed = seen.killed or kill_b_rank_in_flight(work)
            running = [r for r in c.jobs() if r["state"] == "RUNNING" and not r["name"].startswith("llmtrial-")]
            if running and not seen.shown:
                seen.squeue = running
                seen.shown = c.run("scontrol", "show", "job", running[0]["id"]).stdout
            time.sleep(0.25)
        reader.join(timeout=30)
    seen.wall_s = time.monotonic() - started
    seen.run = subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "")


def kill_b_rank_in_flight(work: Path) -> str:
    """SIGKILL the KILLED configuration's rank on node b (its process group, from the ledger) once one of its passes
    is in flight, whatever the machine's speed; the pass's name, or "" while none is."""
    results = work / "results" / "two-nodes-slurm"
    if not (results / "ledger.jsonl").exists():
        return ""
    rank = [e for e in entries_of(work) if e.action == "group_started" and e.label == f"two-nodes-slurm/{KILLED} rank 1"]
    running = open_pass(results / "configs" / KILLED / "telemetry.csv") if rank else None
    if running is None:
        return ""
    os.killpg(rank[-1].pgid, signal.SIGKILL)
    return running


@pytest.fixture(scope="module")
def served(cluster, tmp_path_factory) -> Iterator[tuple[Path, Served]]:
    h, c = cluster
    work = tmp_path_factory.mktemp("slurm-two-nodes")
    for n in ("a", "b"):
        (work / f"gate-{n}.up").touch()
    path = work / "trial.yaml"
    path.write_text(json.dumps(trial_config(h, work)))
    seen = Served()
    with alone_with_the_stale_check():  # its preflight checks both hosts for stale vLLM and rank processes
        submit_and_watch(h, c, work, path, seen)
    print(f"two-node SLURM trial took {seen.wall_s:.0f} s; squeue: {seen.squeue}", file=sys.stderr)
    yield work, seen


def entries_of_results(results: Path) -> list[Entry]:
    return Ledger(results / "ledger.jsonl").entries()


def entries_of(work: Path) -> list[Entry]:
    return entries_of_results(work / "results" / "two-nodes-slurm")


@pytest.mark.e2e
@pytest.mark.workflow
def test_the_two_node_trial_is_served_in_one_allocation_of_both_nodes(served):
    work, seen = served
    [call] = [line for line in seen.run.stdout.splitlines() if line.startswith("sbatch call: ")]
    assert {"--nodes=2", "--ntasks=2"} <= set(call.split(" --wrap=")[0].split()), call
    assert seen.run.returncode == 0, seen.run.stdout[-5000:]
    assert "NumNodes=2" in seen.shown and f"NodeList={','.join(NODES)}" in seen.shown, seen.shown
    assert [r["nodes"] for r in seen.squeue] == [",".join(NODES)]
    results = work / "results" / "two-nodes-slurm"
    record = load_record(results / "configs" / CONFIGURATION / "record.json", "configuration")
    assert record.status == "ok", record.failure
    assert [(n.name, n.role, n.reach, n.slurm_host) for n in record.nodes] == [
        ("a", "api server", "local", NODES[0]), ("b", "headless", "slurm", NODES[1])]
    assert record.collective.ok and [len(s.pass_results) for s in record.scenarios] == [2]  # c2, two passes
    assert (results / "report.html").exists()


@pytest.mark.e2e
@pytest.mark.workflow
def test_each_change_names_its_node_and_cleanup_undid_each_on_its_node(served):
    work, _ = served
    entries = entries_of(work)
    # the host group's jobs wrote the ledger, each naming the node SLURM ran it on (either: the allocation has both);
    # each change on b names b's SLURM host
    assert {e.machine for e in entries} <= set(NODES)
    on_b = {e.action: Node.from_reach("b", e.reach).slurm_host for e in entries if e.node == "b" and e.reach}
    assert on_b == {action: NODES[1] for action in ("weights_staged", "service_quiet", "patch_plugin_copy",
                                                    "group_launch")}, on_b
    ranks = [e for e in entries if e.action == "group_launch" and e.node == "b"]
    assert sorted(e.label for e in ranks) == sorted(f"two-nodes-slurm/{name}{what}" for name in (CONFIGURATION, KILLED)
                                                    for what in (" rank 1", "/telemetry"))
    assert {kind: changes for kind, changes in outstanding(entries).items() if changes} == {}
    cleanup = load_record(work / "results" / "two-nodes-slurm" / "cleanup" / "record.json", "cleanup")
    assert cleanup.restored and cleanup.residues == []
    assert sorted(s.name for s in cleanup.services_restored) == ["gate-a", "gate-b"]
    assert (work / "gate-a.up").exists() and (work / "gate-b.up").exists()


@pytest.mark.e2e
@pytest.mark.workflow
def test_node_bs_rank_killed_mid_benchmark_fails_its_configuration_naming_the_node(served):
    work, seen = served
    assert seen.killed, "no pass of the killed configuration was in flight"
    results = work / "results" / "two-nodes-slurm"
    record = load_record(results / "configs" / KILLED / "record.json", "configuration")
    assert record.status == "failed" and record.failure.phase == "benchmark"
    assert f"node b (SLURM host {NODES[1]})" in record.failure.message, record.failure.message
    assert f"during scenario c2 ({seen.killed})" in record.failure.message
    assert record.failure.error_line.pattern == "peer_lost"  # what the API server on a logged of its lost peer
    assert not port_open("127.0.0.1", record.server.port)
    entries = entries_of(work)
    killed = [e for e in entries if e.action == "group_launch" and KILLED in e.label]
    undone = {e.undoes for e in entries if e.action == "group_stopped"}
    assert {e.node for e in killed} == {"a", "b"} and all(e.id in undone for e in killed)
    assert load_record(results / "configs" / CONFIGURATION / "record.json", "configuration").status == "ok"


@dataclass
class Cancelled:
    """The second run: its login snakemake killed and its allocation cancelled mid-configuration, then the
    submitting side's `snakemake cleanup`."""

    job: str = ""
    pgids: list[int] = field(default_factory=list)  # the run's server and ranks, by the ledger
    cleanup: subprocess.CompletedProcess[str] | None = None


@pytest.fixture(scope="module")
def cancelled(cluster, served) -> Iterator[tuple[Path, Cancelled]]:
    h, c = cluster
    work, _ = served
    config = json.loads((work / "trial.yaml").read_text())
    del config["configurations"][KILLED]
    path = work / "again.yaml"
    path.write_text(json.dumps(config))
    before = len(entries_of(work))
    argv = [SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(work), "--profile", PROFILE,
            "--configfile", str(path), *QUICK]
    seen = Cancelled()
    with alone_with_the_stale_check():  # its preflight checks both hosts for stale vLLM and rank processes
        with open(work / "again.out", "w") as out:  # all again: the first run's cleanup deleted the weights on both nodes
            proc = subprocess.Popen(h.on_a([*argv, "--forceall"]), cwd=REPO, env=c.env(),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def serving() -> list[Entry]:
            assert proc.poll() is None, (work / "again.out").read_text()[-3000:]
            return [e for e in entries_of(work)[before:] if e.action == "group_started" and e.label.endswith("rank 1")]
        wait_until(serving, "the second run's rank on node b", timeout=600, poll=1)
        seen.job = next(r["id"] for r in c.jobs() if r["state"] == "RUNNING" and not r["name"].startswith("llmtrial-"))
        os.killpg(proc.pid, signal.SIGKILL)  # the login session is lost: no onerror
        proc.wait(timeout=30)
        assert c.run("scancel", seen.job).returncode == 0
        new = entries_of(work)[before:]
        seen.pgids = [int(e.pgid) for e in new if e.action in ("server_started", "group_started")]
        wait_until(lambda: not c.job_processes(seen.job, seen.pgids),
                   f"SLURM's kill of job {seen.job}'s processes (the servers aside)", timeout=180, poll=1)
        seen.cleanup = subprocess.run(h.on_a([*argv, "cleanup"]), cwd=REPO, env=c.env(), capture_output=True, text=True,
                                      timeout=600)
    yield work, seen


@pytest.mark.e2e
@pytest.mark.workflow
def test_scancel_mid_configuration_then_snakemake_cleanup_leaves_nothing_on_either_node(cancelled):
    work, seen = cancelled
    record = nothing_left(work, seen.cleanup, seen.pgids)
    said = seen.cleanup.stdout + seen.cleanup.stderr
    assert f"made on node {NODES[0]}: sending the cleanup there (srun --nodes=1 --ntasks=1 --nodelist={NODES[0]}" in said
    assert sorted(s.name for s in record.left_behind.services) == ["gate-a", "gate-b"]
    assert all(s.restored_by_run == record.run for s in record.left_behind.services)


def nothing_left(work: Path, done: subprocess.CompletedProcess[str], pgids: list[int]) -> CleanupRecord:
    """The on-demand cleanup ``done`` gave everything back: its record restored and without residues, the run's
    server and ranks (``pgids``) gone, nothing open in the ledger, both services up. Its record."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = load_record(work / "results" / "two-nodes-slurm" / "cleanup" / "on-demand.json", "cleanup")
    assert record.restored and record.residues == []
    assert pgids and all(group_members(pgid) == [] for pgid in pgids)  # API server on a, ranks on b
    assert {kind: changes for kind, changes in outstanding(entries_of(work)).items() if changes} == {}
    assert (work / "gate-a.up").exists() and (work / "gate-b.up").exists()
    return record


@dataclass
class NodeLost:
    """The third run: node b set down in SLURM while its configuration runs, then, once b is back, the
    submitting side's `snakemake cleanup`."""

    run: subprocess.CompletedProcess[str] | None = None  # the login snakemake's, its onerror's cleanup included
    down: str = ""  # `scontrol show node` of b while it was down
    on_error: CleanupRecord | None = None  # the cleanup that ran while b was down
    pgids: list[int] = field(default_factory=list)  # the run's server and ranks, by the ledger
    cleanup: subprocess.CompletedProcess[str] | None = None  # `snakemake cleanup` once b was back


@pytest.fixture(scope="module")
def node_lost(cluster, cancelled) -> Iterator[tuple[Path, NodeLost]]:
    h, c = cluster
    work, _ = cancelled
    before = len(entries_of(work))
    argv = [SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(work), "--profile", PROFILE,
            "--configfile", str(work / "again.yaml"), *QUICK]
    seen = NodeLost()
    with alone_with_the_stale_check():  # its preflight checks both hosts for stale vLLM and rank processes
        with open(work / "lost.out", "w") as out:  # all again: the last cleanup deleted the weights on both nodes
            # --rerun-incomplete: the second run's login snakemake was killed with its jobs' outputs marked incomplete
            proc = subprocess.Popen(h.on_a([*argv, "--forceall", "--rerun-incomplete"]), cwd=REPO, env=c.env(),
                                    stdout=out, stderr=subprocess.STDOUT, text=True)

        def serving() -> list[Entry]:
            assert proc.poll() is None, (work / "lost.out").read_text()[-3000:]
            return [e for e in entries_of(work)[before:] if e.action == "group_started" and e.label.endswith("rank 1")]
        wait_until(serving, "the third run's rank on node b", timeout=600, poll=1)
        try:
            assert c.run("scontrol", "update", f"nodename={NODES[1]}", "state=down", f"reason={LOST}").returncode == 0
            seen.down = c.run("scontrol", "--oneliner", "show", "node", NODES[1]).stdout
            proc.wait(timeout=900)  # the job fails with its node; the login side's onerror cleans up
            seen.run = subprocess.CompletedProcess(proc.args, proc.returncode, (work / "lost.out").read_text(), "")
            seen.on_error = load_record(work / "results" / "two-nodes-slurm" / "cleanup" / "on-error.json", "cleanup")
        finally:
            c.run("scontrol", "update", f"nodename={NODES[1]}", "state=resume")
        new = entries_of(work)[before:]
        seen.pgids = [int(e.pgid) for e in new if e.action in ("server_started", "group_started")]
        wait_until(lambda: "IDLE" in c.run("sinfo", "--noheader", "--nodes", NODES[1], "--format=%T").stdout.upper(),
                   f"{NODES[1]} back in SLURM", timeout=120, poll=1)
        seen.cleanup = subprocess.run(h.on_a([*argv, "cleanup"]), cwd=REPO, env=c.env(), capture_output=True, text=True,
                                      timeout=600)
    yield work, seen


#: The reason node b is set down with.
LOST = "llmtrial test: node lost mid-configuration"


@pytest.mark.e2e
@pytest.mark.workflow
def test_node_b_lost_mid_configuration_keeps_its_changes_as_residues_naming_it(node_lost):
    """Cleanup of node a still runs; what the trial changed on b stays in the ledger, each a residue that
    names b and says SLURM has it down."""
    work, seen = node_lost
    assert "State=DOWN" in seen.down, seen.down
    assert seen.run.returncode != 0
    record = seen.on_error
    assert not record.restored
    on_b = [r for r in record.residues if r.node == "b"]
    assert on_b and on_b == record.residues, record.residues
    assert {r.kind for r in on_b} >= {"process", "file", "service"}, on_b  # b's rank, plugin folder, gate-b
    assert all(f"SLURM has host {NODES[1]} DOWN" in r.seen and LOST in r.seen for r in on_b), on_b
    assert f"on b: node b (SLURM host {NODES[1]}): SLURM has host {NODES[1]} DOWN" in seen.run.stdout
    # gate-a started again on a; gate-b not started (its node is down), nothing waited for it
    assert sorted((s.name, s.healthy) for s in record.services_restored) == [("gate-a", True), ("gate-b", False)]
    assert (work / "gate-a.up").exists()


@pytest.mark.e2e
@pytest.mark.workflow
def test_a_cleanup_once_node_b_is_back_finishes_its_changes_and_leaves_nothing(node_lost):
    work, seen = node_lost
    record = nothing_left(work, seen.cleanup, seen.pgids)
    assert "gate-b" in [s.name for s in [*record.services_restored, *record.left_behind.services]]


#: A second Python of this machine, of another patch level than the venv's (Debian's).
OTHER_PYTHON = "/usr/bin/python3"


@pytest.mark.workflow
def test_the_preflight_in_the_allocation_refuses_a_node_with_another_python_naming_it(cluster, tmp_path: Path):
    """Seed 000: Ray refused a worker of another Python patch level. The preflight of both nodes, in the allocation,
    stops the trial before anything on either node changed."""
    h, c = cluster
    other = subprocess.run([OTHER_PYTHON, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True, check=False).stdout.strip()
    mine = ".".join(map(str, sys.version_info[:3]))
    if not other or other == mine:
        pytest.skip(f"no second Python of another patch level than {mine} at {OTHER_PYTHON}")
    config = trial_config(h, tmp_path)
    config["nodes"]["b"]["python"] = OTHER_PYTHON
    del config["configurations"][KILLED]
    path = tmp_path / "trial.yaml"
    path.write_text(json.dumps(config))
    run = subprocess.run(h.on_a([SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path), "--profile",
                                 PROFILE, "--configfile", str(path), *QUICK]), cwd=REPO, env=c.env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode != 0
    log = (tmp_path / "results" / "two-nodes-slurm" / "logs" / "preflight.log").read_text()
    assert f"nodes: python_patch_level: Python differs across nodes: a {mine}, b {other};" in log, log[-2000:]
    changed = {e.action for e in Ledger(tmp_path / "results" / "two-nodes-slurm" / "ledger.jsonl").entries()}
    assert changed <= {"cleanup_start", "cleanup_done"}  # the submitting side's onerror; nothing changed
