"""Cleanup from the ledger alone: stops what a crashed job left, idempotent, honest residues."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from conftest import child_pid, fake_server, reported, written
from llmtrial.cli import main as cli_main
from llmtrial.core.cleanup_model import CleanupRecord, QuietRecord
from llmtrial.core.ledger import Ledger
from llmtrial.core.paths import TrialPaths
from llmtrial.host.process_groups import group_members, port_open, stop_group
from llmtrial.host.scratch import remove_scratch
from llmtrial.lifecycle.cleanup import cleanup_with_record, host_lines, run_cleanup
from llmtrial.serve.server import ServerProcess


@pytest.fixture
def abandoned_server(tmp_path):
    """Starts a server through the ledger whose job then vanished without stopping it. Only the cleanup under test
    stops it, so whatever the test did, its group is stopped at the end: an assertion that fails before the
    cleanup would otherwise leave the server running."""
    started: list[ServerProcess] = []

    def start(port: int, run: str | None = None) -> ServerProcess:
        server = fake_server(tmp_path, port, ledger=Ledger(TrialPaths(tmp_path).ledger, run=run))
        started.append(server)
        server.start()
        server.wait_ready(timeout=60, poll=0.1)
        return server

    yield start
    for server in started:
        if server.pgid is not None:
            stop_group(server.pgid, host=server.host, port=server.port, timeout=5, not_before=server.launched_at,
                       leader=server.proc)
        remove_scratch(server.scratch)


def test_cleanup_stops_a_server_left_running_and_is_idempotent(tmp_path, free_port, abandoned_server):
    server = abandoned_server(free_port)
    child = child_pid(server.log_path)
    assert Path(reported(server.log_path, "rpc")).parent == Path(reported(server.log_path, "store")).parent == server.scratch
    record = written(run_cleanup(tmp_path, ports=[free_port], stop_timeout=5))
    server.proc.poll()  # reap the leader in this (parent) process
    assert record["restored"] and record["residues"] == []
    [entry] = record["servers"]
    assert entry["action"] == "stopped" and child in entry["alive_pids"]
    assert entry["stop"]["port_closed"] and not port_open("127.0.0.1", free_port)
    assert group_members(server.pgid) == []

    assert not server.scratch.exists()  # its temporary folder, named in the ledger

    again = written(run_cleanup(tmp_path, ports=[free_port]))
    assert again["restored"] and again["servers"][0]["action"] == "stopped"  # by the first cleanup
    actions = [e.action for e in Ledger(TrialPaths(tmp_path).ledger).entries()]
    assert actions.count("cleanup_done") == 2 and actions.count("server_stopped") == 1


def test_a_foreign_listener_on_a_trial_port_is_a_residue_not_killed(tmp_path, free_port):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", free_port))
        sock.listen()
        record = written(run_cleanup(tmp_path, ports=[free_port]))
        assert not record["restored"]
        [residue] = record["residues"]
        assert residue["kind"] == "port" and str(free_port) in residue["what"]
        assert port_open("127.0.0.1", free_port)  # still ours: cleanup does not force
        assert cli_main(["cleanup", str(tmp_path), "--port", str(free_port)]) == 1
    assert (tmp_path / "cleanup" / "on-demand.json").exists()


def test_cleanup_with_no_ledger_checks_ports_only(tmp_path, free_port):
    model = run_cleanup(tmp_path, ports=[free_port])
    assert isinstance(model, CleanupRecord) and model.restored
    record = written(model)
    assert record["restored"] and record["servers"] == [] and record["ports"] == [
        {"port": free_port, "listening": False}]
    rows = {"jobs": [], "servers": [], "groups": [], "services": [], "patches": []}
    assert record == {  # the cleanup record as it was written when it was a dict
        "run": model.run, "started": model.started, "finished": model.finished,
        "ledger": str(TrialPaths(tmp_path).ledger), "ledger_entries": 0, **rows,
        "ports": [{"port": free_port, "listening": False}], "services_restored": [], "patches_reverted": [],
        "weights": {"applied": False, "reason": "not applied: the trial did not finish (a rerun needs them)",
                    "folders": [], "freed_bytes": 0, "residues": []},
        "left_behind": {**rows, "weights": []}, "host": {"services": []}, "gpus_held": [], "residues": [],
        "restored": True, "host_lock": []}
    assert model.finished >= model.started


def test_cleanup_restores_quieted_services_and_records_them(tmp_path, free_port):
    import subprocess

    from llmtrial.host.services import quiet_host
    from workflow_helpers import demo_service

    svc = demo_service(tmp_path / "demo", free_port)
    subprocess.run(svc["start"], check=True, timeout=30)
    try:
        quieted = quiet_host(tmp_path, {"demo": svc})
        assert quieted.services[0].action == "stopped" and not port_open("127.0.0.1", free_port)
        model = run_cleanup(tmp_path)
        record = written(model)
        assert record["restored"] and port_open("127.0.0.1", free_port)
        assert host_lines(tmp_path, model) == ["host restored: yes (demo running and healthy)"]
        [row] = record["services"]
        assert row["was_running"] and row["down"] and row["healthy"] and row["restarted_at"] > row["stopped_at"]
        assert written(run_cleanup(tmp_path))["services_restored"] == []  # nothing left to do
    finally:
        subprocess.run(svc["stop"], timeout=30)


def test_a_new_run_restores_what_a_crashed_run_left_before_quieting(tmp_path, free_port, abandoned_server):
    import os

    import psutil

    from llmtrial.host.services import quiet_needed
    from llmtrial.lifecycle.cleanup import restore_first, unfinished

    ledger = Ledger(TrialPaths(tmp_path).ledger, run="crashed")
    server = abandoned_server(free_port, run="crashed")  # a crashed run's server, still up
    ledger.append("job_started", label="demo/tp1", pid=os.getpid() + 10**6, create_time=psutil.Process().create_time())
    assert unfinished(ledger.entries())
    assert quiet_needed(tmp_path, {}) == "an earlier run left it changed"
    first = written(restore_first(tmp_path))
    server.proc.poll()
    assert first["restored"] and first["servers"] == [] and first["jobs"] == []  # this run started none
    [left] = first["left_behind"]["servers"]
    assert left["action"] == "stopped" and left["run"] == "crashed" and left["undone_by_run"] == first["run"]
    assert first["left_behind"]["jobs"][0]["action"] == "none (already gone)"
    assert not port_open("127.0.0.1", free_port) and not unfinished(Ledger(TrialPaths(tmp_path).ledger).entries())
    assert quiet_needed(tmp_path, {}) is None and restore_first(tmp_path) is None  # nothing left to do


def test_an_orphaned_configuration_job_is_stopped(tmp_path):
    import subprocess
    import sys

    import psutil

    from llmtrial.core.ledger import Ledger as L

    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    L(TrialPaths(tmp_path).ledger).append("job_started", label="demo/tp1", pid=job.pid,
                                     create_time=psutil.Process(job.pid).create_time())
    record = written(run_cleanup(tmp_path, stop_timeout=5))
    [item] = record["jobs"]
    assert (item["label"], item["pid"], item["action"]) == ("demo/tp1", job.pid, "stopped")
    assert job.wait(timeout=10) is not None and record["restored"]


def test_quieting_on_a_gpu_host_records_the_memory_freed(tmp_path):
    from types import SimpleNamespace

    from conftest import NvmlDoubleBase
    from llmtrial.host.services import quiet_host

    class NvmlDouble(NvmlDoubleBase):
        """A double of nvidia-ml-py's pynvml: one GPU whose memory use drops when the service stops."""

        count = 1

        def __init__(self, flag):
            super().__init__()
            self.flag = flag

        def nvmlDeviceGetMemoryInfo(self, h):
            return SimpleNamespace(used=(30 if self.flag.exists() else 2) * 2**30, total=80 * 2**30)

        def nvmlDeviceGetComputeRunningProcesses(self, h):
            return [SimpleNamespace(usedGpuMemory=28 * 2**30)] if self.flag.exists() else []

    flag = tmp_path / "up"
    flag.write_text("")
    svc = {"kind": "command", "status": ["test", "-f", str(flag)], "stopped_exit_codes": [1], "stop": ["rm", str(flag)],
           "start": ["touch", str(flag)], "timeouts": {"stop_s": 5}}
    record = quiet_host(tmp_path, {"tts": svc}, nvml=NvmlDouble(flag))
    assert isinstance(record, QuietRecord) and record.gpu.memory_freed_bytes == 28 * 2**30
    assert record.gpu.before["compute_processes"] == {"gpu0": 1}
    assert record.gpu.after["compute_processes"] == {"gpu0": 0}
    [item] = record.services
    status = f"test -f {flag}"
    assert written(record) == {  # the quiet record as the stage wrote it when it was a dict
        "restored_first": None,
        "services": [{"name": "tts", "kind": "command", "was_running": True, "state_seen": f"`{status}` exited 0",
                      "stopped_at": item.stopped_at, "action": "stopped", "stop_exit": 0,
                      "down_after_s": item.down_after_s, "seen": f"state stopped (`{status}` exited 1); health: no health check"}],
        "residues": [], "quieted_at": record.quieted_at,
        "gpu": {"before": {"mem_used_bytes": 30 * 2**30, "compute_processes": {"gpu0": 1}},
                "after": {"mem_used_bytes": 2 * 2**30, "compute_processes": {"gpu0": 0}},
                "memory_freed_bytes": 28 * 2**30}}
    assert record.quieted_at >= item.stopped_at > 0 and item.down_after_s >= 0


