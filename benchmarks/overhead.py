"""Orchestration overhead of a finished trial, from its records.

    python benchmarks/overhead.py results/demo

Prints, per configuration and for the whole trial, the wall time against the time spent
in vLLM start-up (launch to ready) and in benchmark passes (the benchmark process, and
within it the load vLLM's benchmark itself timed, and the time its worker took to import
vLLM's benchmark: ``timing.bench_import_s``, n/a in records from before the worker, whose
passes each imported it once); the rest is what the workflow costs
(Snakemake, staging, the cold request, scrapes, stopping servers, report). The trial's
wall time runs from the preflight record to the last record or the report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmtrial.core.records import load_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path)
    args = parser.parse_args()
    root: Path = args.results_dir
    records = sorted(root.glob("configs/*/record.json"))
    if not records:
        raise SystemExit(f"no configuration records under {root}/configs/")
    trial_start = load_record(root / "preflight" / "record.json", "preflight").environment.recorded_at
    configurations = [load_record(p, "configuration") for p in records]
    ends = [rec.timing.job_end for rec in configurations]
    cleanup = root / "cleanup" / "record.json"
    if cleanup.exists():
        ends.append(load_record(cleanup, "cleanup").finished)
    report = root / "report.html"
    if report.exists() and report.stat().st_mtime >= trial_start:
        ends.append(report.stat().st_mtime)
    trial_end = max(ends)
    print(f"{'configuration':14} {'job s':>8} {'startup s':>10} {'bench s':>9} {'import s':>9} {'workers':>8} "
          f"{'load s':>8} {'overhead s':>11} {'overhead':>9}")
    tot_startup = tot_bench = tot_load = tot_jobs = 0.0
    imports: list[float] = []
    unknown: list[str] = []  # configurations that ran passes and do not say what importing cost
    for rec in configurations:
        t = rec.timing
        startup = t.startup_s or 0.0
        bench = t.bench_s or 0.0
        load = sum(p.summary.duration or 0.0 for s in rec.scenarios for _, p in s.runs() if p.summary)
        wall = t.wall_s
        over = wall - startup - bench
        tot_startup, tot_bench, tot_load, tot_jobs = tot_startup + startup, tot_bench + bench, tot_load + load, tot_jobs + wall
        imported, workers = t.bench_import_s, t.bench_workers
        if imported is not None:
            imports.append(imported)
        elif any(s.runs() for s in rec.scenarios):
            unknown.append(rec.configuration)
        print(f"{rec.configuration:14} {wall:8.1f} {startup:10.1f} {bench:9.1f} {_fig(imported, '9.1f'):>9} "
              f"{_fig(workers, '8d'):>8} {load:8.1f} {over:11.1f} {100 * over / wall if wall else 0.0:8.1f}%")
    trial_wall = trial_end - trial_start
    useful = tot_startup + tot_bench
    print(f"\ntrial wall time (preflight record to last record or report): {trial_wall:.1f} s")
    print(f"sum of vLLM start-up (launch to ready): {tot_startup:.1f} s")
    print(f"sum of benchmark passes (process wall): {tot_bench:.1f} s, of which vLLM's own load duration: {tot_load:.1f} s")
    label = "sum of benchmark worker imports (vLLM's benchmark, paid within the passes)"
    if imports:
        print(f"{label}: {sum(imports):.1f} s"
              + (f"; n/a for {', '.join(unknown)} (records from before the benchmark worker)" if unknown else ""))
    else:
        print(f"{label}: n/a (the records predate the benchmark worker)")
    print(f"sum of configuration jobs: {tot_jobs:.1f} s")
    over = trial_wall - useful
    print(f"orchestration overhead: {over:.1f} s ({100 * over / trial_wall:.1f}% of the trial wall time)")


def _fig(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


if __name__ == "__main__":
    main()
