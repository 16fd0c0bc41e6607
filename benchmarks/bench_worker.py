"""Per-pass wall time of the benchmark: a fresh process per pass against one worker.

    python benchmarks/bench_worker.py [PASSES]

Runs PASSES (default 4) small passes of vLLM's serving benchmark (4 prompts of 16 tokens
in, 8 out) against the loopback completions double of the tests (tests/conftest.py),
first each as its own ``python -m llmtrial.serve.vllm_bench`` process (the way passes ran
before the worker: ``fresh_pass`` below), then
all through one bench_worker.BenchWorker, with a tiny model's tokenizer. Prints each pass's
wall time, the worker's import time, and the mean per pass of both ways.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import CompletionsDouble, loopback  # noqa: E402
from llmtrial.serve.bench import bench_argv  # noqa: E402
from llmtrial.serve.bench_worker import BenchWorker  # noqa: E402
from llmtrial.weights.tiny import generate_tiny_model  # noqa: E402

SCENARIO = {"input_len": 16, "output_len": 8, "num_prompts": 4, "concurrency": 2, "request_rate": "inf"}


def fresh_pass(argv: list[str], *, log_path: Path, timeout: float) -> dict[str, float | int]:
    """One pass as its own process, its output in ``log_path``."""
    with open(log_path, "ab") as log:
        start = time.time()
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout,
                              check=False)
    return {"start": start, "end": time.time(), "returncode": proc.returncode}


def main() -> None:
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    with tempfile.TemporaryDirectory() as tmp, loopback(CompletionsDouble) as (host, port):
        out = Path(tmp)
        model = generate_tiny_model(out / "model", seed=0)

        def argv(name: str) -> list[str]:
            return bench_argv(host=host, port=port, served_model_name="tiny", tokenizer=str(model), scenario=SCENARIO,
                              seed=1, result_dir=str(out), result_filename=f"{name}.json", percentiles=[50, 99])

        ways = {}
        ways["process per pass"] = [fresh_pass(argv(f"fresh{i}"), log_path=out / f"fresh{i}.log", timeout=300)
                                    for i in range(passes)]
        with BenchWorker(log_path=out / "worker.log") as worker:
            ways["one worker"] = [worker.run(argv(f"worker{i}"), log_path=out / f"worker{i}.log", timeout=300)
                                  for i in range(passes)]
        for way, runs in ways.items():
            if any(r["returncode"] != 0 for r in runs):
                raise SystemExit(f"{way}: a pass failed: {runs}")
            walls = [r["end"] - r["start"] for r in runs]
            print(f"{way:17} passes (s): {' '.join(f'{w:5.2f}' for w in walls)}   "
                  f"mean {statistics.fmean(walls):5.2f} s, total {sum(walls):6.2f} s")
        print(f"worker: {worker.starts} started, importing vLLM's benchmark took {worker.import_s:.2f} s")


if __name__ == "__main__":
    main()
