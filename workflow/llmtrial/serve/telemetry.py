"""Telemetry: a per-second sampler that runs beside one serving configuration's job.

A :class:`Sampler` polls a set of :class:`Source` objects on a fixed grid of instants
and appends what they return to a CSV file in long format::

    t,source,metric,value
    1732896000.125,host,cpu_percent,37.5
    1732896000.125,host,mem_used_bytes,8123456512.0

``t`` is :func:`time.time` (Unix seconds, millisecond precision), the same clock the
rest of the project uses for scenario window start/end, so a scenario's figures are
:func:`summarize_window` over its ``[start, end]``.

Each source runs on its own daemon thread, so a slow source (an HTTP scrape, a kernel
log read) never delays the others. All threads share one grid of deadlines
``start + k * interval`` taken from :func:`time.monotonic`, so intervals do not drift;
a sample that overruns skips the slots it missed instead of bursting to catch up.
A source whose ``sample()`` raises gets one ``error`` row (value NaN) per failure, the
message is kept in :attr:`Sampler.errors`, and sampling goes on.

The sources (host, NVML, vLLM ``/metrics``, kernel log) live in :mod:`llmtrial.host.telemetry_sources`.
"""

from __future__ import annotations

import csv
import math
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from llmtrial.core.configuration_model import TelemetrySource
from llmtrial.core.scenario_model import WindowFigures, WindowStat
from llmtrial.host.telemetry_sources import KernelLogSource, NvmlSource, Source
from llmtrial.serve.energy import window_energy

if TYPE_CHECKING:  # pandas is only needed by read_samples / summarize_window
    import pandas

__all__ = [
    "CSV_HEADER",
    "ERROR_METRIC",
    "MAX_ERRORS_KEPT",
    "WINDOW_SOURCE",
    "window_figures",
    "Sampler",
    "describe_sources",
    "read_samples",
    "summarize_window",
    "window_edge",
]

CSV_HEADER: tuple[str, str, str, str] = ("t", "source", "metric", "value")
"""Columns of the samples CSV."""

ERROR_METRIC = "error"
"""Metric name of the row written when a source's ``sample()`` raises (value NaN)."""

WINDOW_SOURCE = "window"
"""Source name of the rows written by :meth:`Sampler.mark`."""

TIME_DECIMALS = 3
"""Decimals of a sample's time in the CSV (milliseconds)."""


def window_edge(t: float, *, end: bool = False) -> float:
    """A window's edge at the CSV's resolution: a start rounded down, an end rounded up, so a
    sample taken just after the start (or just before the end) and written in milliseconds
    still lies inside the window."""
    scale = 10 ** TIME_DECIMALS
    return (math.ceil if end else math.floor)(t * scale) / scale

MAX_ERRORS_KEPT = 20
"""How many error messages :attr:`Sampler.errors` keeps per source (the first ones)."""


class _SourceState:
    """Book-keeping for one source's thread (guarded by the sampler's lock)."""

    __slots__ = ("source", "thread", "samples", "errors", "cpu_seconds", "skipped", "first_t", "last_t", "calling",
                 "retired")

    def __init__(self, source: Source) -> None:
        self.source = source
        self.calling = threading.Lock()  # one sample() at a time: the thread's or sample_now's
        self.retired = False  # set by Sampler.retire: no more samples
        self.thread: threading.Thread | None = None
        self.samples = 0
        self.errors = 0
        self.cpu_seconds = 0.0
        self.skipped = 0
        self.first_t: float | None = None  # monotonic time of the first sample
        self.last_t: float | None = None  # monotonic time of the latest sample


