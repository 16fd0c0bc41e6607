"""Preflight's bandwidth probes on a GPU machine, with a few seconds of NVML telemetry.

    PYTHONPATH=workflow python benchmarks/gpu_probes.py [SECONDS] [GPU ...]

Needs torch (with CUDA to measure the GPU probes) and, for the telemetry and the link
checks, nvidia-ml-py and psutil; neither vLLM nor Snakemake. Runs every probe with the trial
file's defaults (:class:`llmtrial.core.trial_config.ProbesBlock`) on the GPUs given (every GPU NVML lists
by default), prints every figure and the link checks, then samples NVML once a second for
SECONDS (default 3) while idle. Before the probes it prints the census of compute processes
on those GPUs and their health check (:mod:`llmtrial.host.gpus`: a fresh process per GPU that
initialises CUDA and allocates, fills and frees 64 MiB, and the kernel log's Xid lines since
the script started). On a host without CUDA it prints each GPU probe's skip and its reason.
Takes well under five minutes on a host of eight GPUs.
"""

from __future__ import annotations

import json
import sys
import time

from llmtrial.core.trial_config import HealthCheckBlock
from llmtrial.host import gpus
from llmtrial.host.probes import link_checks, peer_check, run_probes, selected_gpus

try:
    from llmtrial.host.telemetry_sources import NvmlSource
    from llmtrial.lifecycle.preflight import gpu_inventory
except ImportError as exc:  # psutil missing: probes only
    gpu_inventory = NvmlSource = None  # type: ignore[assignment,misc]
    MISSING = str(exc)
else:
    MISSING = None


def census_and_health(devices: list[dict], baseline: list[str]) -> None:
    """Who else computes on the GPUs, and each GPU's health as a failed configuration's job checks it."""
    found = gpus.census(devices)
    print(f"census ({found['source']}): {len(found['processes'])} compute process(es)"
          + (f"; {found['reason']}" if found["reason"] else ""))
    for p in found["processes"]:
        print(f"  {gpus.describe_process(p)}")
    t0 = time.monotonic()
    checked = gpus.health(devices, baseline, HealthCheckBlock())
    print(f"health ({checked['source']}), {time.monotonic() - t0:.1f} s; kernel log "
          + ("read" if checked["kernel_log"]["available"] else f"not read: {checked['kernel_log']['reason']}"))
    for g in checked["gpus"]:
        print(f"  {gpus.gpu_label(g)}: healthy {g['healthy']}; allocation {g['allocation']['status']} in "
              f"{g['allocation'].get('seconds')} s: {g['allocation']['evidence']}; new Xid lines {len(g['xid'])}")


def telemetry(seconds: float) -> None:
    source = NvmlSource()
    if not source.available:
        print(f"NVML source absent: {source.reason}")
        return
    try:
        for _ in range(max(1, int(seconds))):
            sample = source.sample()
            print(json.dumps({k: v for k, v in sorted(sample.items()) if k.split(".")[-1] in
                              ("util_percent", "power_w", "mem_used_bytes", "pcie_tx_kbps", "pcie_rx_kbps", "temp_c")}))
            time.sleep(1.0)
    finally:
        source.close()
    print(f"NVML fields refused: {source.field_errors}")


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    baseline = gpus.kernel_log()["lines"]
    inventory = gpu_inventory() if gpu_inventory else {"devices": [], "reason": MISSING}
    if sys.argv[2:]:
        inventory["selected"] = [int(i) for i in sys.argv[2:]]
    devices = selected_gpus(inventory)
    census_and_health([d for d in inventory.get("devices") or [] if d["index"] in devices], baseline)
    print(f"GPUs: {len(inventory.get('devices') or [])} found ({inventory.get('reason') or 'NVML'}); probing {devices}")
    t0 = time.monotonic()
    record = run_probes(None, devices)
    print(f"torch {record['torch']}, CUDA {record['cuda_available']}, {time.monotonic() - t0:.1f} s"
          + (f"; GPU probes not run: {record['reason']}" if record["reason"] else ""))
    for r in record["results"]:
        extra = {k: r[k] for k in ("memory", "peer", "can_device_access_peer", "pcie_gen_under_load",
                                   "pcie_width_under_load", "algbw_gbps") if k in r}
        figure = f"{r['gbps']:.3f} GB/s, median {r['seconds_median'] * 1e3:.2f} ms" if r["gbps"] else r["reason"]
        print(f"  {r['name']:<17} {str(r['devices']):<10} {r['status']:<9} {figure} {extra or ''}")
    pairs = peer_check(inventory.get("peer_access") or {}, devices, {f"a split over {len(devices)} GPUs": len(devices)})
    for c in [*link_checks(record, inventory), pairs]:
        print(f"check {c['name']}: {c['status']}: {c['detail']}")
    if NvmlSource is not None:
        telemetry(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
