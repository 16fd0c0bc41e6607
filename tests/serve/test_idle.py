"""A server held idle after its passes, and what a server found down was doing (llmtrial.serve.idle).

The samples file is the job's long format (``t,source,metric,value``), written here as the sampler writes
it; the held server is a real process started by :class:`~llmtrial.serve.server.ServerProcess` that exits
on its own. The real vLLM server's idle crash is tests/host/test_gpu_host.py's second run.
"""

from __future__ import annotations

import sys
import time

import pytest

from conftest import DATA
from llmtrial.core.configuration_model import Failure, GpuCheck, GpuHealth, TelemetrySource
from llmtrial.core.records import load_record
from llmtrial.host.telemetry_sources import HostSource
from llmtrial.report.conclusions import failure_summary
from llmtrial.report.why_failed import why_failed
from llmtrial.serve.idle import down_state, watch_idle
from llmtrial.serve.passes import PhaseFailure
from llmtrial.serve.server import ServerProcess
from llmtrial.serve.telemetry import CSV_HEADER, Sampler

OLD = "[  811.20] NVRM: GPU at PCI:0000:17:00: GPU-5d1e0f3a-7c2b-4e11-9a0d-000000000000"
XID = "[ 9211.00] NVRM: Xid (PCI:0000:17:00): 79, pid=31337, name=python3, GPU has fallen off the bus."
CHECKED = "[ 9212.50] NVRM: Xid (PCI:0000:17:00): 79, pid=31337, name=python3, GPU has fallen off the bus again."


def samples(path, rows: list[tuple[float, str, str, float | str]]):
    path.write_text(",".join(CSV_HEADER) + "\n" + "".join(f"{t},{s},{m},{v}\n" for t, s, m, v in rows))
    return path


def metrics(t: float, running: float, waiting: float) -> list[tuple[float, str, str, float]]:
    return [(t, "metrics", "running", running), (t, "metrics", "waiting", waiting),
            (t, "metrics", "generation_tokens_total", 640.0)]


KERNEL = {"kernel_log": TelemetrySource(status="sampled", events=[OLD, XID])}


def test_a_server_whose_last_sample_showed_no_request_is_an_idle_crash_with_the_windows_kernel_lines(tmp_path):
    csv = samples(tmp_path / "telemetry.csv", [
        *metrics(100.0, 2, 1), (100.2, "kernel_log", "nvrm_events", 1.0),  # OLD was seen under load
        (100.5, "host", "cpu_percent", 90.0),
        *metrics(101.0, 0, 0), (101.5, "host", "cpu_percent", 3.0),
        (102.0, "kernel_log", "nvrm_events", 2.0),  # XID arrived after the last /metrics sample
        (102.2, "metrics", "error", "nan"),  # the scrape that found it gone
    ])
    health = GpuHealth(gpus=[GpuCheck(index=0, allocation={"status": "ok", "evidence": "ok"}, xid=[XID, CHECKED],
                                      healthy=False, evidence="kernel log")], xid_other=[])
    down = down_state(csv, 102.5, KERNEL, health)
    assert (down.idle, down.last_sample_at, down.running, down.waiting) == (True, 101.0, 0.0, 0.0)
    assert down.kernel_lines == [XID, CHECKED]  # not OLD, seen before the window; XID once
    assert down.kernel_log is None
    assert down.window is not None and (down.window.start, down.window.end) == (101.0, 102.5)
    assert down.window.summary["host.cpu_percent"].max == 3.0  # the window's own samples only


def test_a_sample_between_two_requests_of_a_pass_in_flight_is_not_idle(tmp_path):
    # at concurrency 1 the gauge reads 0 between one request's end and the next one's arrival
    csv = samples(tmp_path / "telemetry.csv", [
        (100.0, "window", "c1-pass1:start", 1.0), *metrics(100.0, 0, 0), *metrics(101.0, 1, 0),
        *metrics(102.0, 0, 0), (102.6, "window", "c1-pass1:end", 1.0)])
    down = down_state(csv, 102.5, KERNEL)
    assert (down.idle, down.pass_in_flight, down.running, down.last_sample_at) == (False, "c1-pass1", 0.0, 102.0)
    after = samples(tmp_path / "after.csv", [
        (100.0, "window", "c1-pass1:start", 1.0), *metrics(101.0, 1, 0), (102.0, "window", "c1-pass1:end", 1.0),
        (102.5, "window", "idle:start", 1.0), *metrics(103.0, 0, 0)])
    down = down_state(after, 104.0, KERNEL)  # the pass had ended: held idle, nothing sent
    assert (down.idle, down.pass_in_flight) == (True, None)


