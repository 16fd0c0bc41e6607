"""Telemetry sources: what the sampler (:mod:`llmtrial.serve.telemetry`) polls each second.

:class:`HostSource` (system CPU and memory, and the RSS/CPU of the server's process tree),
:class:`NvmlSource` (per GPU: utilisation, memory, power against its limit, PCIe, compute
processes; NVML through nvidia-ml-py), :class:`MetricsSource` (vLLM's Prometheus ``/metrics``)
and :class:`KernelLogSource` (NVIDIA Xid lines), :class:`RaplSource` (CPU package energy from the
kernel's RAPL counters). Each implements the :class:`Source` protocol; :func:`job_sources` picks those
a configuration job samples on this host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil

from llmtrial.host.gpus import XID, kernel_log, kernel_log_command, nvml_module


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

    def __init__(self, nvml: Any | None = None, name: str = "nvml", gpus: Sequence[int] | None = None) -> None:
        self.name = name
        self.available = False
        self.reason: str | None = None
        self.field_errors = 0
        self.lost: list[int] = []
        self._nvml = nvml
        self.origin = "nvml"
        self._handles: dict[int, Any] = {}
        if self._nvml is None:
            self._nvml, self.origin, self.reason = nvml_module()
            if self._nvml is None:
                return
        try:
            self._nvml.nvmlInit()
            indexes = list(range(self._nvml.nvmlDeviceGetCount())) if gpus is None else list(gpus)
            self._handles = {i: self._nvml.nvmlDeviceGetHandleByIndex(i) for i in indexes}
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
        for i, handle in self._handles.items():
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
    The log is read by :func:`llmtrial.host.gpus.kernel_log`, as preflight's baseline is.
    """

    def __init__(self, name: str = "kernel_log", command: list[str] | None = None) -> None:
        self.name = name
        self.command = command or kernel_log_command()
        self.events: list[str] = []
        first = kernel_log(self.command)
        self.available, self.reason = first.available, first.reason
        self._baseline = set(first.lines)

    def _read(self) -> list[str]:
        now = kernel_log(self.command)
        if not now.available:
            raise RuntimeError(now.reason)
        return now.lines

    def sample(self) -> dict[str, float]:
        for line in self._read():
            if line not in self._baseline:
                self._baseline.add(line)
                if len(self.events) < 200:
                    self.events.append(line)
        return {"xid_events": float(sum(1 for e in self.events if XID.search(e))),
                "nvrm_events": float(len(self.events))}


#: Where the kernel's powercap interface lies (its RAPL zones are ``intel-rapl:<n>``, AMD's too).
POWERCAP = Path("/sys/class/powercap")
#: The RAPL source's name: its rows are ``rapl,package-0.energy_uj,...``.
RAPL_SOURCE = "rapl"
#: What the RAPL source measures, in the words the report uses for it.
RAPL_LABEL = "CPU package energy (RAPL)"


class RaplSource:
    """CPU package energy from the kernel's RAPL counters (``<root>/intel-rapl:<n>/energy_uj``, µJ).

    The zones whose ``name`` is ``package-<n>`` are read (their subzones, core, uncore and dram, are
    parts of a package's figure and left out). Each sample gives ``<zone name>.energy_uj`` for every
    package, unwrapped: where the counter reads less than before it passed ``max_energy_range_uj`` and
    that range is added, so a window's change is its energy. This is the CPUs' energy, never the GPUs'.
    Where no package zone exists, or its counter cannot be read (root only on kernels since 5.10), the
    source is :attr:`available` False with the reason. ``root`` lets tests give a tree of their own.
    """

    def __init__(self, root: Path = POWERCAP, name: str = RAPL_SOURCE) -> None:
        self.name = name
        self.available = False
        self.reason: str | None = None
        self._zones: dict[str, tuple[Path, int]] = {}  # package name -> (energy_uj file, max_energy_range_uj)
        self._last: dict[str, int] = {}
        self._wraps: dict[str, int] = {}
        zones = [z for z in sorted(Path(root).glob("intel-rapl:*")) if _read(z / "name").startswith("package-")]
        if not zones:
            self.reason = f"no RAPL package zone under {root} (no powercap energy counters on this host)"
            return
        try:
            for zone in zones:
                self._zones[_read(zone / "name")] = (zone / "energy_uj", int(_read(zone / "max_energy_range_uj") or 0))
                int(_read(zone / "energy_uj", strict=True))
        except (OSError, ValueError) as exc:
            self.reason = f"RAPL energy counters not readable ({exc}; root only on kernels since 5.10)"
            return
        self.available = True

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for package, (path, span) in self._zones.items():
            raw = int(_read(path, strict=True))
            last = self._last.get(package)
            if last is not None and raw < last and span:
                self._wraps[package] = self._wraps.get(package, 0) + 1
            self._last[package] = raw
            out[f"{package}.energy_uj"] = float(raw + self._wraps.get(package, 0) * span)
        return out


def _read(path: Path, strict: bool = False) -> str:
    """A sysfs file's text, stripped; "" where it cannot be read unless ``strict``."""
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        if strict:
            raise
        return ""


def job_sources(*always: Any, gpus: Sequence[int] | None = None, powercap: Path = POWERCAP) -> tuple[list[Any], list[Any]]:
    """The sources of one configuration's job: ``always`` (host, /metrics) plus NVML (the
    selected ``gpus``, by NVML index; every GPU for None), the kernel log and the CPU package
    energy (RAPL, under ``powercap``) where this host has them. Returns (sampled, absent)."""
    optional = [NvmlSource(gpus=gpus), KernelLogSource(), RaplSource(powercap)]
    return [*always, *(o for o in optional if o.available)], [o for o in optional if not o.available]
