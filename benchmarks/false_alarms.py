"""The default trial against reruns of itself: how often a verdict says "different" when nothing changed,
and how many passes the interval rule needs against the spread rule.

    python benchmarks/false_alarms.py [RERUNS] [WORKDIR]

Runs the default trial (config/config.yaml, its servers eager so a run takes about two minutes here)
1 + RERUNS (default 5) times in one working directory, each under its own trial name, then compares
the first with each rerun (llmtrial.compare) and prints, per comparison, how many figures were declared
faster, slower, better or worse at the trial's level (95 %): every one of those is a false alarm, since
the trial is the same. Then it runs the same trial once more with the interval rule in place of the
spread rule (passes until the 95 % interval of output tok/s is within 10 % of the median, at most 8) and
prints the passes each configuration's scenario ran under each rule.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

from llmtrial.compare.comparison import compare_trials  # noqa: E402
from llmtrial.compare.trials import TrialResults  # noqa: E402
from llmtrial.report.conclusions import fixed_scenarios  # noqa: E402


def run_trial(work: Path, name: str, change=None) -> Path:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["trial"] = name
    config["serving"]["args"]["enforce_eager"] = True
    if change:
        change(config)
    path = work / f"{name}.json"
    path.write_text(json.dumps(config))
    start = time.time()
    proc = subprocess.run([SNAKEMAKE, "--snakefile", str(ROOT / "workflow" / "Snakefile"), "--directory", str(work), "--cores", "all",
                           "--configfile", str(path)], capture_output=True, text=True, check=False)
    print(f"{name}: snakemake exited {proc.returncode} after {time.time() - start:.0f} s", flush=True)
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
    return work / "results" / name


def passes_run(folder: Path) -> dict[str, int]:
    t = TrialResults.load(folder)
    return {f"{n}/{sc.name}": len(sc.pass_results) for n, rec in t.configurations.items() for sc in fixed_scenarios(rec)}


def interval_rule(config: dict) -> None:
    for spec in config["scenarios"].values():
        spec["passes"] = {"min": 2, "max": 8, "agreement": None, "interval": 0.10}


def main() -> int:
    reruns = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    work = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="llmt-false-alarms-"))
    (work / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "config" / "config.yaml", work / "config" / "config.yaml")
    folders = [run_trial(work, f"run{i}") for i in range(reruns + 1)]
    alarms, judged_total = [], 0
    for later in folders[1:]:
        record = compare_trials(folders[0], later)
        judged = [r for r in record.rows if r.verdict != "not comparable"]
        differ = [r for r in judged if r.verdict in ("faster", "slower", "better", "worse")]
        unstable = [r for r in judged if r.verdict == "unstable"]
        judged_total += len(judged)
        alarms.append(len(differ))
        print(f"run0 against {later.name}: workloads match {record.workloads_match}; {len(differ)} of {len(judged)} "
              f"figures declared different, {len(unstable)} unstable"
              + (": " + "; ".join(f"{r.configuration} {r.scenario} {r.label} {r.verdict} {r.ratio:.3f}x" for r in differ)
                 if differ else ""))
    print(f"comparisons with any figure declared different: {sum(1 for n in alarms if n)} of {len(alarms)}; "
          f"figures declared different: {sum(alarms)} of {judged_total} ({100 * sum(alarms) / judged_total:.1f} %)")
    spread = [passes_run(f) for f in folders]
    interval = passes_run(run_trial(work, "interval", interval_rule))
    for key in interval:
        counts = [s[key] for s in spread if key in s]
        print(f"{key}: spread rule (agreement 10 %, 3-6 passes) ran {statistics.fmean(counts):.1f} passes on average "
              f"({min(counts)}-{max(counts)}); interval rule (95 % interval within 10 %, 2-8 passes) ran {interval[key]}")
    print(f"working directory: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
