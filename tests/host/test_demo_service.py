"""The resident demo service that every default trial quiets and restores: its own start, stop and status.

A trial trusts these three commands: ``stop`` must leave nothing listening, ``start`` must not report a
start that did not happen, and ``status`` must speak of the instance its state folder records. Real
processes on loopback ports throughout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import wait_until
from llmtrial.host import demo_service
from llmtrial.host.process_groups import port_open


def demo(state: Path, port: int, action: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtrial.host.demo_service", action, "--port", str(port),
                           "--state", str(state), *extra], capture_output=True, text=True, timeout=60)


def recorded_pid(state: Path, port: int) -> int:
    return json.loads((state / f"demo-service-{port}.json").read_text())["pid"]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def serving(port: int) -> list[psutil.Process]:
    """Every demo service process serving ``port``, whoever started it."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "llmtrial.host.demo_service" in cmd and cmd[-3:] == ["serve", "--port", str(port)] and not gone(proc.pid):
            found.append(proc)
    return found


@pytest.fixture
def service(tmp_path: Path, free_port: int) -> Iterator[tuple[Path, int]]:
    """A state folder and a free port; whatever a test left serving that port is killed at the end."""
    yield tmp_path / "state", free_port
    for proc in serving(free_port):
        proc.kill()


def test_start_status_stop_leave_nothing_listening(service):
    state, port = service
    assert demo(state, port, "start").returncode == 0
    pid = recorded_pid(state, port)
    assert demo(state, port, "status").returncode == 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert resp.status == 200
    assert demo(state, port, "start").returncode == 0  # already running: the same instance, no second one
    assert recorded_pid(state, port) == pid and [p.pid for p in serving(port)] == [pid]
    assert demo(state, port, "stop").returncode == 0
    assert gone(pid) and not port_open("127.0.0.1", port)
    assert demo(state, port, "status").returncode == 3
    assert not (state / f"demo-service-{port}.json").exists()


def test_start_refuses_a_port_that_an_instance_it_does_not_record_holds(service):
    """An instance whose state was lost still answers on the port: a new start would spawn a child that
    cannot bind, and report success because the port answers, leaving the old one running untracked."""
    state, port = service
    assert demo(state, port, "start").returncode == 0
    untracked = recorded_pid(state, port)
    (state / f"demo-service-{port}.json").unlink()
    assert demo(state, port, "status").returncode == 3
    again = demo(state, port, "start")
    assert again.returncode == 1
    assert f"port {port} is held by pid {untracked}" in again.stderr
    assert [p.pid for p in serving(port)] == [untracked]  # no second instance left behind
    assert demo(state, port, "status").returncode == 3


def test_start_refuses_a_port_another_program_holds(service):
    state, port = service
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        out = demo(state, port, "start")
        assert out.returncode == 1 and f"held by pid {os.getpid()}" in out.stderr
        assert serving(port) == [] and demo(state, port, "status").returncode == 3


def test_stop_kills_an_instance_that_does_not_end_on_sigterm(service):
    state, port = service
    assert demo(state, port, "start").returncode == 0
    pid = recorded_pid(state, port)
    os.kill(pid, signal.SIGSTOP)  # a stopped process leaves SIGTERM pending; only SIGKILL ends it
    out = demo(state, port, "stop", "--grace", "1")
    assert out.returncode == 0, out.stderr
    assert gone(pid) and not port_open("127.0.0.1", port)
    assert demo(state, port, "status").returncode == 3


def test_stop_with_a_recorded_instance_already_gone_forgets_it(service):
    state, port = service
    assert demo(state, port, "start").returncode == 0
    pid = recorded_pid(state, port)
    psutil.Process(pid).kill()
    wait_until(lambda: gone(pid), f"the killed instance {pid} gone")
    assert demo(state, port, "status").returncode == 3
    assert demo(state, port, "stop").returncode == 0
    assert not (state / f"demo-service-{port}.json").exists()


def test_a_clock_set_between_start_and_stop_does_not_lose_the_instance(service, monkeypatch):
    """A process's start on the wall clock (psutil's ``create_time``: ticks since boot plus the boot's time,
    which moves when the clock is set) is not how the service knows its instance: with the boot time read
    5 s later, as after the clock was set back, ``stop`` still stops it. The clock is a double here: the
    test moves the boot time psutil reads, not the machine's clock."""
    state, port = service
    assert demo(state, port, "start").returncode == 0
    pid = recorded_pid(state, port)
    booted = psutil.boot_time()
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted + 5.0)
    assert demo_service.main(["status", "--port", str(port), "--state", str(state)]) == 0
    assert demo_service.main(["stop", "--port", str(port), "--state", str(state)]) == 0
    assert gone(pid) and not port_open("127.0.0.1", port)


def test_an_instance_recorded_by_an_older_version_is_still_known_and_stopped(service):
    """A resident service `make run` started before an upgrade: its state file keeps the start on the wall clock."""
    state, port = service
    assert demo(state, port, "start").returncode == 0
    pid = recorded_pid(state, port)
    (state / f"demo-service-{port}.json").write_text(json.dumps({"pid": pid, "create_time": psutil.Process(pid).create_time()}))
    assert demo(state, port, "status").returncode == 0 and demo(state, port, "start").returncode == 0
    assert demo(state, port, "stop").returncode == 0
    assert gone(pid) and not port_open("127.0.0.1", port)
