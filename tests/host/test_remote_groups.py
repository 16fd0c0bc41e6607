"""Process groups on any node (llmtrial.host.process_groups), and cleanup stopping them on their own node
from the ledger alone, on two hosts made on this machine (tests/hosts.py).

Cleanup runs on host A, as `snakemake cleanup` would there after `kill -9` of the trial: a
fresh Python inside A's namespace, that knows host B only from the ledger. Both hosts share
this machine's process table, so the tests see B's processes directly."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import wait_until, written
from hosts import cleanup_on_a, entries, kill_planted
from llmtrial.core.ledger import Action, Ledger
from llmtrial.core.paths import TrialPaths
from llmtrial.host.nodes import Node, NodeError, local_node
from llmtrial.host.process_groups import group_alive, spawn_group, start_group, stop_remote_group
from llmtrial.lifecycle.cleanup import outstanding, run_cleanup

#: A leader that starts one child; both sleep (a server and its engine core, say).
PAIR = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \
       "time.sleep(600)"

#: A leader that makes a file in its temporary folder (as vLLM's engine its store file), then sleeps with a child.
TEMP_PAIR = "import os, tempfile; os.close(tempfile.mkstemp(prefix='vllm_dist_')[0]); " + PAIR


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def members(node: Node, pgid: int, not_before: float | None, n: int = 2, wait: float = 60.0) -> list[int]:
    """The group's members once ``n`` of them run (the leader starts its child itself)."""
    deadline = time.monotonic() + wait
    while len(pids := group_alive(node, pgid, not_before)) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def test_a_group_started_over_ssh_survives_the_session_and_cleanup_stops_it_on_its_node(hosts, tmp_path):
    node = hosts.node_b()
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    group = start_group(ledger, node, [node.python, "-c", TEMP_PAIR], label="tp2/rank1",
                        log_path=str(hosts.staging_b / "rank1.log"), scratch=True)
    pids = []
    try:
        assert group["node"] == "b" and group["pgid"] == group["pid"]
        time.sleep(0.5)  # the ssh session that started it is over
        pids = members(node, group["pgid"], group["create_time"])
        assert len(pids) == 2 and group["pid"] in pids and not any(gone(p) for p in pids)
        assert os.getpgid(pids[0]) == os.getpgid(pids[1]) == group["pgid"] != os.getpgid(0)
        folder = Path(group["scratch"])  # its temporary folder on node b, named in the ledger before the start
        assert folder.parent == Path("/tmp") and folder.name.startswith("llmtrial-vllm-")
        env = psutil.Process(group["pid"]).environ()  # the hosts share this machine's process table
        assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(folder) and folder.stat().st_mode & 0o777 == 0o700
        wait_until(lambda: list(folder.glob("vllm_dist_*")), "the group makes its file")
        [launch] = [e for e in entries(tmp_path) if e.action == Action.GROUP_LAUNCH]
        assert launch.node == "b" and launch.reach == node.describe() and "via" not in launch.reach
        assert launch.scratch == str(folder) and launch.env_keys == []  # the operator's keys, none here
        assert Node.from_reach("b", launch.reach) == node

        # the trial is killed (nothing stops the group): cleanup on host A, from the ledger alone
        record = cleanup_on_a(hosts, tmp_path)
        assert record["restored"] and record["residues"] == []
        assert record["groups"] == []  # a new run: what the killed one left is kept apart
        [row] = record["left_behind"]["groups"]
        assert (row["label"], row["node"], row["action"], row["pgid"]) == ("tp2/rank1", "b", "stopped", group["pgid"])
        assert row["undone_by_run"] == record["run"]
        assert sorted(row["alive_pids"]) == sorted(pids) and row["stop"]["signals"] == ["SIGTERM"]
        assert all(gone(p) for p in pids) and group_alive(node, group["pgid"], group["create_time"]) == []
        [undo] = [e for e in entries(tmp_path) if e.action == Action.GROUP_STOPPED]
        assert undo.node == "b" and undo.undoes == launch.id and undo.outcome == "stopped"
        assert not folder.exists()  # removed on node b by the stop, from the ledger's name for it

        again = cleanup_on_a(hosts, tmp_path)  # nothing left to do
        assert again["restored"] and again["groups"] == again["left_behind"]["groups"] == []
        assert [e.action for e in entries(tmp_path)].count(Action.GROUP_STOPPED) == 1
        assert outstanding(entries(tmp_path))["groups"] == []
    finally:
        kill_planted(pids)


