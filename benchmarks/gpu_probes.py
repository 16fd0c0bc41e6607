"""Preflight's bandwidth probes on a GPU machine, with a few seconds of NVML telemetry.

    PYTHONPATH=workflow python benchmarks/gpu_probes.py [SECONDS] [GPU ...]

Needs torch (with CUDA to measure the GPU probes) and, for the telemetry and the link
checks, nvidia-ml-py and psutil; neither vLLM nor Snakemake. Runs every probe with the trial
file's defaults (:data:`llmtrial.probes.DEFAULTS`) on the GPUs given (every GPU NVML lists
by default), prints every figure and the link checks, then samples NVML once a second for
SECONDS (default 3) while idle. On a host without CUDA it prints each GPU probe's skip and
its reason. The GPU health check of ``llmtrial.gpus`` runs first when that module exists.
Takes well under five minutes on a host of eight GPUs.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

from llmtrial.probes import link_checks, run_probes, selected_gpus

try:
    from llmtrial.preflight import gpu_inventory
    from llmtrial.sources import NvmlSource
except ImportError as exc:  # psutil missing: probes only
    gpu_inventory = NvmlSource = None  # type: ignore[assignment,misc]
    MISSING = str(exc)
else:
    MISSING = None


def health() -> None:
    """llmtrial.gpus' health check, where it exists."""
    try:
        gpus = importlib.import_module("llmtrial.gpus")
    except ImportError:
        print("llmtrial.gpus is not present: no GPU health check")
        return
    check = getattr(gpus, "health_check", None) or getattr(gpus, "check_health", None)
    print(json.dumps(check() if check else {"note": "llmtrial.gpus has no health_check"}, indent=2, default=str))


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
    health()
    inventory = gpu_inventory() if gpu_inventory else {"devices": [], "reason": MISSING}
    if sys.argv[2:]:
        inventory["selected"] = [int(i) for i in sys.argv[2:]]
    devices = selected_gpus(inventory)
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
    for c in link_checks(record, inventory, {"split": 2}):
        print(f"check {c['name']}: {c['status']}: {c['detail']}")
    if NvmlSource is not None:
        telemetry(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