class Sampler:
    """Poll ``sources`` every ``interval`` seconds into ``out_csv`` while in a ``with``.

    ``__enter__`` creates the CSV (header ``t,source,metric,value``) and starts one
    daemon thread per source; the first sample is taken at once. ``__exit__`` stops the
    threads, joins them (each for at most ``join_timeout`` seconds), calls the sources'
    ``close()`` and closes the file. A sampler is used once.

    Rows are written under a lock and the file is flushed after each sample's batch,
    so the CSV is readable while the job runs and survives a kill up to the last
    flushed sample.

    Attributes:
        errors: per source name, the first :data:`MAX_ERRORS_KEPT` messages of the
            exceptions its ``sample()`` raised (or the sampler hit on its behalf).
    """

    def __init__(
        self,
        out_csv: Path,
        sources: list[Source],
        interval: float = 1.0,
        join_timeout: float = 10.0,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        names = [s.name for s in sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique, repeated: {dupes}")
        if WINDOW_SOURCE in names:
            raise ValueError(f"source name {WINDOW_SOURCE!r} is reserved for Sampler.mark")
        self.out_csv = Path(out_csv)
        self.interval = float(interval)
        self.join_timeout = float(join_timeout)
        self.errors: dict[str, list[str]] = {n: [] for n in names}
        self._states = {s.name: _SourceState(s) for s in sources}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._fh: IO[str] | None = None
        self._writer: Any = None  # csv writer; typeshed's _writer is private
        self._start_mono = 0.0
        self._used = False
        self._closed = False

    # -- context manager ---------------------------------------------------------------

    def __enter__(self) -> Sampler:
        if self._used:
            raise RuntimeError("a Sampler can be entered only once")
        self._used = True
        self.out_csv.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.out_csv, "w", newline="", encoding="utf-8")
        self._writer = csv.writer(self._fh)
        self._writer.writerow(CSV_HEADER)
        self._fh.flush()
        self._start_mono = time.monotonic()
        for name, state in self._states.items():
            state.thread = threading.Thread(
                target=self._run, args=(state,), name=f"llmtrial-telemetry-{name}", daemon=True
            )
        for state in self._states.values():
            assert state.thread is not None
            state.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop and join the threads, close the sources and the file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        deadline = time.monotonic() + self.join_timeout
        for name, state in self._states.items():
            if state.thread is None:
                continue
            state.thread.join(max(0.0, deadline - time.monotonic()))
            if state.thread.is_alive():
                self._note_error(name, f"thread did not stop within {self.join_timeout:g} s")
        for name, state in self._states.items():
            closer = getattr(state.source, "close", None)
            if callable(closer) and state.thread is not None and not state.thread.is_alive():
                try:
                    closer()
                except Exception as exc:  # noqa: BLE001 - a failing close must not hide the data
                    self._note_error(name, f"close: {type(exc).__name__}: {exc}")
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
                self._fh.close()
                self._fh = None
                self._writer = None

    # -- public helpers ----------------------------------------------------------------

    @property
    def threads(self) -> list[threading.Thread]:
        """The source threads (started by ``__enter__``; none alive after a clean exit)."""
        return [s.thread for s in self._states.values() if s.thread is not None]

    def mark(self, label: str) -> None:
        """Write a row ``(now, "window", label, 1)``, e.g. ``mark("scenario-a:start")``."""
        if not self._write([(time.time(), WINDOW_SOURCE, label, 1.0)]):
            raise RuntimeError("Sampler.mark called outside the with-block")

    def stats(self) -> dict[str, dict[str, float]]:
        """The sampler's own cost and cadence, per source name.

        ``samples`` (calls made, failed ones included), ``errors``,
        ``cpu_seconds_per_sample`` (thread CPU time per call, :func:`time.thread_time`),
        ``achieved_interval_s`` (mean gap between consecutive calls; NaN below two
        calls) and ``skipped_slots`` (grid slots skipped because a call overran).
        """
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for name, s in self._states.items():
                if s.samples >= 2 and s.first_t is not None and s.last_t is not None:
                    gap = (s.last_t - s.first_t) / (s.samples - 1)
                else:
                    gap = math.nan
                out[name] = {
                    "samples": s.samples,
                    "errors": s.errors,
                    "cpu_seconds_per_sample": s.cpu_seconds / s.samples if s.samples else math.nan,
                    "achieved_interval_s": gap,
                    "skipped_slots": s.skipped,
                }
        return out

    # -- internals ---------------------------------------------------------------------

    @staticmethod
    def _call(source: Source, t: float) -> tuple[list[tuple[float, str, str, float]], str | None]:
        """One sample() as rows, or an error row and the message."""
        try:
            values = source.sample()
            return [(t, source.name, str(metric), float(value)) for metric, value in values.items()], None
        except Exception as exc:  # noqa: BLE001 - any failure of a source is data
            failure = f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(t))} {type(exc).__name__}: {exc}"
            return [(t, source.name, ERROR_METRIC, math.nan)], failure

    @property
    def names(self) -> list[str]:
        """The sources' names, in the order given."""
        return list(self._states)

    def sample_now(self, name: str) -> None:
        """Sample source ``name`` at once, outside its schedule (at a window's edges, so a
        counter's change over the window is exact). Not counted in :meth:`stats`."""
        state = self._states[name]
        with state.calling:
            rows, failure = self._call(state.source, time.time())
        if failure is not None:
            self._note_error(name, failure)
        self._write(rows)

    def retire(self, name: str) -> None:
        """Stop sampling source ``name`` now (waiting for a sample in flight), for a source
        whose subject is about to go away on purpose, such as a server being stopped."""
        state = self._states[name]
        with state.calling:
            state.retired = True

    def _note_error(self, name: str, message: str) -> None:
        with self._lock:
            kept = self.errors.setdefault(name, [])
            if len(kept) < MAX_ERRORS_KEPT:
                kept.append(message)

    def _write(self, rows: Iterable[tuple[float, str, str, float]]) -> bool:
        """Append rows and flush; False when the file is closed already."""
        with self._lock:
            if self._writer is None or self._fh is None:
                return False
            for t, source, metric, value in rows:
                self._writer.writerow((f"{t:.{TIME_DECIMALS}f}", source, metric, repr(value)))
            self._fh.flush()
            return True

    def _run(self, state: _SourceState) -> None:
        source = state.source
        name = source.name
        interval = self.interval
        start = self._start_mono
        k = 0
        while True:
            wait = start + k * interval - time.monotonic()
            if wait > 0:
                if self._stop.wait(wait):
                    return
            elif self._stop.is_set():
                return
            mono = time.monotonic()
            t = time.time()
            cpu0 = time.thread_time()
            failure: str | None = None
            rows: list[tuple[float, str, str, float]] = []
            with state.calling:
                if state.retired:
                    return
                rows, failure = self._call(source, t)
            cpu = time.thread_time() - cpu0
            with self._lock:
                state.samples += 1
                state.cpu_seconds += cpu
                if state.first_t is None:
                    state.first_t = mono
                state.last_t = mono
                if failure is not None:
                    state.errors += 1
            if failure is not None:
                self._note_error(name, failure)
            try:
                if not self._write(rows):
                    return  # file closed under us (thread outlived the join timeout)
            except (OSError, ValueError) as exc:
                self._note_error(name, f"write: {type(exc).__name__}: {exc}")
            # Next slot on the grid strictly after now; missed slots are skipped.
            k += 1
            now_k = math.floor((time.monotonic() - start) / interval) + 1
            if now_k > k:
                with self._lock:
                    state.skipped += now_k - k
                k = now_k


