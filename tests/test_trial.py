"""Pieces of the configuration job that need no vLLM: pass agreement, SIGTERM handling."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import SERVER_SCRIPT
from llmtrial.server import group_members, port_open
from llmtrial.trial import agreement


def test_agreement_is_the_spread_over_the_mean():
    assert agreement([100.0, 102.0]) == 2.0 / 101.0
    assert agreement([5.0]) is None and agreement([]) is None
    assert agreement([0.0, 0.0]) is None


JOB = r"""
import sys, time
from llmtrial.server import ServerProcess
from llmtrial.trial import sigterm_as_exit
script, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = ServerProcess([sys.executable, script, str(port), "0.2", "0"], host="127.0.0.1", port=port, log_path=log)
with sigterm_as_exit():
    try:
        server.start()
        server.wait_ready(20, poll=0.1)
        print(server.pgid, flush=True)
        time.sleep(600)
    finally:
        server.stop()
"""


def test_a_job_stopped_with_sigterm_stops_its_server_first(tmp_path, free_port):
    script = tmp_path / "fake_server.py"
    script.write_text(SERVER_SCRIPT)
    job = subprocess.Popen([sys.executable, "-c", JOB, str(script), str(free_port), str(tmp_path / "s.log")],
                           stdout=subprocess.PIPE, text=True)
    pgid = int(job.stdout.readline())
    assert group_members(pgid)
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 5
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(pgid) == [] and not port_open("127.0.0.1", free_port)
