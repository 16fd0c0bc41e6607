"""Tests for llmtrial.serve.telemetry: the per-second sampler and its window summaries."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import wait_until
from llmtrial.host.telemetry_sources import HostSource
from llmtrial.serve.telemetry import (
    ERROR_METRIC,
    MAX_ERRORS_KEPT,
    Sampler,
    read_samples,
    summarize_window,
    window_edge,
    window_figures,
)

MiB = 1 << 20


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _sample_times(rows: list[dict[str, str]], source: str) -> list[float]:
    """Distinct sample timestamps of one source, in file order."""
    out: list[float] = []
    for r in rows:
        if r["source"] == source:
            t = float(r["t"])
            if not out or out[-1] != t:
                out.append(t)
    return out


def _assert_on_the_grid(st: dict[str, float], interval: float, elapsed: float) -> None:
    """What the sampler's grid of deadlines promises whatever the machine's speed, for a source that
    took ``st["samples"]`` samples in ``elapsed`` seconds (monotonic, around the whole with-block):
    each sample has a slot of its own, so the mean gap is an interval or more (less only by the
    first gap, as a late first sample is followed by the next slot), no more samples and skipped
    slots than slots that passed, and the mean gap no longer than the time sampled allows."""
    n = st["samples"]
    assert n >= 3, st
    assert interval * (n - 2) / (n - 1) < st["achieved_interval_s"] <= elapsed / (n - 1), (st, elapsed)
    assert n + st["skipped_slots"] <= elapsed / interval + 1, (st, elapsed)


def _no_sampler_threads(sampler: Sampler) -> bool:
    own = not any(t.is_alive() for t in sampler.threads)
    named = not any(t.name.startswith("llmtrial-telemetry-") for t in threading.enumerate())
    return own and named


# A parent that starts a child which allocates (and touches) 64 MiB, says "ready", sleeps.
_TREE_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import sys, time; b = b'\\\\x01' * (64 << 20); print('ready', flush=True); time.sleep(60)"])
    child.wait()
    """
)


