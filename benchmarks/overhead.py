"""Orchestration overhead of a finished trial, from its records.

    python benchmarks/overhead.py results/demo

Prints, per configuration and for the whole trial, the wall time against the time spent
in vLLM start-up (launch to ready) and in benchmark passes; the rest is what the
workflow itself costs (Snakemake, imports, staging, cold request, scrapes, stopping).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path)
    args = parser.parse_args()
    root: Path = args.results_dir
    records = sorted(root.glob("configs/*/record.json"))
    if not records:
        raise SystemExit(f"no configuration records under {root}/configs/")
    env = json.loads((root / "preflight" / "environment.json").read_text())
    report = root / "report.html"
    trial_start = env["recorded_at"]
    trial_end = report.stat().st_mtime if report.exists() else max(p.stat().st_mtime for p in records)
    print(f"{'configuration':16} {'wall s':>9} {'startup s':>10} {'bench s':>9} {'overhead s':>11} {'overhead %':>11}")
    tot_startup = tot_bench = tot_jobs = 0.0
    for path in records:
        rec = json.loads(path.read_text())
        t = rec["timing"]
        startup = t.get("startup_s") or 0.0
        bench = t.get("bench_s") or 0.0
        wall = t["wall_s"]
        over = wall - startup - bench
        tot_startup, tot_bench, tot_jobs = tot_startup + startup, tot_bench + bench, tot_jobs + wall
        print(f"{rec['configuration']:16} {wall:9.1f} {startup:10.1f} {bench:9.1f} {over:11.1f} {100 * over / wall:10.1f}%")
    trial_wall = trial_end - trial_start
    useful = tot_startup + tot_bench
    print(f"\ntrial wall time (preflight record to report): {trial_wall:.1f} s")
    print(f"sum of vLLM start-up: {tot_startup:.1f} s; sum of benchmark passes: {tot_bench:.1f} s; together {useful:.1f} s")
    print(f"sum of configuration jobs: {tot_jobs:.1f} s")
    print(f"orchestration overhead: {trial_wall - useful:.1f} s ({100 * (trial_wall - useful) / trial_wall:.1f}% of the trial)")


if __name__ == "__main__":
    main()