def describe_sources(sampled: list[Any], absent: list[Any], sampler: Sampler) -> dict[str, TelemetrySource]:
    """Each source's status for the record: sampled, failed at times (with the sampler's
    errors), or absent with the reason; the kernel log's events and NVML's refusals."""
    out: dict[str, TelemetrySource] = {}
    for src in sampled:
        item = TelemetrySource(status="failed at times" if sampler.errors.get(src.name) else "sampled")
        if isinstance(src, KernelLogSource):
            item.events = list(src.events)
        if isinstance(src, NvmlSource):
            item.field_errors, item.lost_gpus = src.field_errors, src.lost
        out[src.name] = item
    for src in absent:
        out[src.name] = TelemetrySource(status="absent", reason=src.reason)
    return out


def read_samples(csv_path: Path) -> pandas.DataFrame:
    """Read a samples CSV into a DataFrame with columns ``t, source, metric, value``.

    ``t`` and ``value`` are floats (error rows have value NaN); ``source`` and
    ``metric`` are strings. A torn last line (job killed mid-write) yields NaN, which
    :func:`summarize_window` skips.
    """
    import pandas as pd

    df = pd.read_csv(
        csv_path,
        keep_default_na=False,
        na_values={"t": ["", "nan"], "value": ["", "nan", "NaN"]},
        dtype={"source": str, "metric": str},
    )
    df["t"] = pd.to_numeric(df["t"], errors="coerce").astype(float)
    df["value"] = pd.to_numeric(df["value"], errors="coerce").astype(float)
    return df[list(CSV_HEADER)]


