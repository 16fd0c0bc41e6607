"""The GPU path of preflight and telemetry, in one call on a machine with NVIDIA GPUs.

    python benchmarks/nvml_probe.py [SECONDS]

Prints what NVML reports through the same code the workflow uses: the GPU inventory of
the preflight record (driver, CUDA, PCIe link, peer access, topology), then SECONDS
(default 5) of 1 Hz samples from the telemetry's NVML source, the window figures
(energy, mean utilisation and power) and how many fields NVML refused.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from llmtrial.host.telemetry_sources import NvmlSource
from llmtrial.lifecycle.preflight import gpu_inventory
from llmtrial.serve.telemetry import Sampler, read_samples, window_figures


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    inventory = gpu_inventory()
    print(json.dumps(inventory, indent=2, default=str))
    source = NvmlSource()
    if not source.available:
        print(f"NVML source absent: {source.reason}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "nvml.csv"
        start = time.time()
        with Sampler(csv, [source], interval=1.0) as sampler:
            time.sleep(seconds)
        end = time.time()
        df = read_samples(csv)
        print(df.pivot_table(index="t", columns="metric", values="value").to_string(max_cols=12))
        figures = window_figures(df, start, end)
        print(json.dumps({"deltas": figures["deltas"], "energy_j": figures.get("energy_j"),
                          "means": {k: v["mean"] for k, v in figures["summary"].items()
                                    if k.endswith(("util_percent", "power_w"))},
                          "field_errors": source.field_errors, "lost_gpus": source.lost,
                          "sampler": sampler.stats()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
