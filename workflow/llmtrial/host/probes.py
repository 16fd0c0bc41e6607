"""Host probes, a part of preflight: memory and link bandwidths measured with the serving torch.

:mod:`llmtrial.host.probe_program` runs in a subprocess with the serving environment's Python
(stdlib and torch only, so vLLM, Snakemake and llmtrial need not be importable there) and
prints its measurements as JSON; the all-reduce over the selected GPUs is
:mod:`llmtrial.host.collective`'s own NCCL ranks, one per GPU, with the bus bandwidth nccl-tests
defines. Every probe is recorded with kind ``measured`` and its method, or ``skipped`` with
the reason (disabled in the trial file, no CUDA in that torch, fewer than two GPUs).

The checks read the probes and the preflight inventory: ``pcie_link`` (a link running below
its generation or width), ``peer_access`` (off between GPUs a configuration splits over) and
``link_bandwidth`` (host to device far below what the PCIe link promises).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from llmtrial.core.preflight_model import GpuDevice, Gpus, ProbeResult, Probes
from llmtrial.core.record_base import Check, RecordModel
from llmtrial.core.trial_config import ProbesBlock
from llmtrial.host import collective, probe_program
from llmtrial.host.checks import check
from llmtrial.host.nodes import last_json_object, program_argv

__all__ = ["GPU_PROBES", "PCIE_LANE_GBPS", "PROBES", "link_checks", "probe_argv", "run_probes", "selected_gpus"]

GPU_PROBES = (*probe_program.GPU_PROBES, "all_reduce")
PROBES = ("host_memory", *GPU_PROBES)
#: The probes the probe program runs (the all-reduce runs as collective's ranks).
PROGRAM_PROBES = (*probe_program.GPU_PROBES, "host_memory")
#: GB/s one PCIe lane carries per direction, by generation (after line coding).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


class ProbeSetting(Protocol):
    """One probe's block of the trial file (``probes.<name>``)."""

    enabled: bool
    bytes: int
    repeats: int


class ProgramOutput(RecordModel):
    """What the probe program printed, or why it printed nothing."""

    torch: str | None = None
    cuda_available: bool | None = None
    cuda_devices: int = 0
    results: list[ProbeResult] = []
    error: str | None = None


def settings_with_defaults(settings: ProbesBlock | Mapping[str, Any] | None) -> ProbesBlock:
    """The trial file's ``probes`` block with its model's defaults filled (a partial block too: the tests',
    the benchmark's)."""
    return settings if isinstance(settings, ProbesBlock) else ProbesBlock.model_validate(dict(settings or {}))


def by_name(settings: ProbesBlock) -> dict[str, ProbeSetting]:
    """Each probe's block, by the probe's name."""
    return {"host_memory": settings.host_memory, "host_to_device": settings.host_to_device,
            "device_to_host": settings.device_to_host, "device_memory": settings.device_memory,
            "device_to_device": settings.device_to_device, "all_reduce": settings.all_reduce}


def selected_gpus(gpus: Gpus) -> list[int]:
    """The NVML indexes of the GPUs the trial uses: the inventory's ``selected``, else every GPU."""
    if gpus.selected is not None:
        return [int(i) for i in gpus.selected]
    return [int(d.index) for d in gpus.devices or [] if d.index is not None]


def probe_argv(settings: ProbesBlock, devices: Sequence[int], python: str = sys.executable) -> list[str]:
    """The probe program's argv: its own source as ``python -c`` (as
    :func:`llmtrial.host.collective.rank_argv` runs a standalone rank) and its settings as JSON."""
    blocks = by_name(settings)
    wanted = {"probes": {name: {"enabled": blocks[name].enabled, "bytes": blocks[name].bytes,
                                "repeats": blocks[name].repeats} for name in PROGRAM_PROBES},
              "devices": list(devices)}
    return program_argv(python, probe_program, json.dumps(wanted))


def _gpu_env(devices: Sequence[int]) -> dict[str, str]:
    """CUDA devices 0..n-1 are the selected GPUs, numbered as NVML numbers them (by PCI bus id)."""
    return {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}


