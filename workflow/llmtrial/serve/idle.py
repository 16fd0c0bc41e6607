"""A server held idle after its passes, and what a server that exited was doing when it died.

Seed 002's service crashed on its own while completely idle, with zero requests running or queued, and
only the kernel log (an Xid, which nvidia-smi did not show) said anything. ``serving.idle_watch_s`` holds
each configuration's server idle after its passes (and its task set) for that long, under the job's
telemetry, and checks every :data:`IDLE_POLL_S` that it is still up (:func:`watch_idle`). For any server
found down after it was ready, :func:`down_state` reads the job's samples: idle when its last /metrics
sample showed no request running or waiting and no benchmark pass was sending (its telemetry window open:
at concurrency 1 a sample can fall between two of its requests), the kernel log's lines from that sample on
(the telemetry's kernel-log source, then the health check after the failure), and what telemetry sampled
in that window.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from llmtrial.core.configuration_model import DownState, GpuHealth, TelemetrySource
from llmtrial.serve.passes import PhaseFailure
from llmtrial.serve.progress import say
from llmtrial.serve.server import ServerProcess
from llmtrial.serve.telemetry import Sampler, read_samples, window_figures

#: How often the idle watch checks that the server is still up, seconds.
IDLE_POLL_S = 0.5
#: The telemetry window the idle watch opens: its marks in the samples file are ``idle:start`` and ``idle:end``.
IDLE_WINDOW = "idle"
#: The telemetry sources :func:`down_state` reads: vLLM's /metrics and the kernel log.
METRICS, KERNEL_LOG = "metrics", "kernel_log"


def watch_idle(server: ServerProcess, seconds: float, sampler: Sampler, name: str) -> None:
    """Hold ``server`` idle for ``seconds`` (no request sent) in the telemetry window :data:`IDLE_WINDOW`;
    raise :class:`PhaseFailure` (phase idle, reason exited) when it is found down."""
    say("%s: holding the server idle for %g s (serving.idle_watch_s)", name, seconds)
    sampler.mark(f"{IDLE_WINDOW}:start")
    end = time.monotonic() + seconds
    try:
        while True:
            if not server.alive():
                raise PhaseFailure("idle", "exited", f"{server.down_reason()} while held idle after the passes "
                                   "(no request sent)", server.exit_code(), found_down_at=time.time())
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(IDLE_POLL_S, left))
    finally:
        sampler.mark(f"{IDLE_WINDOW}:end")


def down_state(samples: Path, found_down_at: float, sources: dict[str, TelemetrySource] | None,
               health: GpuHealth | None = None) -> DownState:
    """What the server found down at ``found_down_at`` was doing, from the job's samples file
    (``t,source,metric,value``), its telemetry sources (the kernel log's lines, in the order seen) and the
    health check after the failure (its new Xid lines)."""
    df = read_samples(samples) if samples.is_file() else None
    last = _last_metrics(df, found_down_at) if df is not None else None
    kernel = (sources or {}).get(KERNEL_LOG)
    events = [str(line) for line in (kernel.events or [])] if kernel is not None else []
    seen_before = _count_at(df, KERNEL_LOG, "nvrm_events", last[0]) if df is not None and last is not None else 0
    lines = events[seen_before:]
    for line in _health_lines(health):
        if line not in lines:
            lines.append(line)
    reason = None if kernel is not None and kernel.status != "absent" else (
        kernel.reason if kernel is not None else "the kernel log was not sampled")
    if last is None:
        return DownState(idle=None, pass_in_flight=None, found_down_at=found_down_at, last_sample_at=None, running=None,
                         waiting=None, kernel_lines=lines, kernel_log=reason, window=None)
    at, running, waiting = last
    assert df is not None
    sending = _open_window(df, at)
    idle = running == 0 and (waiting or 0) == 0 and sending is None if running is not None else None
    window = window_figures(df, at, found_down_at)
    window.start, window.end = at, found_down_at
    return DownState(idle=idle, pass_in_flight=sending, found_down_at=found_down_at, last_sample_at=at, running=running,
                     waiting=waiting, kernel_lines=lines, kernel_log=reason, window=window)


def _open_window(df, at: float) -> str | None:
    """The pass whose telemetry window (``<stem>:start`` to ``<stem>:end`` marks) was open at ``at``, or None
    (the idle watch's own window is no pass)."""
    marks = df[(df["source"] == "window") & (df["t"] <= at)].sort_values("t", kind="stable")
    open_: list[str] = []
    for metric in marks["metric"]:
        stem, _, edge = str(metric).rpartition(":")
        if edge == "start" and stem != IDLE_WINDOW:
            open_.append(stem)
        elif edge == "end" and stem in open_:
            open_.remove(stem)
    return open_[0] if open_ else None


def _last_metrics(df, before: float) -> tuple[float, float | None, float | None] | None:
    """The last /metrics sample at or before ``before`` that read the running gauge: its time, running, waiting."""
    rows = df[(df["source"] == METRICS) & (df["t"] <= before) & df["value"].notna()]
    running = rows[rows["metric"] == "running"]
    if running.empty:
        return None
    at = float(running["t"].max())
    here = rows[rows["t"] == at]

    def value(metric: str) -> float | None:
        got = here[here["metric"] == metric]["value"]
        return float(got.iloc[-1]) if not got.empty else None

    return at, value("running"), value("waiting")


def _count_at(df, source: str, metric: str, at: float) -> int:
    """A counter's value in its last sample at or before ``at`` (0 before the first)."""
    rows = df[(df["source"] == source) & (df["metric"] == metric) & (df["t"] <= at) & df["value"].notna()]
    return int(rows.sort_values("t")["value"].iloc[-1]) if not rows.empty else 0


def _health_lines(health: GpuHealth | None) -> Sequence[str]:
    """The kernel-log lines the health check after the failure found new: each GPU's Xid lines, then the others'."""
    if health is None:
        return []
    lines = [str(line) for gpu in health.gpus or [] for line in gpu.xid or []]
    return lines + [str(line) for line in health.xid_other or []]