def summarize_window(
    df: pandas.DataFrame | Mapping[str, Any],
    start: float,
    end: float,
    source: str | None = None,
) -> dict[str, dict[str, float]]:
    """Per ``"source.metric"``: ``mean``, ``p50``, ``max``, ``min``, ``n`` over a window.

    Takes the rows with ``start <= t <= end`` (and ``source`` when given), skipping
    ``error`` rows, NaN values and the :meth:`Sampler.mark` rows (source ``window``;
    those are kept only when ``source="window"`` is asked for). ``p50`` is the median
    (midpoint of the two middle values for an even count). Metrics without any valid
    value in the window are absent. ``df`` is what :func:`read_samples` returns, or any
    mapping of those four column names to equal-length sequences.
    """
    import numpy as np

    t = np.asarray(df["t"], dtype=float)
    src = np.asarray(df["source"], dtype=object).astype(str)
    met = np.asarray(df["metric"], dtype=object).astype(str)
    val = np.asarray(df["value"], dtype=float)
    keep = (t >= start) & (t <= end) & (met != ERROR_METRIC) & ~np.isnan(val)
    keep &= (src == source) if source is not None else (src != WINDOW_SOURCE)
    out: dict[str, dict[str, float]] = {}
    if not keep.any():
        return out
    keys = np.char.add(np.char.add(src[keep].astype(str), "."), met[keep].astype(str))
    kept = val[keep]
    for key in sorted(set(keys.tolist())):
        v = kept[keys == key]
        out[key] = {
            "mean": float(np.mean(v)),
            "p50": float(np.median(v)),
            "max": float(np.max(v)),
            "min": float(np.min(v)),
            "n": int(v.size),
        }
    return out


def window_figures(df: pandas.DataFrame | Mapping[str, Any], start: float, end: float) -> WindowFigures:
    """What one window (a scenario pass, or start-up) shows: :func:`summarize_window`
    plus, for counters, the change over the window (``<source>.<metric>`` ending in
    ``_total``, a GPU's ``energy_mj`` or a CPU package's ``energy_uj``, under ``"deltas"``),
    the GPU energy in joules checked against the integral of sampled power and the CPU
    package energy (:func:`llmtrial.serve.energy.window_energy`), and tokens per joule where
    GPU energy and generated tokens are both known."""
    import numpy as np

    deltas: dict[str, float] = {}
    t = np.asarray(df["t"], dtype=float)
    src = np.asarray(df["source"], dtype=object).astype(str)
    met = np.asarray(df["metric"], dtype=object).astype(str)
    val = np.asarray(df["value"], dtype=float)
    inside = (t >= start) & (t <= end) & ~np.isnan(val) & (met != ERROR_METRIC)

    def series(source: str, metric: str) -> tuple[Any, Any]:
        sel = inside & (src == source) & (met == metric)
        order = np.argsort(t[sel], kind="stable")
        return t[sel][order], val[sel][order]

    keys = sorted(set(zip(src[inside].tolist(), met[inside].tolist(), strict=True)))
    for source, metric in keys:
        if metric.endswith(("_total", "energy_mj", "energy_uj")):
            v = series(source, metric)[1]
            deltas[f"{source}.{metric}"] = float(v[-1] - v[0])
    figures = window_energy(series, keys, deltas)
    figures.summary = {key: WindowStat(**stat) for key, stat in summarize_window(df, start, end).items()}
    figures.deltas = deltas
    tokens = deltas.get("metrics.generation_tokens_total")
    if figures.energy_j and tokens:
        figures.tokens_per_joule = tokens / figures.energy_j
    return figures
