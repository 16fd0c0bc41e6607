"""A small resident HTTP service on loopback, so every trial shows quieting and restoring.

    python -m llmtrial.host.demo_service start|stop|status --port 8190 --state .demo-service

``start`` launches the service in its own session, records its pid and its start (in clock
ticks since boot, so a recycled pid is never taken for it and setting the clock changes
nothing) under ``--state``, and waits until that very process listens on the port; it refuses
a port another process holds. ``stop`` stops exactly that process (SIGTERM, SIGKILL after
``--grace`` seconds) and forgets it only once it is gone; ``status`` exits 0 while it runs and
listens on the port. ``GET /health`` answers 200.
It stands in for the speech, image and model services a shared GPU host runs.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

#: Seconds ``start`` waits for its child to listen on the port.
START_S = 20.0


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args: object) -> None:
        pass


def _pidfile(state: Path, port: int) -> Path:
    return state / f"demo-service-{port}.json"


def _identity(pid: int) -> str:
    """The process's start as the boot's id and the clock ticks from boot to its start: a start time on the
    wall clock (``create_time``) moves whenever the clock is set, and a process taken for another, or its
    own instance not recognised, is one stopped wrongly or one left running."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        start_ticks = f.read().rsplit(b")", 1)[1].split()[19].decode()
    return f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip()}:{start_ticks}"


def _running(state: Path, port: int) -> psutil.Process | None:
    try:
        info = json.loads(_pidfile(state, port).read_text())
        proc = psutil.Process(int(info["pid"]))
        if "start" in info:
            same = _identity(proc.pid) == info["start"]
        else:  # a state file of an older version, which kept the start on the wall clock
            same = abs(proc.create_time() - float(info["create_time"])) < 1.0
        if same and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (OSError, ValueError, KeyError, IndexError, psutil.Error):
        pass
    return None


def _listener(port: int) -> psutil.Process | None:
    """The process listening on the loopback port, whoever started it."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid is not None:
            with contextlib.suppress(psutil.Error):
                return psutil.Process(conn.pid)
    return None


def _listens(proc: psutil.Process, port: int) -> bool:
    """Whether ``proc`` itself listens on ``port`` (not merely that something answers there)."""
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in proc.net_connections(kind="tcp"))
    except psutil.Error:
        return False


def _describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"pid {proc.pid} ({' '.join(proc.cmdline())[:120]})"
    return f"pid {proc.pid}"


def _stop(proc: psutil.Process, grace: float) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds: whether it is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
        _, alive = psutil.wait_procs([proc], timeout=wait)
        if not alive or alive[0].status() == psutil.STATUS_ZOMBIE:
            return True
    return False


def _start(state: Path, port: int) -> int:
    """Start the service unless the recorded instance runs; refuse a port another process holds (it would
    answer for a child that could not bind, and nothing would ever stop it)."""
    holder = _listener(port)
    if holder is not None:
        print(f"demo service: port {port} is held by {_describe(holder)}, which {_pidfile(state, port)} does not "
              "name; stop that process first", file=sys.stderr)
        return 1
    state.mkdir(parents=True, exist_ok=True)
    with open(state / f"demo-service-{port}.log", "ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "llmtrial.host.demo_service", "serve", "--port", str(port)],
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    proc = psutil.Process(child.pid)
    _pidfile(state, port).write_text(json.dumps({"pid": child.pid, "start": _identity(child.pid), "started": time.time()}))
    deadline = time.monotonic() + START_S
    while child.poll() is None and time.monotonic() < deadline:
        if _listens(proc, port):
            return 0
        time.sleep(0.1)
    print(f"demo service: pid {child.pid} did not listen on port {port} within {START_S:g} s "
          f"(exit {child.poll()}; see {log.name})", file=sys.stderr)
    if child.poll() is None:
        _stop(proc, 5.0)
    _pidfile(state, port).unlink(missing_ok=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmtrial.host.demo_service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "status", "serve"])
    parser.add_argument("--port", type=int, default=8190)
    parser.add_argument("--state", type=Path, default=Path(".demo-service"))
    parser.add_argument("--grace", type=float, default=10.0, help="seconds stop waits after SIGTERM before SIGKILL")
    args = parser.parse_args(argv)
    if args.action == "serve":
        http.server.HTTPServer(("127.0.0.1", args.port), _Handler).serve_forever()
        return 0
    proc = _running(args.state, args.port)
    if args.action == "status":
        return 0 if proc is not None and _listens(proc, args.port) else 3
    if args.action == "stop":
        if proc is not None and not _stop(proc, args.grace):
            print(f"demo service: {_describe(proc)} is still running after SIGKILL", file=sys.stderr)
            return 1
        _pidfile(args.state, args.port).unlink(missing_ok=True)
        return 0
    return 0 if proc is not None else _start(args.state, args.port)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
