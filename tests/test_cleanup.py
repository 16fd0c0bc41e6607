"""Cleanup from the ledger alone: stops what a crashed job left, idempotent, honest residues."""

from __future__ import annotations

import socket

from conftest import child_pid, fake_server
from llmtrial.cleanup import LEDGER_NAME, run_cleanup
from llmtrial.cli import main as cli_main
from llmtrial.ledger import Ledger
from llmtrial.server import group_members, port_open


def abandoned_server(tmp_path, port):
    """A server started through the ledger whose job then vanished without stopping it."""
    server = fake_server(tmp_path, port, ledger=Ledger(tmp_path / LEDGER_NAME))
    server.start()
    server.wait_ready(timeout=20, poll=0.1)
    return server


def test_cleanup_stops_a_server_left_running_and_is_idempotent(tmp_path, free_port):
    server = abandoned_server(tmp_path, free_port)
    child = child_pid(server.log_path)
    record = run_cleanup(tmp_path, ports=[free_port], stop_timeout=5)
    server.proc.poll()  # reap the leader in this (parent) process
    assert record["restored"] and record["residues"] == []
    [entry] = record["servers"]
    assert entry["action"] == "stopped" and child in entry["alive_pids"]
    assert entry["stop"]["port_closed"] and not port_open("127.0.0.1", free_port)
    assert group_members(server.pgid) == []

    again = run_cleanup(tmp_path, ports=[free_port])
    assert again["restored"] and again["servers"][0]["action"] == "none (already stopped)"
    actions = [e["action"] for e in Ledger(tmp_path / LEDGER_NAME).entries()]
    assert actions.count("cleanup_done") == 2


def test_a_foreign_listener_on_a_trial_port_is_a_residue_not_killed(tmp_path, free_port):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", free_port))
        sock.listen()
        record = run_cleanup(tmp_path, ports=[free_port])
        assert not record["restored"]
        [residue] = record["residues"]
        assert residue["kind"] == "port" and str(free_port) in residue["what"]
        assert port_open("127.0.0.1", free_port)  # still ours: cleanup does not force
        assert cli_main(["cleanup", str(tmp_path), "--port", str(free_port)]) == 1
    assert (tmp_path / "cleanup" / "on-demand.json").exists()


def test_cleanup_with_no_ledger_checks_ports_only(tmp_path, free_port):
    record = run_cleanup(tmp_path, ports=[free_port])
    assert record["restored"] and record["servers"] == [] and record["ports"] == [
        {"port": free_port, "listening": False}]