def test_a_server_that_died_with_requests_running_is_not_idle(tmp_path):
    csv = samples(tmp_path / "telemetry.csv", [*metrics(100.0, 0, 0), *metrics(101.0, 1, 3)])
    down = down_state(csv, 101.4, {"kernel_log": TelemetrySource(status="absent", reason="dmesg: not permitted")})
    assert (down.idle, down.running, down.waiting) == (False, 1.0, 3.0)
    assert down.kernel_lines == [] and down.kernel_log == "dmesg: not permitted"


def test_without_a_metrics_sample_after_start_up_idle_is_unknown(tmp_path):
    csv = samples(tmp_path / "telemetry.csv", [(100.0, "host", "cpu_percent", 50.0), *metrics(105.0, 0, 0)])
    down = down_state(csv, 101.0, KERNEL)  # the only /metrics sample came after it was found down
    assert (down.idle, down.last_sample_at, down.window) == (None, None, None)
    assert down.kernel_lines == [OLD, XID]  # every line the job saw: no sample bounds the window


@pytest.fixture
def sampler(tmp_path):
    with Sampler(tmp_path / "telemetry.csv", [HostSource()], interval=0.2) as s:
        yield s


def process(tmp_path, code: str) -> ServerProcess:
    server = ServerProcess([sys.executable, "-c", code], host="127.0.0.1", port=9, log_path=tmp_path / "server.log")
    server.start()
    return server


def test_the_idle_watch_holds_a_server_that_stays_up_and_marks_its_window(tmp_path, sampler):
    server = process(tmp_path, "import time; time.sleep(600)")
    try:
        watch_idle(server, 1.0, sampler, "tp1")
        assert server.alive()
    finally:
        server.stop()
    sampler.close()
    marks = [line.split(",")[2] for line in (tmp_path / "telemetry.csv").read_text().splitlines()
             if line.split(",")[1:2] == ["window"]]
    assert marks == ["idle:start", "idle:end"]


def test_a_server_that_exits_while_held_idle_ends_the_configuration_in_the_idle_phase(tmp_path, sampler):
    server = process(tmp_path, "import time, sys; time.sleep(0.5); sys.exit(3)")
    before = time.time()
    try:
        with pytest.raises(PhaseFailure) as raised:
            watch_idle(server, 600.0, sampler, "tp1")  # ends when it exits, not after the 600 s
    finally:
        server.stop()  # as the trial stops it: its folder removed
    failure = raised.value
    assert (failure.phase, failure.reason, failure.returncode) == ("idle", "exited", 3)
    assert "server exited with code 3 while held idle after the passes" in failure.message
    assert failure.found_down_at is not None and failure.found_down_at >= before


def test_the_report_says_the_server_crashed_while_idle_with_the_kernel_log_and_the_gpu_check(tmp_path):
    csv = samples(tmp_path / "telemetry.csv", [*metrics(100.0, 0, 0), (101.0, "kernel_log", "nvrm_events", 2.0)])
    health = GpuHealth(gpus=[GpuCheck(index=0, allocation={"status": "ok", "evidence": "ok"}, xid=[XID],
                                      healthy=False, evidence=f"kernel log: {XID}")], xid_other=[])
    base = load_record(DATA / "records" / "demo-default" / "configs" / "tp1" / "record.json", "configuration")
    failure = Failure(phase="idle", reason="exited", message="server exited with code -9 while held idle after the "
                      "passes (no request sent)", returncode=-9,
                      down=down_state(csv, 103.0, {"kernel_log": TelemetrySource(status="sampled", events=[XID])},
                                      health))
    rec = base.model_copy(update={"status": "failed", "failure": failure, "gpu_health": health})
    assert failure_summary(rec).endswith("; the server crashed while idle (its last /metrics sample showed no "
                                         "request running or waiting)")
    section = why_failed([rec])
    assert section is not None
    assert "tp1's server crashed while idle, no request running or waiting" in section.headline
    [said] = section.crashes
    assert said.startswith("tp1's server crashed while idle (its last /metrics sample showed no request running or "
                           "waiting), 3.0 s before it was found down.")
    assert f"The kernel log in that window: {XID} The GPU check after it: GPU 0 failed (kernel log: {XID})" in said
