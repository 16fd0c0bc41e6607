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
from pathlib import Path
from typing import Any

from llmtrial.core.trial_config import ProbesBlock
from llmtrial.host import collective, probe_program
from llmtrial.host.checks import check
from llmtrial.host.nodes import last_json_object

__all__ = ["GPU_PROBES", "PCIE_LANE_GBPS", "PROBES", "link_checks", "probe_argv", "run_probes", "selected_gpus"]

GPU_PROBES = (*probe_program.GPU_PROBES, "all_reduce")
PROBES = ("host_memory", *GPU_PROBES)
#: GB/s one PCIe lane carries per direction, by generation (after line coding).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
def settings_with_defaults(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The trial file's ``probes`` block with its model's defaults filled (a partial block too: the tests',
    the benchmark's); the probe program reads it as this plain mapping."""
    return ProbesBlock.model_validate(dict(settings or {})).model_dump()


def selected_gpus(gpus: Mapping[str, Any]) -> list[int]:
    """The NVML indexes of the GPUs the trial uses: the inventory's ``selected``, else every GPU."""
    selected = gpus.get("selected")
    if selected is None:
        selected = [d["index"] for d in gpus.get("devices") or []]
    return [int(i) for i in selected]


def probe_argv(settings: Mapping[str, Any], devices: Sequence[int], python: str = sys.executable) -> list[str]:
    """The probe program's argv: its own source as ``python -c`` (as
    :func:`llmtrial.host.collective.rank_argv` runs a standalone rank) and its settings as JSON."""
    wanted = {"probes": {name: settings[name] for name in probe_program.GPU_PROBES + ("host_memory",)},
              "devices": list(devices)}
    return [python, "-c", Path(probe_program.__file__).read_text(encoding="utf-8"), json.dumps(wanted)]


def _gpu_env(devices: Sequence[int]) -> dict[str, str]:
    """CUDA devices 0..n-1 are the selected GPUs, numbered as NVML numbers them (by PCI bus id)."""
    return {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}


def _program(settings: Mapping[str, Any], devices: Sequence[int], python: str) -> dict[str, Any]:
    """The probe program's output, or ``{"error": ...}`` saying why there is none."""
    timeout = float(settings["timeout_s"])
    try:
        done = subprocess.run(probe_argv(settings, devices, python), capture_output=True, text=True, timeout=timeout,
                              env=_gpu_env(devices), stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"the probe program did not finish within probes.timeout_s = {timeout:g} s"}
    except OSError as exc:
        return {"error": f"the probe program could not start ({python}): {exc}"}
    with contextlib.suppress(ValueError):
        if done.returncode == 0:
            return last_json_object(done.stdout)
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"the probe program exited with status {done.returncode}: {tail}"}


def _skipped(name: str, reason: str, devices: Sequence[int] = ()) -> dict[str, Any]:
    return probe_program.skipped(name, reason, list(devices))


def _all_reduce(settings: Mapping[str, Any], devices: Sequence[int], python: str) -> dict[str, Any]:
    """One NCCL rank per selected GPU (:func:`llmtrial.host.collective.run_local_group`)."""
    ar = settings["all_reduce"]
    with tempfile.TemporaryDirectory(prefix="llmtrial-probe-") as work:
        group = collective.run_local_group(
            len(devices), backend="nccl", port=collective.free_port(shuffle=True), size_mib=ar["bytes"] / collective.MIB,
            iters=int(ar["repeats"]), timeout_s=float(settings["timeout_s"]), python=python, workdir=work,
            env=_gpu_env(devices))
    if not group["ok"]:
        return {**_skipped("all_reduce", f"the NCCL all-reduce failed: {group['diagnosis']}", devices), "status": "failed"}
    return {"name": "all_reduce", "status": "measured", "kind": "measured",
            "method": f"torch.distributed all_reduce (NCCL) of {group['size_bytes']} B float32, one rank per GPU "
                      f"(llmtrial.host.collective), slowest rank's median of {ar['repeats']} after a checked warm-up; "
                      "bus bandwidth as nccl-tests defines it, algbw x 2(n-1)/n",
            "devices": list(devices), "bytes": group["size_bytes"], "repeats": int(ar["repeats"]),
            "gbps": group["busbw_gbps"], "algbw_gbps": group["algbw_gbps"], "seconds_median": group["median_s"],
            "reason": None}


def _gpu_reasons(settings: Mapping[str, Any], out: Mapping[str, Any], devices: Sequence[int]) -> str | None:
    """Why no GPU probe can run here, or None."""
    if "error" in out:
        return out["error"]
    if not out.get("cuda_available"):
        return f"torch {out.get('torch')}: torch.cuda.is_available() is False"
    if not devices:
        return "no GPU is selected"
    return None


def run_probes(settings: Mapping[str, Any] | None, devices: Sequence[int], *,
               python: str = sys.executable) -> dict[str, Any]:
    """Every probe the trial file enables, on the selected GPUs (NVML indexes): the preflight
    record's ``probes`` (``torch``, ``cuda_available``, ``devices``, ``reason`` when no GPU
    probe ran, ``wall_s`` and ``results``, one entry per probe and device or pair)."""
    s = settings_with_defaults(settings)
    t0 = time.monotonic()
    out = _program(s, devices, python) if any(s[name]["enabled"] for name in probe_program.GPU_PROBES + ("host_memory",)) \
        else {"error": "every probe is disabled in the trial file"}
    reason = _gpu_reasons(s, out, devices)
    results: list[dict[str, Any]] = list(out.get("results") or [])
    for name in PROBES:
        if not s[name]["enabled"]:
            results.append(_skipped(name, f"disabled in the trial file (probes.{name}.enabled)"))
        elif name == "host_memory" and "error" in out:
            results.append(_skipped(name, out["error"]))
        elif name in GPU_PROBES and reason is not None:
            results.append(_skipped(name, reason, devices))
        elif name == "all_reduce" and len(devices) < 2:
            results.append(_skipped(name, f"{len(devices)} GPU selected: an all-reduce needs at least 2", devices))
        elif name == "all_reduce":
            results.append(_all_reduce(s, devices, python))
    return {"torch": out.get("torch"), "cuda_available": out.get("cuda_available"), "devices": list(devices),
            "reason": reason, "wall_s": round(time.monotonic() - t0, 3), "results": results}


# --------------------------------------------------------------------------- checks


def _promise_gbps(device: Mapping[str, Any]) -> float | None:
    gen, width = device.get("pcie_gen_max"), device.get("pcie_width_max")
    return PCIE_LANE_GBPS[gen] * width if gen in PCIE_LANE_GBPS and width else None


def _below(current: Any, maximum: Any) -> bool:
    return isinstance(current, int) and isinstance(maximum, int) and current < maximum


def pcie_check(devices: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A link whose current generation or width is below its maximum, per GPU; the link NVML
    reported under the host-to-device probe's load is preferred to the idle one."""
    loaded = {r["devices"][0]: r for r in results if r["name"] == "host_to_device" and "pcie_gen_under_load" in r}
    low, seen = [], []
    for d in devices:
        r = loaded.get(d["index"])
        gen = r["pcie_gen_under_load"] if r else d.get("pcie_gen")
        width = r["pcie_width_under_load"] if r else d.get("pcie_width")
        when = "under load" if r else "idle"
        seen.append(f"GPU {d['index']} gen {gen}/{d.get('pcie_gen_max')} x{width}/x{d.get('pcie_width_max')} ({when})")
        if _below(gen, d.get("pcie_gen_max")) or _below(width, d.get("pcie_width_max")):
            low.append((d["index"], when))
    if not devices:
        return check("pcie_link", "skip", "no GPU selected")
    if not low:
        return check("pcie_link", "ok", "; ".join(seen), below=[])
    idle = any(when == "idle" for _, when in low)
    return check("pcie_link", "warn", "PCIe link below its maximum: " + "; ".join(seen)
                 + (" (an idle GPU may drop its link generation to save power; the host-to-device probe reads it "
                    "under load)" if idle else ""), below=[i for i, _ in low])


def peer_check(peer_access: Mapping[str, Any], devices: Sequence[int], splits: Mapping[str, int]) -> dict[str, Any]:
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


def bandwidth_check(devices: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]],
                    far_below: float) -> dict[str, Any]:
    """Pinned host-device bandwidth far below what the link's generation and width promise."""
    by_index = {d["index"]: d for d in devices}
    low, seen = [], []
    for r in results:
        if r["name"] not in ("host_to_device", "device_to_host") or r.get("memory") != "pinned" or not r.get("gbps"):
            continue
        promise = _promise_gbps(by_index.get(r["devices"][0], {}))
        if promise is None:
            continue
        d = by_index[r["devices"][0]]
        line = (f"GPU {d['index']} {r['name']} {r['gbps']:.2f} GB/s of {promise:.2f} GB/s promised "
                f"(gen {d['pcie_gen_max']} x{d['pcie_width_max']})")
        seen.append(line)
        if r["gbps"] < far_below * promise:
            low.append(line)
    if not seen:
        return check("link_bandwidth", "skip", "no pinned host-device bandwidth measured against a known PCIe link")
    if low:
        return check("link_bandwidth", "warn", f"measured below {far_below:g} x the PCIe link's promise: "
                     + "; ".join(low), far_below=far_below)
    return check("link_bandwidth", "ok", "; ".join(seen), far_below=far_below)


def link_checks(probes: Mapping[str, Any], gpus: Mapping[str, Any],
                far_below: float = ProbesBlock().far_below) -> list[dict[str, Any]]:
    """The host's link checks from the preflight inventory (``environment.gpus``) and the probes:
    ``pcie_link`` and ``link_bandwidth``. Peer access depends on a configuration's split, so
    each plan checks it (:func:`peer_check`)."""
    chosen = selected_gpus(gpus)
    devices = [d for d in gpus.get("devices") or [] if d["index"] in chosen]
    results = probes.get("results") or []
    return [pcie_check(devices, results), bandwidth_check(devices, results, far_below)]
