"""A trial across the hosts of a SLURM allocation (config/trials/two-nodes-slurm.yaml), planned and
dry-run: the allocation it asks, each rank's argv under a given node list, the argv cleanup rebuilds
from the ledger after the allocation ended. The one-node SLURM of the tests has no second host to run
it on; SLURM's own reading of host lists is checked against these in tests/workflow/test_slurm_cluster.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SNAKEFILE
from llmtrial.config import check_config, load_config
from llmtrial.host.nodes import Node, NodeError, configuration_nodes
from llmtrial.host.slurm_hosts import (
    JOB_ENV,
    NODELIST_ENV,
    STEP_ENV,
    HostState,
    allocation_hosts,
    expand_hostlist,
    own_job_env,
    remember_allocation,
    srun_argv,
)
from llmtrial.plan.allocation import allocation_nodes, rule_resources
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve.multinode import headless_argv, launch_args
from workflow_helpers import SNAKEMAKE

TRIAL = REPO / "config" / "trials" / "two-nodes-slurm.yaml"

#: Host lists as SLURM writes them in SLURM_JOB_NODELIST, and the hosts `scontrol show hostnames` gives.
HOSTLISTS = {
    "gpu[07-08]": ["gpu07", "gpu08"],
    "gpu[07-08,11],login2": ["gpu07", "gpu08", "gpu11", "login2"],
    "n[001-003]": ["n001", "n002", "n003"],
    "a100-[8-10]": ["a100-8", "a100-9", "a100-10"],
    "llmtrial-n1": ["llmtrial-n1"],
}


@pytest.mark.parametrize("text", sorted(HOSTLISTS))
def test_slurm_host_lists_read_as_scontrol_does(text):
    assert expand_hostlist(text) == HOSTLISTS[text]


@pytest.mark.parametrize("text", ["gpu[07-08", "gpu07]", "gpu[a-b]", "n[001-003]-ib"])  # scontrol: invalid too
def test_a_host_list_that_cannot_be_read_says_so(text):
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(text)


def test_the_two_node_trial_asks_two_hosts_and_node_b_is_the_second(monkeypatch):
    config = load_config(TRIAL)
    assert config["nodes"]["b"]["slurm_index"] == 1 and allocation_nodes(check_config(config)) == 2
    assert rule_resources(check_config(config), "trial")["nodes"] == 2
    assert "nodes" not in rule_resources(check_config(config), "preflight")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    a, b = configuration_nodes(check_config(config), "tp2-two-nodes")  # the login node: no allocation yet
    with pytest.raises(NodeError, match="node b .*no SLURM allocation names its host"):
        b.argv(["true"])


def test_inside_the_allocation_rank_1_runs_headless_on_the_second_host_through_srun(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    a, b = configuration_nodes(check_config(load_config(TRIAL)), "tp2-two-nodes")
    assert (a.address, b.address, b.slurm_host, b.python) == ("gpu07", "gpu08", "gpu08", sys.executable)
    assert b.label() == "node b (SLURM host gpu08)" and b.rank_env()["VLLM_HOST_IP"] == "gpu08"
    args = launch_args([a, b], 1, 29600)
    assert args == {"nnodes": 2, "node_rank": 1, "master_addr": "gpu07", "master_port": 29600, "headless": True}
    serving = ServingArgs.from_config({"tensor_parallel_size": 2, "enforce_eager": True})
    argv = b.argv(headless_argv(b, "/srv/staging/tiny-llama", serving, args))
    assert argv[:8] == ["srun", "--jobid=4242", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu08",
                        sys.executable, "-c"]
    flags = argv[9:]
    assert flags[0] == "/srv/staging/tiny-llama" and "--headless" in flags
    assert flags[flags.index("--master-addr") + 1] == "gpu07" and flags[flags.index("--node-rank") + 1] == "1"
    # the configuration's flags, as node 0's server gets them, and the trial's default (prefix caching off)
    assert flags[flags.index("--tensor-parallel-size") + 1] == "2" and "--enforce-eager" in flags
    assert "--no-enable-prefix-caching" in flags
    # the ledger's description of b, read back after the allocation ended: a job of its own on gpu08
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    again = Node.from_reach("b", b.describe())
    assert again.argv(["kill", "-TERM", "--", "-123"]) == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu08",
                                                          "kill", "-TERM", "--", "-123"]


def test_an_index_past_the_allocation_names_the_node_and_the_hosts(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu07")
    with pytest.raises(NodeError, match=r"node b: slurm_index 1, but the allocation has 1 host\(s\) \(gpu07\)"):
        configuration_nodes(check_config(load_config(TRIAL)), "tp2-two-nodes")


def test_the_two_node_trial_dry_runs_as_one_group_on_two_hosts_under_the_slurm_profile(tmp_path: Path):
    run = subprocess.run([SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path),
                          "--profile", str(REPO / "profiles" / "slurm"), "--configfile", str(TRIAL), "-n"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout + run.stderr
    assert out.count("Group job host") == 1
    [trial] = [line for line in out.splitlines() if "resources:" in line and "serving=1" in line]
    assert "nodes=2" in trial and "tasks=2" in trial and "cpus_per_task=-1" in trial  # 1 task would cut it to 1 node


def test_a_step_of_the_allocation_reads_the_hosts_its_batch_script_noted():
    """Snakemake's jobstep plugin drops SLURM_JOB_NODELIST before each step's srun, which then names the step's one
    node (seen on the two-node test SLURM: ``llmtrial-a`` of ``llmtrial-a,llmtrial-b``)."""
    batch = {JOB_ENV: "7", NODELIST_ENV: "gpu[07-08]"}
    remember_allocation(batch)
    step = {**{k: v for k, v in batch.items() if not k.startswith("SLURM_")}, JOB_ENV: "7", NODELIST_ENV: "gpu07",
            STEP_ENV: "0"}
    assert allocation_hosts(step) == ["gpu07", "gpu08"]
    assert allocation_hosts({**step, JOB_ENV: "8"}) == ["gpu07"]  # another job's: its own list
    in_a_step = {**step}
    remember_allocation(in_a_step)  # only the batch script notes it
    assert in_a_step == step


def test_a_job_of_its_own_is_started_without_the_job_srun_runs_in(monkeypatch):
    """From inside a job (a cleanup sent to node a reaching node b), srun would take the inherited SLURM_JOB_ID for the
    job to make a step of, and refuse b ("Unable to create step for job 5: Requested node configuration is not
    available", seen on the two-node test SLURM)."""
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu07")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    b = Node.from_reach("b", {"name": "b", "reach": "slurm", "slurm": {"host": "gpu08", "job": "1"}})
    assert b.slurm_job is None  # the recorded allocation ended: gpu08 is not a host of job 5
    env = b.local_env({"LLMTRIAL_X": "1"})
    assert "SLURM_JOB_ID" not in env and "SLURM_JOB_NODELIST" not in env
    assert env["SLURM_CONF"] == "/etc/slurm/slurm.conf" and env["LLMTRIAL_X"] == "1"
    assert own_job_env({"SLURM_JOBID": "5", "PATH": "/bin"}) == {"PATH": "/bin"}


#: States as scontrol prints them (slurm.conf(5) and scontrol(1): a base state and its flags joined by "+";
#: sinfo marks a host that does not respond with "*"): whether SLURM would start a job of its own there now.
STATES = [("IDLE", True), ("MIXED", True), ("ALLOCATED", True), ("IDLE+COMPLETING", True), ("IDLE+CLOUD", True),
          ("DOWN", False), ("DOWN+NOT_RESPONDING", False), ("IDLE+DRAIN", False), ("ALLOCATED+DRAIN", False),
          ("IDLE+NOT_RESPONDING", False), ("idle*", False), ("IDLE+POWERED_DOWN", False), ("FUTURE", False),
          ("down*", False), ("drained", False)]


@pytest.mark.parametrize("state,available", STATES)
def test_a_host_down_drained_or_silent_takes_no_job_of_its_own(state, available):
    host = HostState(host="gpu08", state=state, reason="disk" if not available else None)
    assert host.available is available
    assert host.describe() == f"SLURM has host gpu08 {state}" + ("" if available else " (reason: disk)")


def test_a_job_of_its_own_waits_for_its_host_at_most_its_timeout_and_a_step_never_queues():
    """srun killed by a timeout would leave its request queued, to run once the host came free; with
    --immediate srun withdraws it itself."""
    assert srun_argv("gpu08", ["true"], None, ["--job-name=x"], wait_s=60.5) == [
        "srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu08", "--immediate=60", "--job-name=x", "true"]
    assert srun_argv("gpu08", ["true"], "5", wait_s=60) == [
        "srun", "--jobid=5", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu08", "true"]
    b = Node(name="b", reach="slurm", slurm_host="gpu08")
    assert "--immediate=30" in b.argv(["true"], wait_s=30) and "--immediate=30" not in b.argv(["true"])
