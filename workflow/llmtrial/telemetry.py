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

import contextlib
import csv
import math
import re
import subprocess
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
    "KernelLogSource",
    "MetricsSource",
    "NvmlSource",
    "window_figures",
    "Sampler",
    "Source",
    "describe_sources",
    "job_sources",
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


class NvmlSource:
    """Per-GPU figures from NVML (nvidia-ml-py's ``pynvml``; ``nvml`` lets tests pass a double).

    Metrics are named ``gpu<i>.<field>``: ``util_percent``, ``mem_util_percent``,
    ``mem_used_bytes``, ``mem_total_bytes``, ``power_w``, ``power_limit_w``,
    ``energy_mj`` (the board's cumulative counter), ``temp_c``, ``sm_clock_mhz``,
    ``mem_clock_mhz``, ``throttle_reasons`` (bitmask), ``pcie_tx_kbps``, ``pcie_rx_kbps``,
    ``processes`` and ``processes_mem_bytes``. A field NVML refuses is left out of that
    sample and counted in :attr:`field_errors`; a GPU that stops answering every field
    is marked ``gpu<i>.lost = 1`` once and no longer polled. On a host without the
    library or the driver the source is :attr:`available` False with the reason, and the
    sampler is not given it.
    """

    FIELDS = (
        ("util_percent", "nvmlDeviceGetUtilizationRates", lambda r: r.gpu),
        ("mem_util_percent", "nvmlDeviceGetUtilizationRates", lambda r: r.memory),
        ("mem_used_bytes", "nvmlDeviceGetMemoryInfo", lambda r: r.used),
        ("mem_total_bytes", "nvmlDeviceGetMemoryInfo", lambda r: r.total),
        ("power_w", "nvmlDeviceGetPowerUsage", lambda mw: mw / 1000.0),
        ("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", lambda mw: mw / 1000.0),
        ("energy_mj", "nvmlDeviceGetTotalEnergyConsumption", lambda mj: mj),
        ("temp_c", "nvmlDeviceGetTemperature", lambda c: c),
        ("sm_clock_mhz", "nvmlDeviceGetClockInfo", lambda c: c),
        ("mem_clock_mhz", "nvmlDeviceGetClockInfo", lambda c: c),
        ("throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons", lambda r: r),
        ("pcie_tx_kbps", "nvmlDeviceGetPcieThroughput", lambda k: k),
        ("pcie_rx_kbps", "nvmlDeviceGetPcieThroughput", lambda k: k),
    )

    def __init__(self, nvml: Any | None = None, name: str = "nvml") -> None:
        self.name = name
        self.available = False
        self.reason: str | None = None
        self.field_errors = 0
        self.lost: list[int] = []
        self._nvml = nvml
        self._handles: list[Any] = []
        if self._nvml is None:
            try:
                import pynvml  # type: ignore[import-not-found]

                self._nvml = pynvml
            except ImportError:
                self.reason = "nvidia-ml-py (pynvml) is not installed"
                return
        try:
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {exc}"
            return
        if not self._handles:
            self.reason = "NVML lists no GPU"
            return
        self.available = True

    def _args(self, field: str, handle: Any) -> tuple[Any, ...]:
        n = self._nvml
        extra = {
            "temp_c": (getattr(n, "NVML_TEMPERATURE_GPU", 0),),
            "sm_clock_mhz": (getattr(n, "NVML_CLOCK_SM", 1),),
            "mem_clock_mhz": (getattr(n, "NVML_CLOCK_MEM", 2),),
            "pcie_tx_kbps": (getattr(n, "NVML_PCIE_UTIL_TX_BYTES", 0),),
            "pcie_rx_kbps": (getattr(n, "NVML_PCIE_UTIL_RX_BYTES", 1),),
        }
        return (handle, *extra.get(field, ()))

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, handle in enumerate(self._handles):
            if i in self.lost:
                continue
            got = 0
            for field, fn, convert in self.FIELDS:
                try:
                    out[f"gpu{i}.{field}"] = float(convert(getattr(self._nvml, fn)(*self._args(field, handle))))
                    got += 1
                except Exception:  # one field NVML refuses: leave it out, keep the rest
                    self.field_errors += 1
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                out[f"gpu{i}.processes"] = float(len(procs))
                out[f"gpu{i}.processes_mem_bytes"] = float(sum(getattr(p, "usedGpuMemory", 0) or 0 for p in procs))
                got += 1
            except Exception:
                self.field_errors += 1
            if got == 0:
                self.lost.append(i)
                out[f"gpu{i}.lost"] = 1.0
        return out

    def close(self) -> None:
        if self.available:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


