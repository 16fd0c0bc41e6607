"""What a TP1 server's start-up costs on the CPU build with its worker in a process of its own and inside the
engine core (``VLLM_ENABLE_V1_MULTIPROCESSING`` 1 and 0, the default trial's setting): seconds to ready, the
CPU seconds its processes had spent by then and how many processes it ran.

    python benchmarks/tp1_startup.py [ROUNDS]

Serves the generated tiny model as the default trial serves tp1 (its serving args and env from
config/config.yaml, eager), ROUNDS times each way (default 2), the two ways alternating so that whatever else
loads the machine falls on both; each server answers one completion before it is stopped. Prints every start
and each way's median. Run it with nothing else on the machine: it measures, it asserts nothing.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml

from llmtrial.host.collective import free_port
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve.server import ServerProcess, build_server_argv
from llmtrial.weights.tiny import generate_tiny_model

REPO = Path(__file__).resolve().parent.parent
KNOB = "VLLM_ENABLE_V1_MULTIPROCESSING"


def tree_cpu(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) the process and its descendants have spent, and how many there are."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    spent = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        spent += t.user + t.system
    return spent, len(procs)


def one_start(model: Path, work: Path, setting: str, serving: dict) -> dict:
    port = free_port(18900, 19000)
    env = {**serving["env"], KNOB: setting}
    argv = build_server_argv(model_dir=str(model), served_model_name="tiny", host="127.0.0.1", port=port,
                             args=ServingArgs.from_config({**serving["args"], "enforce_eager": True}, env))
    with ServerProcess(argv, host="127.0.0.1", port=port, log_path=work / f"server-{setting}-{time.time_ns()}.log",
                       env=env) as server:
        ready_s = server.wait_ready(timeout=600)
        cpu_s, processes = tree_cpu(server.proc.pid)
        body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as resp:
            answered = json.load(resp)["choices"][0]["finish_reason"] is not None
    return {"setting": setting, "ready_s": ready_s, "cpu_s": cpu_s, "processes": processes, "answered": answered}


def main(rounds: int) -> None:
    serving = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["serving"]
    with tempfile.TemporaryDirectory(prefix="tp1-startup-") as tmp:
        work = Path(tmp)
        model = generate_tiny_model(work / "model", seed=0)
        starts = []
        for _ in range(rounds):
            for setting in ("1", "0"):
                starts.append(one_start(model, work, setting, serving))
                s = starts[-1]
                print(f"{KNOB}={setting}: ready in {s['ready_s']:.1f} s, {s['cpu_s']:.1f} CPU-s in {s['processes']} "
                      f"processes, answered: {s['answered']}", flush=True)
    for setting, what in (("1", "a worker process of its own"), ("0", "the worker inside the engine core")):
        mine = [s for s in starts if s["setting"] == setting]
        print(f"{KNOB}={setting} ({what}), median of {len(mine)}: ready in "
              f"{statistics.median(s['ready_s'] for s in mine):.1f} s, "
              f"{statistics.median(s['cpu_s'] for s in mine):.1f} CPU-s, "
              f"{statistics.median(s['processes'] for s in mine):.0f} processes")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
