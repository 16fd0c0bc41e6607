"""A small resident HTTP service on loopback, so every trial shows quieting and restoring.

    python -m llmtrial.host.demo_service start|stop|status --port 8190 --state .demo-service

``start`` launches the service in its own session and records its pid (and process start
time, so a recycled pid is never taken for it) under ``--state``; ``stop`` stops exactly
that process; ``status`` exits 0 while it runs and answers. ``GET /health`` answers 200.
It stands in for the speech, image and model services a shared GPU host runs.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args: object) -> None:
        pass


def _pidfile(state: Path, port: int) -> Path:
    return state / f"demo-service-{port}.json"


def _running(state: Path, port: int) -> psutil.Process | None:
    try:
        info = json.loads(_pidfile(state, port).read_text())
        proc = psutil.Process(int(info["pid"]))
        if abs(proc.create_time() - float(info["create_time"])) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (OSError, ValueError, KeyError, psutil.Error):
        pass
    return None


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmtrial.host.demo_service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "status", "serve"])
    parser.add_argument("--port", type=int, default=8190)
    parser.add_argument("--state", type=Path, default=Path(".demo-service"))
    args = parser.parse_args(argv)
    if args.action == "serve":
        http.server.HTTPServer(("127.0.0.1", args.port), _Handler).serve_forever()
        return 0
    proc = _running(args.state, args.port)
    if args.action == "status":
        return 0 if proc is not None and _answers(args.port) else 3
    if args.action == "stop":
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            psutil.wait_procs([proc], timeout=10)
        _pidfile(args.state, args.port).unlink(missing_ok=True)
        return 0
    if proc is not None:  # start: already running
        return 0
    args.state.mkdir(parents=True, exist_ok=True)
    with open(args.state / f"demo-service-{args.port}.log", "ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "llmtrial.host.demo_service", "serve", "--port", str(args.port)],
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    _pidfile(args.state, args.port).write_text(json.dumps(
        {"pid": child.pid, "create_time": psutil.Process(child.pid).create_time(), "started": time.time()}))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _answers(args.port):
        if child.poll() is not None:
            return 1
        time.sleep(0.1)
    return 0 if _answers(args.port) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