def test_a_runs_last_lines_say_the_host_was_not_restored_naming_each_residue(tmp_path, free_port):
    with socket.socket() as sock:  # a listener that is not the trial's, on a trial port: cleanup cannot free it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", free_port))
        sock.listen()
        record = cleanup_with_record(tmp_path, ports=[free_port])
    [residue] = record.residues
    lines = host_lines(tmp_path)  # read back from the record on file, as the run's last lines do
    assert lines == host_lines(tmp_path, record)
    assert lines[0] == "host restored: NO, 1 residue(s); fix them, then run `snakemake cleanup`"
    assert lines[1:] == [f"  port {residue.what}: {residue.seen} (tried: {residue.tried})"]


def test_a_runs_last_lines_say_changes_still_open_then_restored_after_cleanup(tmp_path, free_port, abandoned_server):
    server = abandoned_server(free_port)  # the ledger holds a server no entry stopped
    assert host_lines(tmp_path) == [
        f"host restored: NO, changes still open in {TrialPaths(tmp_path).ledger}; run `snakemake cleanup`"]
    cleanup_with_record(tmp_path, ports=[free_port], stop_timeout=5)
    server.proc.poll()
    assert host_lines(tmp_path) == ["host restored: yes"]
    assert host_lines(tmp_path / "never-run") == [
        "host restored: yes (nothing of this trial is left changed on the host)"]
