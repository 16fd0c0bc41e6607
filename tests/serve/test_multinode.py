"""One model served across two hosts by real vLLM (CPU build), end to end with snakemake.

The two hosts are made on this machine (tests/hosts.py): host A, a network namespace where
snakemake itself runs (so A is the trial's local node), and host B, a second namespace joined
by a veth pair and reached over ssh with a key the fixture generates. The trial file is
config/trials/two-hosts-cpu.yaml with the fixture's addresses, key and staging folders, and
its two two-host configurations: tensor parallel 2, one rank per host, with vLLM's native
multi-node launch (node b ``--headless``), and with a Ray cluster across both hosts, which the
CPU build of vLLM refuses at start-up.

One module-scoped sequence of runs in one results folder serves every test here:

1. the full trial: preflight on both hosts, the weights copied to B and verified, a gloo
   sanity check across the hosts, serving and benchmarking, cleanup on both, the report (a rank
   killed mid-benchmark on the second node is shown on the two-node SLURM, through the same code:
   tests/workflow/test_slurm_two_nodes.py);
2. the native configuration alone again (``--forcerun stage_model trial``: the first run's
   cleanup deleted the weights on both hosts, as the trial file asks; the Ray one is taken out of
   the trial file), ``kill -9`` of snakemake once B's rank runs, then ``snakemake cleanup``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO, SNAKEFILE, alone_with_the_stale_check, free_base_port
from hosts import INTERFACE
from llmtrial.core.ledger import Entry, Ledger
from llmtrial.host.nodes import Node, NodeDefaults
from llmtrial.host.process_groups import group_alive, group_members
from llmtrial.patch.patching import verify_files
from workflow_helpers import SNAKEMAKE, snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.workflow, pytest.mark.stale_check, pytest.mark.long]

TRIAL_FILE = REPO / "config" / "trials" / "two-hosts-cpu.yaml"
CONFIGURATION = "tp2-two-hosts"
RAY = "tp2-two-hosts-ray"


def trial_config(h, work) -> dict:
    config = yaml.safe_load(TRIAL_FILE.read_text())
    config["configurations"] = {name: config["configurations"][name] for name in (CONFIGURATION, RAY)}
    config["staging_dir"] = str(work / "staging")
    config["serving"]["base_port"] = free_base_port(18700, 3)
    config["nodes"]["a"]["address"] = h.addr_a
    b = config["nodes"]["b"]
    b.update(python=sys.executable, staging_dir=str(h.staging_b))  # the same venv: the filesystem is shared
    b["ssh"].update(address=h.addr_b, port=h.port, identity_file=str(h.key),
                    options=[f"UserKnownHostsFile={h.known_hosts}"])
    b["env"]["VLLM_CPU_OMP_THREADS_BIND"] = "1"  # one machine: each rank its own core
    assert config["nodes"]["a"]["interface"] == b["interface"] == INTERFACE
    return config


def on_a(h, work, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """snakemake run on host A (in its namespace)."""
    return snakemake(work, *args, timeout=timeout, via=h.on_a([]))


def ledger(results) -> list[Entry]:
    return Ledger(results / "ledger.jsonl").entries()


def record_of(results, name=CONFIGURATION) -> dict:
    return json.loads((results / "configs" / name / "record.json").read_text())


def node_b(trial) -> Node:
    """Node b as the trial reaches it: over ssh from host A."""
    config = trial["config"]
    node = Node.from_config("b", config["nodes"]["b"], NodeDefaults(staging_dir=config["staging_dir"]))
    return dataclasses.replace(node, via=tuple(trial["hosts"].on_a([])))


def groups_on_b(trial, entries, run=None) -> list[int]:
    """Live processes on B of every group the trial started there (of one run, or all)."""
    b = node_b(trial)
    pids = []
    for launch in (e for e in entries if e.action == "group_launch" and e.node == "b"):
        if run is None or launch.run == run:
            pids += group_alive(b, None, None, token=launch.token)
    return pids


def b_rank(entry: Entry, configuration: str) -> bool:
    """Whether a ledger entry is about ``configuration``'s headless rank on B (its group's label)."""
    return entry.node == "b" and entry.label == f"two-hosts/{configuration} rank 1"


@pytest.fixture(scope="module")
def two_host_trial(hosts, tmp_path_factory):
    work = tmp_path_factory.mktemp("two-hosts")
    config = trial_config(hosts, work)
    write_config(work, config)
    results = work / "results" / config["trial"]
    out = {"work": work, "config": config, "results": results, "hosts": hosts}
    t0 = time.time()
    with alone_with_the_stale_check():  # its preflight checks both hosts for stale vLLM, Ray and rank processes
        out["first"] = on_a(hosts, work, "--cores", "all", timeout=1200)
    out["first_s"] = time.time() - t0
    print(f"two-host trial took {out['first_s']:.0f} s", file=sys.stderr)
    if out["first"].returncode == 0:
        out["first_record"] = record_of(results)
        out["ray_record"] = record_of(results, RAY)
        out["first_cleanup"] = json.loads((results / "cleanup" / "record.json").read_text())
    del config["configurations"][RAY]  # the run after the first reruns the native configuration alone
    write_config(work, config)
    yield out
    stop_everything(hosts, results)


def stop_everything(h, results) -> None:
    """Whatever a failed test left: snakemake cleanup on A."""
    if results.exists():
        on_a(h, results.parent.parent, "cleanup", "--cores", "1", timeout=300)


def test_the_trial_is_served_across_both_hosts_benchmarked_and_reported(two_host_trial):
    run = two_host_trial["first"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    record = two_host_trial["first_record"]
    assert record["status"] == "ok", record["failure"]
    assert [(n["name"], n["rank"], n["role"]) for n in record["nodes"]] == [("a", 0, "api server"), ("b", 1, "headless")]
    assert record["launch"] == {"kind": "native", "nnodes": 2, "master_addr": two_host_trial["hosts"].addr_a,
                                "master_port": record["server"]["port"] + 1000}
    argv = record["server"]["argv"]
    assert argv[argv.index("--node-rank") + 1] == "0" and "--headless" not in argv
    b = record["nodes"][1]
    assert b["args"][b["args"].index("--node-rank") + 1] == "1" and "--headless" in b["args"]
    passes = record["scenarios"][0]["pass_results"]
    assert len(passes) == 2 and all(p["status"] == "ok" and p["summary"]["completed"] == 8 for p in passes)
    # B's own log, fetched from B: its worker joined A's rendezvous as rank 1 of 2
    b_log = (two_host_trial["results"] / "configs" / CONFIGURATION / b["log"]).read_text()
    assert "world_size=2 rank=1" in b_log and f"tcp://{two_host_trial['hosts'].addr_a}:" in b_log
    # the demo patch as seed 000 gave its own: mode file on A, a plugin on B. The two hosts share this machine's
    # file system, so B reads the file A patched: B gets no plugin (it would apply the change twice), and the patch's
    # line shows once in each host's worker log, rank 0 on A, rank 1 on B
    [on_a] = record["patches"]["patches"]
    [on_b] = b["patches"]
    assert (on_a["mode"], on_b["mode"]) == ("file", "file")
    assert on_a["flag_on"] and [re.search(r"CPU worker rank (\d+)", x["line"])[1] for x in on_a["lines"]] == ["0"]
    assert on_b["flag_on"] and [re.search(r"CPU worker rank (\d+)", x["line"])[1] for x in on_b["lines"]] == ["1"]
    entries = ledger(two_host_trial["results"])
    assert [e.path for e in entries if e.action == "patch_file"] == ["vllm/v1/worker/cpu_worker.py"]
    assert not [e for e in entries if e.action in ("patch_plugin", "patch_plugin_copy")]
    assert "PYTHONPATH" not in record["server"]["env"] and "PYTHONPATH" not in b["env_keys"]
    report = (two_host_trial["results"] / "report.html").read_text()
    assert "Nodes" in report and f"{CONFIGURATION} spans nodes a and b" in report


def test_ray_across_both_hosts_ends_in_vllms_own_refusal_diagnosed(two_host_trial):
    record = two_host_trial["ray_record"]
    assert record["status"] == "failed" and record["failure"]["phase"] == "startup"
    assert record["failure"]["error_line"]["pattern"] == "ray_unsupported_platform"
    assert record["launch"]["kind"] == "ray" and "--distributed-executor-backend" in record["server"]["argv"]
    assert [(n["name"], n["role"]) for n in record["nodes"]] == [("a", "api server, ray head"), ("b", "ray worker")]
    # both hosts joined the cluster before the server started; each node's Ray log came back
    assert all(n["ray"]["nodes"] == 2 for n in record["nodes"])
    folder = two_host_trial["results"] / "configs" / RAY
    assert "Ray runtime started" in (folder / record["nodes"][1]["ray_log"]).read_text()
    entries = ledger(two_host_trial["results"])
    ray_groups = [e for e in entries if e.action == "group_launch" and e.label.endswith(" ray")]
    undone = {e.undoes for e in entries if e.action == "group_stopped"}
    assert {e.node for e in ray_groups} == {"a", "b"} and all(e.id in undone for e in ray_groups)


def test_the_sanity_check_ran_across_the_hosts_before_the_server(two_host_trial):
    record = two_host_trial["first_record"]
    check = record["collective"]
    assert check["ok"] and check["backend"] == "gloo" and check["world_size"] == 2
    assert [r["node"] for r in check["ranks"]] == ["a", "b"]
    # its figures are what its own times give (how fast the veth pair was is the machine's business): the
    # slowest rank's median all-reduce inside the whole check, the bandwidth the size over that median
    # (nccl-tests' bus factor 2 (n - 1) / n is 1 for two ranks)
    assert 0 < check["median_s"] < check["wall_s"]
    assert check["busbw_gbps"] == pytest.approx(check["size_bytes"] / check["median_s"] / 1e9)
    entries = ledger(two_host_trial["results"])
    first = next(e for e in entries if e.action == "group_launch" and b_rank(e, CONFIGURATION))
    assert record["timing"]["job_start"] < first.t


def test_every_node_has_telemetry_with_a_node_column(two_host_trial):
    record = two_host_trial["first_record"]
    nodes = record["telemetry"]["nodes"]
    with (two_host_trial["results"] / "configs" / CONFIGURATION / nodes["file"]).open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:2] == ["time", "node"] and {r["node"] for r in rows} == {"a", "b"}
    # each node's count is its rows in the merged file, however many its sampler took in the time it had
    assert {name: n["samples"] for name, n in nodes["nodes"].items()} == {
        name: sum(r["node"] == name for r in rows) for name in ("a", "b")}
    assert all("error" not in n and n["samples"] >= 1 for n in nodes["nodes"].values())
    # the ranks' traffic crossed the veth pair: from its first sample (before the server was launched) to its
    # last (once it was stopped), B received and A sent what serving the passes across both took
    assert nodes["nodes"]["b"]["net_rx_bytes"] > 0 and nodes["nodes"]["a"]["net_tx_bytes"] > 0
    # and each pass's figures are the node's samples inside the pass's window, as many as fell there
    for p in record["scenarios"][0]["pass_results"]:
        for name in ("a", "b"):
            inside = [r for r in rows if r["node"] == name and p["window"]["start"] <= float(r["time"]) <= p["window"]["end"]]
            got = p["node_telemetry"].get(name)
            assert (got["samples"] if got else 0) == len(inside)
            rx = [float(r["net_rx_bytes"]) for r in inside if r["net_rx_bytes"]]
            assert not got or got["net_rx_bytes"] == (int(rx[-1] - rx[0]) if rx else None)


def test_the_weights_were_copied_to_b_and_verified(two_host_trial):
    manifest = json.loads((two_host_trial["results"] / "model" / "manifest.json").read_text())
    copy = manifest["nodes"]["b"]
    assert copy["verified"] and copy["model_dir"].startswith(str(two_host_trial["hosts"].staging_b))
    staged = [e for e in ledger(two_host_trial["results"]) if e.action == "weights_staged" and e.node == "b"]
    assert staged and staged[0].path == copy["model_dir"]


def test_cleanup_left_nothing_on_either_host(two_host_trial):
    cleanup = two_host_trial["first_cleanup"]
    assert cleanup["restored"], cleanup["residues"]
    entries = ledger(two_host_trial["results"])
    launches = [e for e in entries if e.action == "group_launch"]
    undone = {e.undoes for e in entries if e.action == "group_stopped"}
    assert {e.node for e in launches} == {"a", "b"} and all(e.id in undone for e in launches)
    assert groups_on_b(two_host_trial, entries) == []
    ranks = [e for e in launches if " rank " in e.label]  # each with a temporary folder of its own on B, removed
    assert ranks and all(e.node == "b" and e.scratch and not os.path.exists(e.scratch) for e in ranks)
    # the trial file deletes the weights after the trial: on A, and B's verified copy on B
    deleted = {e.node: e.path for e in entries if e.action == "weights_done" and e.outcome == "deleted"}
    assert set(deleted) == {"a", "b"} and not any(os.path.exists(p) for p in deleted.values())
    # every entry names the node it changed: A by the trial's own name for it
    assert {e.node for e in entries} == {"a", "b"}
    # vLLM's file restored from its backup, matching RECORD again
    assert all(f["matches"] for f in verify_files(["vllm/v1/worker/cpu_worker.py"]))
    assert [r["path"] for r in cleanup["patches_reverted"]] == ["vllm/v1/worker/cpu_worker.py"]
    for server in (e for e in entries if e.action == "server_started"):
        assert group_members(server.pgid, not_before=server.launched_at) == []


def test_kill_9_of_snakemake_then_cleanup_stops_bs_rank_from_the_ledger(two_host_trial):
    results, h, work = two_host_trial["results"], two_host_trial["hosts"], two_host_trial["work"]
    earlier = {e.run for e in ledger(results)}
    log = open(work / "kill9.out", "w")  # noqa: SIM115 - the child writes it
    wf = subprocess.Popen(h.on_a([SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(work),
                                  "--cores", "all", "--forcerun", "stage_model", "trial"]), stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not [e for e in ledger(results) if e.action == "group_started" and b_rank(e, CONFIGURATION)
                   and e.run not in earlier]:
            assert wf.poll() is None and time.monotonic() < deadline, (work / "kill9.out").read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)
        # SIGKILL of snakemake and its job (`ip netns exec` execs snakemake, whose session this
        # is), as if host A's controller died: nothing of the trial gets to stop anything; the
        # server on A and everything on B, each in its own session, are left running
        os.killpg(wf.pid, signal.SIGKILL)
        wf.wait(timeout=60)
    finally:
        if wf.poll() is None:
            wf.kill()
    [run] = {e.run for e in ledger(results)} - earlier
    assert groups_on_b(two_host_trial, ledger(results), run=run), "B's rank should still run"
    [rank] = [e for e in ledger(results) if e.action == "group_launch" and e.run == run and b_rank(e, CONFIGURATION)]
    assert os.path.isdir(rank.scratch)  # left on B with the rank
    out = on_a(h, work, "cleanup", "--cores", "1", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    record = json.loads((results / "cleanup" / "on-demand.json").read_text())
    assert record["restored"], record["residues"]
    # B's rank and B's sampler, each stopped on B by this cleanup from the ledger alone
    stopped = {g["label"]: g for g in record["left_behind"]["groups"] if g["node"] == "b"}
    assert set(stopped) == {f"two-hosts/{CONFIGURATION} rank 1", f"two-hosts/{CONFIGURATION}/telemetry"}
    assert all(g["undone_by_run"] == record["run"] and g["action"] == "stopped" for g in stopped.values())
    assert groups_on_b(two_host_trial, ledger(results)) == []
    assert not os.path.exists(rank.scratch)  # removed on B by the cleanup, from the ledger's name for it
