"""The GPUs a trial uses: which ones (the selection), who else computes on them (the census
before launch), and whether they are still healthy after a configuration failed.

- **Selection.** The trial file's ``hardware.gpus`` is a count (the first N GPUs NVML lists)
  or a list of NVML indexes and UUIDs. Preflight resolves it against the inventory; the
  planner, the servers' ``CUDA_VISIBLE_DEVICES`` (by UUID, so CUDA's own device order does
  not matter) and telemetry then use exactly those GPUs.
- **Census.** Before a server starts, every compute process on a selected GPU is read from
  NVML with its pid, user, command and memory; one the trial file does not allow by name
  (``hardware.allow_processes``) keeps the configuration from launching.
- **Health.** After a configuration fails, each selected GPU is checked by what the field
  trusts: a fresh process that initialises CUDA and allocates and frees a buffer, and the
  NVIDIA Xid lines the kernel log gained since preflight's baseline. A GPU that fails is
  written to the ledger (``gpu_failed``): cleanup reports it as a residue and does not start
  the services that run on it, unless a later check passes (``gpu_cleared``) or the trial
  file lets the service start anyway.

A host this machine cannot be (NVML, CUDA, a kernel log with Xid lines) is played by a test
double: a Python file named by ``LLMTRIAL_GPU_DOUBLE``. Its module stands in for pynvml;
its ``cuda_health(nbytes)`` for CUDA in the fresh process; run as ``python FILE dmesg`` it
prints the kernel log. Every record made through it says so in its ``source``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from llmtrial.core.configuration_model import Allocation, GpuCensus, GpuCheck, GpuHealth, GpuProcess, KernelLogAccess
from llmtrial.core.ledger import Action, Entry, Ledger, replay
from llmtrial.core.preflight_model import GpuDevice, KernelLog, SelectedGpu
from llmtrial.core.record_base import HeldGpu, Residue
from llmtrial.core.trial_config import HealthCheckBlock
from llmtrial.core.units import GiB
from llmtrial.host.nodes import last_json_object, program_argv
from llmtrial.onnode import gpu_health

log = logging.getLogger(__name__)

#: The environment variable naming a test double of the host's GPU stack (a Python file).
DOUBLE_ENV = "LLMTRIAL_GPU_DOUBLE"
#: What the health check allocates on each GPU, and how long the fresh process may take.
#: ``NVRM: Xid (PCI:0000:17:00): 79, pid=..., GPU has fallen off the bus.``
XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+)")


class SelectionError(ValueError):
    """``hardware.gpus`` (or a node's ``gpus``) names a GPU its host does not have."""


# --------------------------------------------------------------------------- the GPU stack


def double_path() -> str | None:
    """The test double's file, when one plays this host's GPUs."""
    return os.environ.get(DOUBLE_ENV) or None


@functools.cache
def _load_double(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("llmtrial_gpu_double", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{DOUBLE_ENV}={path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nvml_module() -> tuple[Any | None, str, str | None]:
    """(pynvml or the double standing in for it, where figures come from, why none)."""
    path = double_path()
    if path:
        return _load_double(path), f"nvml double ({path})", None
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None, "nvml", "nvidia-ml-py (pynvml) is not installed"
    return pynvml, "nvml", None


def kernel_log_command() -> list[str]:
    """The argv that prints the kernel log: ``dmesg``, or the double's."""
    path = double_path()
    return [sys.executable, path, "dmesg"] if path else ["dmesg"]


# --------------------------------------------------------------------------- selection


def select(setting: int | Sequence[int | str] | None, devices: Sequence[GpuDevice], *, key: str = "hardware.gpus",
           host: str = "this host") -> list[SelectedGpu]:
    """The GPUs ``setting`` (the trial file's ``key``: hardware.gpus, or a node's gpus) selects among
    ``devices`` (the inventory of ``host``): every GPU for null, the first N for a count (none on a host
    NVML shows no GPU: the count is then the planner's assumption), or each listed NVML index or UUID.
    Raises SelectionError naming the key, the host and the entry it lacks."""
    if setting is None:
        chosen = list(devices)
    elif isinstance(setting, int):
        chosen = list(devices[:setting]) if devices else []
        if devices and setting > len(devices):
            raise SelectionError(f"{key}: {setting} GPUs asked for, {host} has {len(devices)}")
    else:
        chosen = []
        for i, want in enumerate(setting):
            found = [d for d in devices if d.index == want or (isinstance(want, str) and d.uuid in (want, f"GPU-{want}"))]
            if not found:
                have = ", ".join(f"{d.index} ({d.uuid})" for d in devices) or "none"
                raise SelectionError(f"{key}[{i}]: no GPU {want!r} on {host} (it has {have})")
            if found[0] in chosen:
                raise SelectionError(f"{key}[{i}]: GPU {want!r} is listed twice")
            chosen.append(found[0])
    return [SelectedGpu(index=d.index, uuid=d.uuid, name=d.name, pci_bus_id=d.pci_bus_id) for d in chosen]


def visible_devices_env(selected: Sequence[SelectedGpu]) -> dict[str, str]:
    """The serving environment that pins a server to the selected GPUs ({} with none):
    ``CUDA_VISIBLE_DEVICES`` by UUID where known, and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so an
    index means what NVML and nvidia-smi call it."""
    if not selected:
        return {}
    ids = [str(g.uuid or g.index) for g in selected]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def gpu_label(index: int | str | None, uuid: str | None = None) -> str:
    """How messages name a GPU: ``GPU 1 (GPU-...)``."""
    return f"GPU {index}" + (f" ({uuid})" if uuid else "")


# --------------------------------------------------------------------------- census


def _process(pid: int, nvml: Any) -> tuple[str, str, str]:
    """Who runs ``pid`` (user, command, name), from this host's process table, else from NVML's process name."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return p.username(), " ".join(p.cmdline()) or p.name(), p.name()
    except (psutil.Error, OSError):
        pass
    try:
        name = nvml.nvmlSystemGetProcessName(pid)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        name = ""
    return ("unknown (not in this host's process table)", name or "unknown",
            os.path.basename(name.split()[0]) if name else "")


def _allowed_by(name: str, command: str, allow: Iterable[str]) -> str | None:
    words = {name, os.path.basename(command.split(" ")[0])}
    return next((a for a in allow if a in words), None)


def _compute_processes(nvml: Any, selected: Sequence[SelectedGpu], allow: list[str]) -> list[GpuProcess]:
    """Every compute process NVML lists on the ``selected`` GPUs, with the ``allow`` entry that allows it."""
    out = []
    for gpu in selected:
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            user, command, name = _process(int(p.pid), nvml)
            out.append(GpuProcess(gpu=gpu.index, uuid=gpu.uuid, pid=int(p.pid),
                                  memory_bytes=getattr(p, "usedGpuMemory", None), user=user, command=command,
                                  name=name, allowed_by=_allowed_by(name, command, allow)))
    return out


def census(selected: Sequence[SelectedGpu], allow: Iterable[str] = ()) -> GpuCensus:
    """Every compute process NVML lists on a selected GPU, with its pid, user, command and
    memory, whether the trial file allows it by name (``hardware.allow_processes``: a process
    name or the command's program) and which are ``foreign`` (not allowed). It runs before the
    trial's server starts, so no process on the GPUs is the trial's own."""
    allow = list(allow)
    nvml, source, reason = nvml_module()
    out = GpuCensus(source=source, checked_at=time.time(), gpus=[g.index for g in selected], allow=allow,
                    processes=[], foreign=[], reason=reason)
    if not selected or nvml is None:
        out.reason = reason or "no GPU selected"
        return out
    try:
        nvml.nvmlInit()
    except Exception as exc:
        out.reason = f"NVML unavailable: {exc}"
        return out
    try:
        out.processes = _compute_processes(nvml, selected, allow)
    finally:
        nvml.nvmlShutdown()
    out.foreign = [p.model_dump(exclude_unset=True) for p in out.processes if p.allowed_by is None]
    return out


def describe_process(p: GpuProcess) -> str:
    used = f", {p.memory_bytes / GiB:.2f} GiB" if isinstance(p.memory_bytes, (int, float)) else ""
    return f"pid {p.pid} on GPU {p.gpu} (user {p.user}, {p.command}{used})"


def census_failure(found: GpuCensus) -> str:
    """The diagnosis of a census that found foreign processes."""
    foreign = [GpuProcess.model_validate(p) for p in found.foreign]
    return ("another process computes on a selected GPU: " + "; ".join(map(describe_process, foreign))
            + ". Stop it, or allow it by name in hardware.allow_processes if the trial may share the GPU.")


def launch_check(ledger: Ledger, gpus: Sequence[SelectedGpu], allow: Iterable[str]) -> tuple[GpuCensus, str | None]:
    """Before a server starts on the selected ``gpus``: the census, and why it must not
    start (a foreign process, or a GPU the ledger still holds as failed), or None."""
    found = census(gpus, allow)
    selected = [g.uuid or g.index for g in gpus]
    failed = held_gpus(selected, [held_gpu(e) for e in replay(ledger.entries()).open("gpus")])
    found.held_failed = [HeldGpu(gpu=h.gpu, uuid=h.uuid, label=h.label, evidence=h.evidence) for h in failed]
    if failed:
        return found, ("a selected GPU failed its health check after an earlier configuration failed: "
                       + "; ".join(f"GPU {h.gpu} after {h.label} ({h.evidence})" for h in failed)
                       + ". `snakemake cleanup` checks it again and clears it once it passes.")
    return found, census_failure(found) if found.foreign else None


# --------------------------------------------------------------------------- health

def allocation_check(gpu: SelectedGpu, nbytes: int, timeout: float, python: str = sys.executable) -> Allocation:
    """A fresh process shown only ``gpu`` initialises CUDA and allocates ``nbytes``: status
    ``ok``, ``failed`` (an error, a hang past ``timeout``, a crash) or ``skipped`` (no CUDA)."""
    env = {**os.environ, **visible_devices_env([gpu])}
    argv = program_argv(python, gpu_health, str(nbytes))
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Allocation(status="failed", evidence=f"the fresh process did not finish in {timeout:g} s (a hang)")
    try:
        return Allocation.model_validate(last_json_object(done.stdout))
    except ValueError:
        err = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return Allocation(status="failed", evidence=f"the fresh process died (exit {done.returncode}): {err}")


def kernel_log(command: list[str] | None = None) -> KernelLog:
    """The kernel log's NVIDIA lines (NVRM, Xid) now: the baseline preflight keeps."""
    command = command or kernel_log_command()
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return KernelLog(available=False, reason=f"kernel log unreadable: {exc}", lines=[], source=command[0])
    if out.returncode != 0:
        return KernelLog(available=False, reason=f"kernel log unreadable: {out.stderr.strip() or out.returncode}",
                         lines=[], source=" ".join(command))
    lines = [ln for ln in out.stdout.splitlines() if "NVRM" in ln or "Xid" in ln]
    return KernelLog(available=True, reason=None, lines=lines, source="double" if double_path() else "dmesg")


@dataclass(frozen=True)
class NewXid:
    """The Xid lines the kernel log gained, by selected GPU, and those naming no selected GPU."""

    access: KernelLogAccess
    by_gpu: dict[int, list[str]]
    other: list[str]


def new_xid(baseline: Iterable[str], gpus: Sequence[SelectedGpu]) -> NewXid:
    """Xid lines the kernel log gained since ``baseline``, by selected GPU (matched on the PCI
    bus id the line names); lines naming no selected GPU are kept apart."""
    now = kernel_log()
    known = set(baseline)
    fresh = [ln for ln in now.lines if ln not in known and XID.search(ln)]
    by_gpu: dict[int, list[str]] = {g.index: [] for g in gpus}
    other = []
    for line in fresh:
        pci = XID.search(line)["pci"].lower()  # type: ignore[index]
        owner = next((g for g in gpus if (g.pci_bus_id or "").lower().startswith(pci)), None)
        (by_gpu[owner.index] if owner else other).append(line)
    return NewXid(KernelLogAccess(available=now.available, reason=now.reason), by_gpu, other)


def health(gpus: Sequence[SelectedGpu], baseline: Iterable[str], settings: HealthCheckBlock) -> GpuHealth:
    """Each GPU's health: the fresh allocation and the new Xid lines, ``healthy`` False when
    either fails (None when the allocation could not be tried), with the evidence."""
    xid = new_xid(baseline, gpus)
    out = []
    for gpu in gpus:
        alloc = allocation_check(gpu, settings.bytes, float(settings.timeout_s))
        lines = xid.by_gpu.get(gpu.index, [])
        bad = [f"allocation {alloc.status}: {alloc.evidence}"] if alloc.status == "failed" else []
        bad += [f"kernel log: {ln.strip()}" for ln in lines]
        healthy = False if bad else (None if alloc.status == "skipped" else True)
        out.append(GpuCheck(**gpu.model_dump(exclude_unset=True), allocation=alloc, xid=lines, healthy=healthy,
                            evidence="; ".join(bad) or alloc.evidence))
    return GpuHealth(source="double" if double_path() else "cuda", checked_at=time.time(), gpus=out,
                     xid_other=xid.other, kernel_log=xid.access)


def after_failure(ledger: Ledger, gpus: Sequence[SelectedGpu], baseline: Iterable[str], label: str,
                  settings: HealthCheckBlock | None = None) -> GpuHealth | None:
    """After a configuration failed: each selected GPU's health, and a ``gpu_failed`` ledger
    entry for each that failed (cleanup then holds back the services that run on it)."""
    if not gpus:
        return None
    settings = settings or HealthCheckBlock()
    baseline = list(baseline)
    found = health(gpus, baseline, settings)
    for gpu in found.gpus or []:
        if gpu.healthy is False:
            ledger.append(Action.GPU_FAILED, gpu=gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id,
                          label=label, evidence=gpu.evidence, kernel_lines=baseline + gpu.xid,
                          health=settings.model_dump())
            log.warning("%s failed its health check after %s failed: %s", gpu_label(gpu.index, gpu.uuid), label,
                        gpu.evidence)
    return found


def recheck_failed(ledger: Ledger, residues: list[Residue]) -> list[HeldGpu]:
    """Cleanup's look at every GPU the ledger still holds as failed: check it again (a fresh
    allocation, and no Xid line since it failed); one that passes is cleared (``gpu_cleared``),
    one that fails stays held and is a residue naming the GPU and the evidence. Returns the
    GPUs still held."""
    held = []
    for entry in replay(ledger.entries()).open("gpus"):
        gpu = SelectedGpu(index=entry.gpu, uuid=entry.uuid, pci_bus_id=entry.pci_bus_id)
        settings = entry.health or HealthCheckBlock()  # the check the failure had
        [now] = health([gpu], entry.kernel_lines or [], settings).gpus or []
        if now.healthy:
            ledger.append(Action.GPU_CLEARED, gpu=gpu.index, uuid=gpu.uuid, undoes=entry.id, evidence=now.evidence)
            continue
        held.append(held_gpu(entry, evidence_now=now.evidence))
        residues.append(Residue(kind="gpu", what=gpu_label(gpu.index, gpu.uuid),
                                tried="a fresh process allocating on it, and the kernel log since it failed",
                                seen=f"failed its health check after {entry.label} failed ({entry.evidence}); "
                                     f"now: {now.evidence}"))
    return held


def held_gpu(entry: Entry, evidence_now: str | None = None) -> HeldGpu:
    """A ``gpu_failed`` entry of the ledger as the GPU it holds (with ``evidence_now``: as cleanup found it again)."""
    now = {"evidence_now": evidence_now} if evidence_now is not None else {}
    return HeldGpu(gpu=entry.gpu, uuid=entry.uuid, label=entry.label, evidence=entry.evidence,
                   run=entry.run, **now)


def held_gpus(gpus: Iterable[Any], held: Sequence[HeldGpu]) -> list[HeldGpu]:
    """The GPUs ``held`` as failed among ``gpus``, given by NVML index or UUID."""
    wanted = {str(g) for g in gpus}
    return [h for h in held if {str(h.gpu), str(h.uuid)} & wanted]