def test_a_process_of_the_group_id_created_before_not_before_is_never_touched(hosts, tmp_path):
    node = hosts.node_b()
    older = spawn_group(node, [node.python, "-c", PAIR], log_path=str(hosts.staging_b / "older.log"))
    pids = members(node, older["pgid"], older["create_time"])
    try:
        assert len(pids) == 2
        later = older["create_time"] + 120  # the ledger's group started after these processes
        assert group_alive(node, older["pgid"], later) == []
        ledger = Ledger(TrialPaths(tmp_path).ledger)
        launch = ledger.append(Action.GROUP_LAUNCH, node="b", label="recycled", reach=node.describe(), argv=["x"],
                               env_keys=[], log_path="x.log", token=None)
        ledger.append(Action.GROUP_STARTED, node="b", label="recycled", launch=launch.id, pid=older["pid"],
                      pgid=older["pgid"], create_time=later)
        record = cleanup_on_a(hosts, tmp_path)
        [row] = record["left_behind"]["groups"]
        assert row["action"] == "none (already gone)" and row["alive_pids"] == [] and record["restored"]
        assert not any(gone(p) for p in pids)
    finally:
        stop = stop_remote_group(node, older["pgid"], not_before=older["create_time"], timeout=5)
        kill_planted(pids)
    assert sorted(stop["alive_pids"]) == sorted(pids) and stop["survivors"] == []


def test_a_node_cleanup_cannot_reach_is_a_residue_naming_it_and_stays_outstanding(hosts, tmp_path):
    node = hosts.node_b()
    real = spawn_group(node, [node.python, "-c", PAIR], log_path=str(hosts.staging_b / "unreached.log"))
    pids = members(node, real["pgid"], real["create_time"])
    try:
        unreachable = hosts.node_b(identity_file=str(hosts.wrong_key))
        ledger = Ledger(TrialPaths(tmp_path).ledger)
        launch = ledger.append(Action.GROUP_LAUNCH, node="b", label="tp2/rank1", reach=unreachable.describe(),
                               argv=["x"], env_keys=[], log_path="x.log", token=None)
        ledger.append(Action.GROUP_STARTED, node="b", label="tp2/rank1", launch=launch.id, pid=real["pid"],
                      pgid=real["pgid"], create_time=real["create_time"])
        for _ in range(2):  # a second cleanup tries again
            record = cleanup_on_a(hosts, tmp_path)
            assert not record["restored"]
            [residue] = record["residues"]
            assert residue["kind"] == "process" and residue["node"] == "b" and "node b" in residue["what"]
            assert "ssh could not run" in residue["seen"] and "Permission denied" in residue["seen"]
            [row] = record["left_behind"]["groups"]
            assert row["action"] == "not reached" and row["undone_by_run"] is None and "ssh" in row["error"]
            assert [e.id for e in outstanding(entries(tmp_path))["groups"]] == [launch.id]
        assert not any(gone(p) for p in pids)  # nothing was done to it
    finally:
        stop_remote_group(node, real["pgid"], not_before=real["create_time"], timeout=5)
        kill_planted(pids)


def test_a_failed_start_leaves_its_launch_for_cleanup_which_finds_nothing(hosts, tmp_path):
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    with pytest.raises(NodeError, match="node b.*cannot start /nonexistent/python"):
        start_group(ledger, hosts.node_b(), ["/nonexistent/python"], label="x", log_path=str(hosts.staging_b / "x.log"),
                    scratch=True)
    [launch] = outstanding(entries(tmp_path))["groups"]
    assert launch.scratch and not Path(launch.scratch).exists()  # made for the start, removed when it failed
    record = cleanup_on_a(hosts, tmp_path)
    assert record["restored"] and record["left_behind"]["groups"][0]["action"] == "none (already gone)"
    assert outstanding(entries(tmp_path))["groups"] == []


def test_a_group_on_this_host_is_started_and_stopped_the_same_way(tmp_path):
    node = local_node("a")
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    group = start_group(ledger, node, [sys.executable, "-c", PAIR], label="tp1", log_path=tmp_path / "logs" / "tp1.log")
    pids = members(node, group["pgid"], group["create_time"])
    try:
        assert len(pids) == 2 and abs(psutil.Process(group["pid"]).create_time() - group["create_time"]) < 0.05
        # a process that left the session but carries the group's token is found too
        assert set(group_alive(node, None, None, token=group["token"])) == set(pids)
        record = written(run_cleanup(tmp_path, stop_timeout=5))
        assert record["restored"] and record["groups"][0]["node"] == "a"
        assert record["groups"][0]["action"] == "stopped" and all(gone(p) for p in pids)
        assert (tmp_path / "logs" / "tp1.log").exists()
    finally:
        kill_planted(pids)


def test_a_group_stopped_by_its_trial_is_undone_in_the_ledger(hosts, tmp_path):
    from llmtrial.host.process_groups import finish_group

    node = hosts.node_b()
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    group = start_group(ledger, node, [node.python, "-c", TEMP_PAIR], label="tp2/rank1",
                        log_path=str(hosts.staging_b / "finished.log"), scratch=True)
    pids = members(node, group["pgid"], group["create_time"])
    try:
        wait_until(lambda: list(Path(group["scratch"]).glob("vllm_dist_*")), "the group makes its file")
        result = finish_group(ledger, node, group, timeout=5)
        assert not Path(group["scratch"]).exists()
        assert sorted(result["alive_pids"]) == sorted(pids) and result["survivors"] == [] and all(map(gone, pids))
        [undo] = [e for e in entries(tmp_path) if e.action == Action.GROUP_STOPPED]
        assert (undo.node, undo.undoes, undo.outcome) == ("b", group["launch"], "stopped")
        assert outstanding(entries(tmp_path))["groups"] == []
    finally:
        kill_planted(pids)