def _program(settings: ProbesBlock, devices: Sequence[int], python: str) -> ProgramOutput:
    """The probe program's output, or one with the ``error`` that says why there is none."""
    timeout = float(settings.timeout_s)
    try:
        done = subprocess.run(probe_argv(settings, devices, python), capture_output=True, text=True, timeout=timeout,
                              env=_gpu_env(devices), stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return ProgramOutput(error=f"the probe program did not finish within probes.timeout_s = {timeout:g} s")
    except OSError as exc:
        return ProgramOutput(error=f"the probe program could not start ({python}): {exc}")
    with contextlib.suppress(ValueError):
        if done.returncode == 0:
            return ProgramOutput.model_validate(last_json_object(done.stdout))
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return ProgramOutput(error=f"the probe program exited with status {done.returncode}: {tail}")


def _skipped(name: str, reason: str, devices: Sequence[int] = (), status: str = "skipped") -> ProbeResult:
    entry = probe_program.skipped(name, reason, list(devices))
    entry.status = status
    return ProbeResult.model_validate(entry.as_json())


def _all_reduce(settings: ProbesBlock, devices: Sequence[int], python: str) -> ProbeResult:
    """One NCCL rank per selected GPU (:func:`llmtrial.host.collective.run_local_group`)."""
    ar = settings.all_reduce
    with tempfile.TemporaryDirectory(prefix="llmtrial-probe-") as work:
        group = collective.run_local_group(
            len(devices), backend="nccl", port=collective.free_port(shuffle=True), size_mib=ar.bytes / collective.MiB,
            iters=int(ar.repeats), timeout_s=float(settings.timeout_s), python=python, workdir=work,
            env=_gpu_env(devices))
    if not group["ok"]:
        return _skipped("all_reduce", f"the NCCL all-reduce failed: {group['diagnosis']}", devices, status="failed")
    return ProbeResult(name="all_reduce", status="measured", kind="measured",
                       method=f"torch.distributed all_reduce (NCCL) of {group['size_bytes']} B float32, one rank per "
                              f"GPU (llmtrial.host.collective), slowest rank's median of {ar.repeats} after a checked "
                              "warm-up; bus bandwidth as nccl-tests defines it, algbw x 2(n-1)/n",
                       devices=list(devices), bytes=group["size_bytes"], repeats=int(ar.repeats),
                       gbps=group["busbw_gbps"], seconds_median=group["median_s"], reason=None)


def _gpu_reasons(out: ProgramOutput, devices: Sequence[int]) -> str | None:
    """Why no GPU probe can run here, or None."""
    if out.error is not None:
        return out.error
    if not out.cuda_available:
        return f"torch {out.torch}: torch.cuda.is_available() is False"
    if not devices:
        return "no GPU is selected"
    return None


def run_probes(settings: ProbesBlock, devices: Sequence[int], *, python: str = sys.executable) -> Probes:
    """Every probe the trial file enables, on the selected GPUs (NVML indexes): the preflight
    record's ``probes`` (``torch``, ``cuda_available``, ``devices``, ``reason`` when no GPU
    probe ran, ``wall_s`` and ``results``, one entry per probe and device or pair)."""
    blocks = by_name(settings)
    t0 = time.monotonic()
    out = _program(settings, devices, python) if any(blocks[name].enabled for name in PROGRAM_PROBES) \
        else ProgramOutput(error="every probe is disabled in the trial file")
    reason = _gpu_reasons(out, devices)
    results = list(out.results)
    for name in PROBES:
        if not blocks[name].enabled:
            results.append(_skipped(name, f"disabled in the trial file (probes.{name}.enabled)"))
        elif name == "host_memory" and out.error is not None:
            results.append(_skipped(name, out.error))
        elif name in GPU_PROBES and reason is not None:
            results.append(_skipped(name, reason, devices))
        elif name == "all_reduce" and len(devices) < 2:
            results.append(_skipped(name, f"{len(devices)} GPU selected: an all-reduce needs at least 2", devices))
        elif name == "all_reduce":
            results.append(_all_reduce(settings, devices, python))
    return Probes(torch=out.torch, cuda_available=out.cuda_available, devices=list(devices), reason=reason,
                  wall_s=round(time.monotonic() - t0, 3), results=results)


# --------------------------------------------------------------------------- checks


def _promise_gbps(device: GpuDevice) -> float | None:
    gen, width = device.pcie_gen_max, device.pcie_width_max
    return PCIE_LANE_GBPS[gen] * width if gen in PCIE_LANE_GBPS and width else None


def _below(current: int | None, maximum: int | None) -> bool:
    return isinstance(current, int) and isinstance(maximum, int) and current < maximum


def pcie_check(devices: Sequence[GpuDevice], results: Sequence[ProbeResult]) -> Check:
    """A link whose current generation or width is below its maximum, per GPU; the link NVML
    reported under the host-to-device probe's load is preferred to the idle one."""
    loaded = {r.devices[0]: r for r in results if r.name == "host_to_device" and r.pcie_gen_under_load is not None}
    low, seen = [], []
    for d in devices:
        r = loaded.get(d.index)
        gen = r.pcie_gen_under_load if r else d.pcie_gen
        width = r.pcie_width_under_load if r else d.pcie_width
        when = "under load" if r else "idle"
        seen.append(f"GPU {d.index} gen {gen}/{d.pcie_gen_max} x{width}/x{d.pcie_width_max} ({when})")
        if _below(gen, d.pcie_gen_max) or _below(width, d.pcie_width_max):
            low.append((d.index, when))
    if not devices:
        return check("pcie_link", "skip", "no GPU selected")
    if not low:
        return check("pcie_link", "ok", "; ".join(seen), below=[])
    idle = any(when == "idle" for _, when in low)
    return check("pcie_link", "warn", "PCIe link below its maximum: " + "; ".join(seen)
                 + (" (an idle GPU may drop its link generation to save power; the host-to-device probe reads it "
                    "under load)" if idle else ""), below=[i for i, _ in low])


def peer_check(peer_access: Mapping[str, bool | None], devices: Sequence[int], splits: Mapping[str, int]) -> Check:
    """Peer access off between selected GPUs, warned only when a configuration splits over GPUs
    (``splits``: configuration name -> tensor_parallel_size x pipeline_parallel_size)."""
    off = [pair for pair, ok in peer_access.items() if ok is False
           and all(int(i) in devices for i in pair.split("-"))]
    split = sorted(name for name, n in splits.items() if n > 1)
    if not split:
        return check("peer_access", "skip", "no configuration splits over GPUs", off=off)
    if len(devices) < 2:
        return check("peer_access", "skip", "fewer than two GPUs selected", off=off)
    if off:
        return check("peer_access", "warn", f"peer access is off between GPUs {', '.join(off)} that "
                     f"{', '.join(split)} split over: every all-reduce or hand-off is staged through host memory "
                     "(vLLM disables its custom all-reduce)", off=off, configurations=split)
    return check("peer_access", "ok", f"peer access on between every pair of selected GPUs ({', '.join(split)} split)",
                 off=[])


def bandwidth_check(devices: Sequence[GpuDevice], results: Sequence[ProbeResult], far_below: float) -> Check:
    """Pinned host-device bandwidth far below what the link's generation and width promise."""
    by_index = {d.index: d for d in devices}
    low, seen = [], []
    for r in results:
        if r.name not in ("host_to_device", "device_to_host") or r.memory != "pinned" or not r.gbps:
            continue
        d = by_index.get(r.devices[0])
        promise = _promise_gbps(d) if d is not None else None
        if d is None or promise is None:
            continue
        line = (f"GPU {d.index} {r.name} {r.gbps:.2f} GB/s of {promise:.2f} GB/s promised "
                f"(gen {d.pcie_gen_max} x{d.pcie_width_max})")
        seen.append(line)
        if r.gbps < far_below * promise:
            low.append(line)
    if not seen:
        return check("link_bandwidth", "skip", "no pinned host-device bandwidth measured against a known PCIe link")
    if low:
        return check("link_bandwidth", "warn", f"measured below {far_below:g} x the PCIe link's promise: "
                     + "; ".join(low), far_below=far_below)
    return check("link_bandwidth", "ok", "; ".join(seen), far_below=far_below)


def link_checks(probes: Probes, gpus: Gpus, far_below: float = ProbesBlock().far_below) -> list[Check]:
    """The host's link checks from the preflight inventory (``environment.gpus``) and the probes:
    ``pcie_link`` and ``link_bandwidth``. Peer access depends on a configuration's split, so
    each plan checks it (:func:`peer_check`)."""
    chosen = selected_gpus(gpus)
    devices = [d for d in gpus.devices or [] if d.index in chosen]
    return [pcie_check(devices, probes.results), bandwidth_check(devices, probes.results, far_below)]