@pytest.fixture
def process_tree():
    proc = subprocess.Popen(
        [sys.executable, "-c", _TREE_SCRIPT],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_host_source_samples_process_tree(tmp_path: Path, process_tree: subprocess.Popen) -> None:
    out = tmp_path / "samples.csv"
    host = HostSource()  # pid set later, as the workflow does once the server is up
    t0, m0, cpu0 = time.time(), time.monotonic(), time.process_time()
    with Sampler(out, [host], interval=0.2) as sampler:
        host.pid = process_tree.pid
        with_pid = sampler.stats()["host"]["samples"] + 2  # one in flight may have begun without the pid
        wait_until(lambda: sampler.stats()["host"]["samples"] >= max(6, with_pid), "six host samples")
    t1, m1, cpu1 = time.time(), time.monotonic(), time.process_time()

    assert _no_sampler_threads(sampler)
    rows = _rows(out)
    assert rows and list(rows[0]) == ["t", "source", "metric", "value"]
    by_metric: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        assert r["source"] == "host"
        by_metric[r["metric"]].append(float(r["value"]))
    for metric in ("cpu_percent", "mem_used_bytes", "mem_available_bytes"):
        assert len(by_metric[metric]) >= 6, metric
    assert all(0.0 <= v <= 100.0 for v in by_metric["cpu_percent"])
    assert max(by_metric["tree_rss_bytes"]) > 50 * MiB
    assert max(by_metric["tree_processes"]) >= 2
    assert all(v >= 0 for v in by_metric["tree_cpu_percent"])

    times = _sample_times(rows, "host")
    assert all(b > a for a, b in zip(times, times[1:], strict=False)), "timestamps must increase"
    assert t0 - 0.001 <= times[0] and times[-1] <= t1 + 0.001

    st = sampler.stats()["host"]
    assert st["samples"] == len(times)
    assert st["errors"] == 0
    _assert_on_the_grid(st, 0.2, m1 - m0)
    # the sampler's CPU time is its threads' own: more than nothing, and within this process's CPU time
    # (benchmarks/sampler_cost.py prints the figure against its target)
    assert 0.0 < st["cpu_seconds_per_sample"] * st["samples"] <= cpu1 - cpu0


def test_host_source_without_live_pid() -> None:
    host = HostSource()
    assert set(host.sample()) == {"cpu_percent", "mem_used_bytes", "mem_available_bytes"}
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host.pid = dead.pid
    assert "tree_rss_bytes" not in host.sample()
    host.pid = os.getpid()
    got = host.sample()
    assert got["tree_processes"] >= 1 and got["tree_rss_bytes"] > 0


class _Failing:
    name = "failing"

    def __init__(self) -> None:
        self.closed = False

    def sample(self) -> dict[str, float]:
        raise RuntimeError("device unreachable")

    def close(self) -> None:
        self.closed = True


class _Hung:
    """A source whose sample() cannot finish until the test releases it (a scrape that hangs)."""

    name = "slow"

    def __init__(self) -> None:
        self.released = threading.Event()

    def sample(self) -> dict[str, float]:
        if not self.released.wait(120):
            raise TimeoutError("never released")
        return {"x": 1.0}


def test_failing_and_slow_sources_do_not_disturb_host(tmp_path: Path) -> None:
    out = tmp_path / "samples.csv"
    failing, slow = _Failing(), _Hung()
    m0 = time.monotonic()
    with Sampler(out, [HostSource(), failing, slow], interval=0.2) as sampler:
        try:
            # While the slow source's first sample hangs, the host and the failing source go on: 10 samples
            # each, the tenth on slot 9 or later, so the hung sample ends 1.8 s or more after the start.
            wait_until(lambda: min(sampler.stats()[n]["samples"] for n in ("host", "failing")) >= 10,
                       "ten samples of the host and the failing source beside a hung one")
            assert sampler.stats()["slow"]["samples"] == 0
        finally:
            slow.released.set()
        wait_until(lambda: sampler.stats()["slow"]["samples"] >= 2, "the slow source sampling again once released")
    elapsed = time.monotonic() - m0
    assert _no_sampler_threads(sampler)
    assert failing.closed

    stats = sampler.stats()
    host, fail, slow_st = stats["host"], stats["failing"], stats["slow"]
    # The host source keeps its grid although others fail or hang.
    _assert_on_the_grid(host, 0.2, elapsed)
    assert host["errors"] == 0 and not sampler.errors["host"]
    # The failing source is polled on the same grid; every call is an error.
    _assert_on_the_grid(fail, 0.2, elapsed)
    assert fail["errors"] == fail["samples"]
    assert 1 <= len(sampler.errors["failing"]) <= MAX_ERRORS_KEPT
    assert "RuntimeError: device unreachable" in sampler.errors["failing"][0]
    # The slow source skips the 8 or more slots its hung sample missed instead of bursting to catch up.
    assert slow_st["skipped_slots"] >= 8 and slow_st["errors"] == 0
    assert slow_st["samples"] + slow_st["skipped_slots"] <= elapsed / 0.2 + 1

    df = read_samples(out)
    err = df[df["source"] == "failing"]
    assert len(err) == fail["samples"]
    assert (err["metric"] == ERROR_METRIC).all() and err["value"].isna().all()
    assert len(df[df["source"] == "host"]["t"].unique()) == host["samples"]


def test_errors_are_capped(tmp_path: Path) -> None:
    with Sampler(tmp_path / "s.csv", [_Failing()], interval=0.01) as sampler:
        wait_until(lambda: sampler.stats()["failing"]["errors"] > MAX_ERRORS_KEPT, "more errors than are kept")
    assert sampler.stats()["failing"]["errors"] > MAX_ERRORS_KEPT
    assert len(sampler.errors["failing"]) == MAX_ERRORS_KEPT


def test_csv_reads_back_with_marks(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "samples.csv"
    with Sampler(out, [HostSource()], interval=0.2) as sampler:
        sampler.mark("scenario:start")
        inside = sampler.stats()["host"]["samples"] + 3  # of these 3, one in flight may predate the mark
        wait_until(lambda: sampler.stats()["host"]["samples"] >= inside, "two host samples after the mark")
        sampler.mark("scenario:end")
    with pytest.raises(RuntimeError):
        sampler.mark("late")

    df = read_samples(out)
    assert list(df.columns) == ["t", "source", "metric", "value"]
    assert df["t"].dtype == float and df["value"].dtype == float
    marks = df[df["source"] == "window"]
    assert marks["metric"].tolist() == ["scenario:start", "scenario:end"]
    assert (marks["value"] == 1.0).all()
    start, end = marks["t"].tolist()
    summary = summarize_window(df, start, end)
    assert "window.scenario:start" not in summary
    assert summary["host.cpu_percent"]["n"] >= 2
    # Millisecond precision of t in the file.
    text = out.read_text().splitlines()[1]
    assert len(text.split(",")[0].split(".")[1]) == 3


def _hand_built_columns() -> dict[str, list]:
    t, src, met, val = [], [], [], []

    def add(ti: float, s: str, m: str, v: float) -> None:
        t.append(ti), src.append(s), met.append(m), val.append(v)

    for i in range(11):  # host.cpu at t = 100..110 with value 10*i
        add(100.0 + i, "host", "cpu_percent", 10.0 * i)
    add(103.5, "host", ERROR_METRIC, math.nan)  # error row inside the window: skipped
    add(104.5, "host", "tree_rss_bytes", math.nan)  # NaN value: skipped
    add(103.0, "gpu", "power_w", 300.0)
    add(104.0, "gpu", "power_w", 100.0)
    add(109.0, "gpu", "power_w", 999.0)  # outside the window
    add(102.0, "window", "scenario:start", 1.0)
    return {"t": t, "source": src, "metric": met, "value": val}


def _as_dataframe(cols: dict[str, list]):
    pd = pytest.importorskip("pandas")
    return pd.DataFrame(cols)


@pytest.mark.parametrize("build", [_as_dataframe, lambda c: c], ids=["dataframe", "mapping"])
def test_summarize_window_selects_rows_inside(build) -> None:
    df = build(_hand_built_columns())
    got = summarize_window(df, 102.0, 105.0)  # inclusive: cpu values 20, 30, 40, 50
    assert set(got) == {"host.cpu_percent", "gpu.power_w"}
    assert got["host.cpu_percent"] == {"mean": 35.0, "p50": 35.0, "max": 50.0, "min": 20.0, "n": 4}
    assert got["gpu.power_w"] == {"mean": 200.0, "p50": 200.0, "max": 300.0, "min": 100.0, "n": 2}

    odd = summarize_window(df, 101.5, 104.0, source="host")  # 20, 30, 40
    assert odd == {"host.cpu_percent": {"mean": 30.0, "p50": 30.0, "max": 40.0, "min": 20.0, "n": 3}}
    assert summarize_window(df, 200.0, 300.0) == {}
    assert set(summarize_window(df, 0, 1e9, source="window")) == {"window.scenario:start"}


def test_sampler_rejects_bad_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Sampler(tmp_path / "a.csv", [HostSource()], interval=0)
    with pytest.raises(ValueError):
        Sampler(tmp_path / "a.csv", [HostSource(), HostSource()])
    with pytest.raises(ValueError):
        Sampler(tmp_path / "a.csv", [HostSource(name="window")])


class _Counter:
    """A counter that moves by 1 between calls, like a server's token counter during a pass."""

    name = "metrics"

    def __init__(self) -> None:
        self.value = 0.0

    def sample(self) -> dict[str, float]:
        self.value += 1.0
        return {"x_total": self.value}


def test_a_sample_taken_at_a_windows_edges_counts_inside_it(tmp_path: Path, monkeypatch) -> None:
    """The CSV keeps milliseconds: a sample taken just after a window opens is written rounded
    down, so the window's recorded start is rounded down too (and its end up), else the first
    sample falls out of the window and a counter's change loses what moved before the next one.
    The clock here sits 0.4 ms into a millisecond, as it did when a pass lost 19 tokens this way."""
    out = tmp_path / "s.csv"
    clock = iter([1796084658.8053486, 1796084658.8054, 1796084658.8055, 1796084665.5384, 1796084665.5385])
    with Sampler(out, [_Counter()], interval=3600) as sampler:
        # the scheduled first sample (taken at once, on the real clock) before the clock is replaced
        wait_until(lambda: sampler.stats()["metrics"]["samples"], "the scheduled first sample")
        monkeypatch.setattr(time, "time", lambda: next(clock))
        start = window_edge(time.time())
        sampler.sample_now("metrics")  # the counter at the pass's start
        sampler.sample_now("metrics")  # moved during the pass
        sampler.sample_now("metrics")  # at the pass's end
        end = window_edge(time.time(), end=True)
        monkeypatch.undo()
    df = read_samples(out)
    figures = window_figures(df, start, end).model_dump(exclude_unset=True)
    assert figures["deltas"]["metrics.x_total"] == 2.0  # first and last sample both inside
    assert start <= 1796084658.8053486 <= 1796084665.5385 <= end
