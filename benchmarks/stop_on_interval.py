"""One scenario run both ways: a fixed count of passes (as a sweep, or ``vllm bench sweep serve``, runs them)
and passes until the interval the verdicts rest on is narrow enough; prints the passes each used, the time
they took and the width of output tok/s's interval at the end.

    python benchmarks/stop_on_interval.py [PASSES] [WIDTH] [PROMPTS] [WORKDIR]

Runs the default trial (config/config.yaml) with one configuration (tp1, eager) and two scenarios of the same
work (concurrency 4, PROMPTS prompts of 64 tokens in and 32 out, default 32; a warm-up first): ``fixed`` runs
PASSES passes (default 6),
``interval`` runs 2 to PASSES, stopping once the 95 % interval over passes (Student t on the logarithms, the
report's) is within WIDTH of the median (default 0.10). Both scenarios run against the same server, one after
the other.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from false_alarms import ROOT, run_trial

from llmtrial.compare.trials import TrialResults
from llmtrial.core.stats import pass_interval
from llmtrial.report.conclusions import fixed_scenarios

WORK = {"concurrency": 4, "input_len": 64, "output_len": 32, "warmup": True}


def both_ways(passes: int, width: float, prompts: int):
    def change(config: dict) -> None:
        config["configurations"] = {"tp1": config["configurations"]["tp1"]}
        work = {**WORK, "num_prompts": prompts}
        config["scenarios"] = {"fixed": {**work, "passes": passes},
                               "interval": {**work, "passes": {"min": 2, "max": passes, "agreement": None,
                                                               "interval": width}}}
        config.pop("outputs", None)
    return change


def main() -> int:
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    width = float(sys.argv[2]) if len(sys.argv) > 2 else 0.10
    prompts = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    work = Path(sys.argv[4]) if len(sys.argv) > 4 else Path(tempfile.mkdtemp(prefix="llmt-stop-"))
    (work / "config").mkdir(parents=True, exist_ok=True)
    (work / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    folder = run_trial(work, "stop-on-interval", both_ways(passes, width, prompts))
    record = TrialResults.load(folder).configurations["tp1"]
    for sc in fixed_scenarios(record):
        values = [p.summary.output_throughput for p in sc.ok_passes()]
        ci = pass_interval(values)
        median = statistics.median(values)
        spent = sum(p.end - p.start for p in sc.ok_passes())
        rule = sc.repetition.stopped if sc.repetition else "fixed"
        print(f"{sc.name}: {len(values)} passes ({rule}), {spent:.1f} s of passes; output tok/s median {median:,.1f}, "
              f"95 % interval {ci.low:,.1f}-{ci.high:,.1f}, {100 * ci.width_over(median):.1f} % of the median wide; "
              f"passes: {', '.join(f'{v:,.0f}' for v in values)}")
    print(f"working directory: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