class MetricsSource:
    """The vLLM server's Prometheus ``/metrics``, parsed with prometheus_client.

    Gauges: ``kv_cache_usage`` (0-1), ``running``, ``waiting``; counters (summed over
    label sets): ``preemptions_total``, ``prompt_tokens_total``,
    ``generation_tokens_total``, ``prefix_cache_queries_total``,
    ``prefix_cache_hits_total``, ``requests_finished_total``. Before the server first answers, a sample is empty
    (start-up is not a failure); once it has answered, a failed scrape is an error.
    """

    NAMES = {
        "vllm:kv_cache_usage_perc": "kv_cache_usage",
        "vllm:gpu_cache_usage_perc": "kv_cache_usage",
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        "vllm:num_preemptions_total": "preemptions_total",
        "vllm:prompt_tokens_total": "prompt_tokens_total",
        "vllm:generation_tokens_total": "generation_tokens_total",
        "vllm:prefix_cache_queries_total": "prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total": "prefix_cache_hits_total",
        "vllm:request_success_total": "requests_finished_total",
    }

    def __init__(self, host: str, port: int, name: str = "metrics", timeout: float = 2.0) -> None:
        self.name = name
        self.url = f"http://{host}:{port}/metrics"
        self.timeout = timeout
        self.seen = False

    def sample(self) -> dict[str, float]:
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as resp:
                text = resp.read().decode("utf-8", "replace")
        except OSError:
            if not self.seen:
                return {}
            raise
        self.seen = True
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = self.NAMES.get(sample.name)
                if key is not None:
                    out[key] = out.get(key, 0.0) + float(sample.value)
        return out


class KernelLogSource:
    """GPU driver errors in the kernel log (``dmesg``): Xid and other NVRM lines.

    The lines present when the source starts are the baseline; each sample reports
    ``xid_events`` and ``nvrm_events`` seen since, and keeps the new lines in
    :attr:`events`. Where the kernel log cannot be read (no permission, no dmesg) the
    source is :attr:`available` False with the reason, never retried with more rights.
    """

    XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)")

    def __init__(self, name: str = "kernel_log", command: list[str] | None = None) -> None:
        self.name = name
        self.command = command or ["dmesg"]
        self.available = False
        self.reason: str | None = None
        self.events: list[str] = []
        try:
            self._baseline = set(self._read())
            self.available = True
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            self.reason = f"kernel log unreadable: {exc}"

    def _read(self) -> list[str]:
        out = subprocess.run(self.command, capture_output=True, text=True, timeout=10, check=False)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip() or f"{self.command[0]} exited {out.returncode}")
        return out.stdout.splitlines()

    def sample(self) -> dict[str, float]:
        for line in self._read():
            if line not in self._baseline and ("NVRM" in line or "Xid" in line):
                self._baseline.add(line)
                if len(self.events) < 200:
                    self.events.append(line)
        return {"xid_events": float(sum(1 for e in self.events if self.XID.search(e))),
                "nvrm_events": float(len(self.events))}


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


def job_sources(*always: Any) -> tuple[list[Any], list[Any]]:
    """The sources of one configuration's job: ``always`` (host, /metrics) plus NVML and the
    kernel log where this host has them. Returns (sampled, absent)."""
    optional = [NvmlSource(), KernelLogSource()]
    return [*always, *(o for o in optional if o.available)], [o for o in optional if not o.available]


def describe_sources(sampled: list[Any], absent: list[Any], sampler: Sampler) -> dict[str, dict[str, Any]]:
    """Each source's status for the record: sampled, failed at times (with the sampler's
    errors), or absent with the reason; the kernel log's events and NVML's refusals."""
    out: dict[str, dict[str, Any]] = {}
    for src in sampled:
        item: dict[str, Any] = {"status": "failed at times" if sampler.errors.get(src.name) else "sampled"}
        if isinstance(src, KernelLogSource):
            item["events"] = src.events
        if isinstance(src, NvmlSource):
            item.update(field_errors=src.field_errors, lost_gpus=src.lost)
        out[src.name] = item
    for src in absent:
        out[src.name] = {"status": "absent", "reason": src.reason}
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


def window_figures(df: pandas.DataFrame | Mapping[str, Any], start: float, end: float) -> dict[str, Any]:
    """What one window (a scenario pass, or start-up) shows: :func:`summarize_window`
    plus, for counters, the change over the window (``<source>.<metric>`` ending in
    ``_total``, or a GPU's ``energy_mj``, under ``"deltas"``), per-GPU energy in joules
    and tokens per joule where energy and generated tokens are both known."""
    import numpy as np

    figures: dict[str, Any] = {"summary": summarize_window(df, start, end), "deltas": {}}
    t = np.asarray(df["t"], dtype=float)
    src = np.asarray(df["source"], dtype=object).astype(str)
    met = np.asarray(df["metric"], dtype=object).astype(str)
    val = np.asarray(df["value"], dtype=float)
    inside = (t >= start) & (t <= end) & ~np.isnan(val) & (met != ERROR_METRIC)
    for key in sorted({f"{a}.{b}" for a, b in zip(src[inside], met[inside], strict=True) if b.endswith(("_total", "energy_mj"))}):
        source, metric = key.split(".", 1)
        sel = inside & (src == source) & (met == metric)
        v = val[sel][np.argsort(t[sel], kind="stable")]
        figures["deltas"][key] = float(v[-1] - v[0])
    energy_j = sum(d / 1000.0 for k, d in figures["deltas"].items() if k.endswith("energy_mj"))
    tokens = figures["deltas"].get("metrics.generation_tokens_total")
    if energy_j > 0:
        figures["energy_j"] = energy_j
        if tokens:
            figures["tokens_per_joule"] = tokens / energy_j
    return figures
