"""Cleanup on the machine that made the changes: what a SLURM node changed is undone there, never on
the login node (the real SLURM round trip is in tests/workflow/test_slurm.py)."""

from __future__ import annotations

import subprocess

from conftest import written
from llmtrial.core.hostlock import SLURM_NODE_ENV, this_host
from llmtrial.core.ledger import Ledger
from llmtrial.core.paths import TrialPaths
from llmtrial.host.process_groups import port_open
from llmtrial.host.services import quiet_host
from llmtrial.host.slurm_hosts import JOB_ENV, NODELIST_ENV, STEP_ENV
from llmtrial.lifecycle.cleanup import cleanup_with_record, give_back_before_allocation_ends, run_cleanup
from llmtrial.lifecycle.on_node import cleanup_argv, hosts_to_reach
from workflow_helpers import demo_service


def test_a_nodes_changes_are_left_to_that_node_and_a_node_out_of_reach_is_a_residue_naming_it(
        tmp_path, free_port, monkeypatch):
    svc = demo_service(tmp_path / "demo", free_port)
    subprocess.run(svc["start"], check=True, timeout=30)
    try:
        monkeypatch.setenv(SLURM_NODE_ENV, "gpu-n7")  # as a job on SLURM node gpu-n7 quiets it
        assert this_host() == "gpu-n7"
        quiet_host(tmp_path, {"demo": svc})
        entries = Ledger(TrialPaths(tmp_path).ledger).entries()
        assert {e.machine for e in entries} == {"gpu-n7"} and not port_open("127.0.0.1", free_port)

        monkeypatch.delenv(SLURM_NODE_ENV)  # the login node, where srun is missing
        monkeypatch.setenv("PATH", str(tmp_path / "no-srun"))
        assert hosts_to_reach(entries) == ["gpu-n7"]
        here = written(run_cleanup(tmp_path))
        assert here["restored"] and here["services_restored"] == []  # the login node undoes none of n7's
        record = written(cleanup_with_record(tmp_path, ports=[free_port]))
        assert not record["restored"] and not port_open("127.0.0.1", free_port)
        [residue] = [r for r in record["residues"] if r["kind"] == "node"]
        assert residue["what"] == residue["node"] == "gpu-n7" and "no srun on" in residue["seen"]
        assert f"llmtrial cleanup {tmp_path}` on gpu-n7" in residue["seen"]

        monkeypatch.setenv(SLURM_NODE_ENV, "gpu-n7")  # on the node itself: undone there
        again = written(cleanup_with_record(tmp_path, ports=[free_port]))
        assert again["restored"] and [s["name"] for s in again["services_restored"]] == ["demo"]
        assert port_open("127.0.0.1", free_port) and hosts_to_reach(Ledger(TrialPaths(tmp_path).ledger).entries()) == []
    finally:
        subprocess.run(svc["stop"], timeout=30)


def test_the_cleanup_sent_to_a_node_is_one_argv_naming_the_node_the_trial_and_its_record(tmp_path):
    argv = cleanup_argv("gpu-n7", tmp_path / "results" / "demo", tmp_path / "r.json", ports=[8100, 8101],
                        host="127.0.0.1", stop_timeout=30.0, weights=False, submit=["--partition=h100"])
    assert argv[:7] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu-n7", "--immediate=1800",
                        "--job-name=llmtrial-cleanup-demo", "--partition=h100"]  # waits for its node, bounded
    assert argv[8:13] == ["-m", "llmtrial.cli", "cleanup", str(tmp_path / "results" / "demo"), "--here-only"]
    assert argv[-1] == "--keep-weights"  # the node undoes its own changes and sends none on (it would send one back)
    assert argv[argv.index("--record") + 1] == str(tmp_path / "r.json")
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--port"] == ["8100", "8101"]


def test_from_inside_an_allocation_a_node_of_it_is_reached_as_a_step_not_a_job_queued_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_ENV, "42")
    monkeypatch.setenv(NODELIST_ENV, "gpu-n[7-8]")
    argv = cleanup_argv("gpu-n8", tmp_path / "results" / "demo", tmp_path / "r.json", ports=[], host="127.0.0.1",
                        stop_timeout=30.0, weights=False, submit=["--partition=h100"])
    assert argv[:6] == ["srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu-n8"]
    assert not [a for a in argv if a.startswith(("--job-name", "--partition"))]
    outside = cleanup_argv("gpu-n9", tmp_path / "results" / "demo", tmp_path / "r.json", ports=[], host="127.0.0.1",
                           stop_timeout=30.0, weights=False)
    assert "--jobid=42" not in outside and "--job-name=llmtrial-cleanup-demo" in outside


def test_an_allocation_ending_with_changes_open_gives_them_back_on_its_node_and_the_login_side_takes_that_record(
        tmp_path, free_port, monkeypatch):
    svc = demo_service(tmp_path / "demo", free_port)
    subprocess.run(svc["start"], check=True, timeout=30)
    try:
        monkeypatch.setenv(SLURM_NODE_ENV, "gpu-n7")  # the allocation's batch script on node gpu-n7
        monkeypatch.setenv(JOB_ENV, "42")
        monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-clients"))  # no squeue: the job's state unknown
        quiet_host(tmp_path, {"demo": svc})
        monkeypatch.setenv(STEP_ENV, "3")  # a step of the job (one of the group's jobs): not the allocation's end
        assert give_back_before_allocation_ends(tmp_path, ports=[free_port]) is None
        assert not port_open("127.0.0.1", free_port)
        monkeypatch.delenv(STEP_ENV)
        record = give_back_before_allocation_ends(tmp_path, ports=[free_port])
        paths = TrialPaths(tmp_path)
        assert record is not None and record.restored and [s.name for s in record.services_restored] == ["demo"]
        assert port_open("127.0.0.1", free_port) and paths.cleanup_at_allocation_end.exists()
        assert give_back_before_allocation_ends(tmp_path, ports=[free_port]) is None  # nothing left open

        monkeypatch.delenv(SLURM_NODE_ENV)  # the login node's onerror, after the allocation ended
        monkeypatch.delenv(JOB_ENV)
        after_error = cleanup_with_record(tmp_path, paths.cleanup_on_error, ports=[free_port])
        assert after_error == record and not paths.cleanup_on_error.exists()
        assert [e.machine for e in Ledger(paths.ledger).entries() if e.action == "cleanup_start"] == ["gpu-n7"]
    finally:
        subprocess.run(svc["stop"], timeout=30)
