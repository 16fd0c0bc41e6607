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

Sources shipped here: :class:`HostSource` (system CPU and memory, and the RSS/CPU of
the server's process tree). More sources (NVML, vLLM ``/metrics``, kernel log) plug in
by implementing the :class:`Source` protocol.
"""

from __future__ import annotations

import csv
import math
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Protocol, runtime_checkable

import psutil

if TYPE_CHECKING:  # pandas is only needed by read_samples / summarize_window
    import pandas

__all__ = [
    "CSV_HEADER",
    "ERROR_METRIC",
    "MAX_ERRORS_KEPT",
    "WINDOW_SOURCE",
    "HostSource",
    "Sampler",
    "Source",
    "read_samples",
    "summarize_window",
]

CSV_HEADER: tuple[str, str, str, str] = ("t", "source", "metric", "value")
"""Columns of the samples CSV."""

ERROR_METRIC = "error"
"""Metric name of the row written when a source's ``sample()`` raises (value NaN)."""

WINDOW_SOURCE = "window"
"""Source name of the rows written by :meth:`Sampler.mark`."""

MAX_ERRORS_KEPT = 20
"""How many error messages :attr:`Sampler.errors` keeps per source (the first ones)."""


@runtime_checkable
class Source(Protocol):
    """Something the sampler can poll.

    ``name`` labels the source's rows (the ``source`` column) and must be unique
    within one sampler. ``sample()`` returns ``{metric: value}`` for one instant; it
    may raise, in which case the sampler records the error and polls again at the next
    slot. A source may also define ``close()``; the sampler calls it once after the
    source's thread has stopped. ``sample()`` is only ever called from one thread.
    """

    name: str

    def sample(self) -> dict[str, float]:
        """Return metric name -> value for the current instant."""
        ...


class HostSource:
    """System CPU/memory and, when :attr:`pid` is set, the server's process tree.

    Metrics per sample:

    * ``cpu_percent`` -- system-wide CPU utilisation since the previous sample
      (0-100, all CPUs together; :func:`psutil.cpu_percent` with ``interval=None``).
    * ``mem_used_bytes``, ``mem_available_bytes`` -- :func:`psutil.virtual_memory`.
    * when :attr:`pid` is set and that process is alive:
      ``tree_rss_bytes`` (RSS summed over the process and all its descendants),
      ``tree_processes`` (how many were measured) and ``tree_cpu_percent`` (CPU
      utilisation summed over the tree, in percent of one CPU, so it can exceed 100).
      Processes that vanish or deny access mid-walk are skipped.

    :class:`psutil.Process` objects are cached by pid across samples so their
    ``cpu_percent`` deltas work; a process seen for the first time contributes 0 CPU
    in that sample. :attr:`pid` may be assigned at any time (for example once the
    server has been launched).
    """

    def __init__(self, pid: int | None = None, name: str = "host") -> None:
        self.name = name
        self.pid: int | None = pid
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(interval=None)  # prime: the first real call then has a baseline

    def sample(self) -> dict[str, float]:
        vm = psutil.virtual_memory()
        out: dict[str, float] = {
            "cpu_percent": float(psutil.cpu_percent(interval=None)),
            "mem_used_bytes": float(vm.used),
            "mem_available_bytes": float(vm.available),
        }
        pid = self.pid
        if pid is not None:
            tree = self._sample_tree(pid)
            if tree is not None:
                rss, count, cpu = tree
                out["tree_rss_bytes"] = float(rss)
                out["tree_processes"] = float(count)
                out["tree_cpu_percent"] = float(cpu)
        else:
            self._procs.clear()
        return out

    def _cached(self, proc: psutil.Process) -> psutil.Process:
        """The cached object for ``proc`` (same pid and create time), else ``proc``."""
        old = self._procs.get(proc.pid)
        # Process equality compares (pid, create_time), so a reused pid is a new process.
        return old if old is not None and old == proc else proc

    def _root(self, pid: int) -> psutil.Process | None:
        old = self._procs.get(pid)
        try:
            if old is not None and old.is_running():
                return old
            return psutil.Process(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def _sample_tree(self, pid: int) -> tuple[int, int, float] | None:
        root = self._root(pid)
        if root is None:
            self._procs.clear()
            return None
        try:
            members = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._procs.clear()
            return None
        except psutil.AccessDenied:
            members = [root]
        rss = 0
        cpu = 0.0
        seen: dict[int, psutil.Process] = {}
        for member in members:
            proc = self._cached(member)
            try:
                with proc.oneshot():
                    proc_rss = proc.memory_info().rss
                    proc_cpu = proc.cpu_percent(interval=None)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            rss += proc_rss
            cpu += proc_cpu
            seen[proc.pid] = proc
        self._procs = seen  # drop processes that are gone
        if not seen:
            return None
        return rss, len(seen), cpu


class _SourceState:
    """Book-keeping for one source's thread (guarded by the sampler's lock)."""

    __slots__ = ("source", "thread", "samples", "errors", "cpu_seconds", "skipped", "first_t", "last_t")

    def __init__(self, source: Source) -> None:
        self.source = source
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
                self._writer.writerow((f"{t:.3f}", source, metric, repr(value)))
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
            try:
                values = source.sample()
                rows = [(t, name, str(metric), float(value)) for metric, value in values.items()]
            except Exception as exc:  # noqa: BLE001 - any failure of a source is data
                failure = f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(t))} {type(exc).__name__}: {exc}"
                rows = [(t, name, ERROR_METRIC, math.nan)]
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
