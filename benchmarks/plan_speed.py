"""How long the planner takes: 100 configurations of seed 003's model, and of the tiny model.

    python benchmarks/plan_speed.py [N]

Prints the total and per-plan time, and the time of one refusal against its target: seed 003 at
TP 3 (64 attention heads do not divide by 3) is rejected in under a second. The point of planning
is that rejecting an impossible configuration costs a fraction of a second, not a model load.
"""

from __future__ import annotations

import sys
import time

from llmtrial.core.trial_config import SourceBlock
from llmtrial.core.units import GiB
from llmtrial.plan.checkpoint import WeightsSize
from llmtrial.plan.plan_inputs import HardwareInputs, ServingArgs
from llmtrial.plan.planner import plan
from llmtrial.weights.model_source import model_config_for

SEED_003 = {"num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
            "hidden_size": 4096, "vocab_size": 151936, "torch_dtype": "bfloat16", "num_experts": 128,
            "moe_intermediate_size": 1536}


def configurations(n: int) -> list[tuple[dict, HardwareInputs, ServingArgs]]:
    out = []
    for i in range(n):
        tp, pp = (1, 2, 3, 4, 8)[i % 5], (1, 2, 3)[i % 3]
        out.append((SEED_003, HardwareInputs(gpus=tp * pp, gpu_memory_gib=95),
                    ServingArgs(tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=4096 * (1 + i % 8),
                                gpu_memory_utilization=0.85 + 0.01 * (i % 10))))
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    for label, config, hardware in (("seed 003 (235B MoE, GPUs)", SEED_003, None),
                                    ("tiny (CPU)", model_config_for(SourceBlock(kind="tiny")), HardwareInputs(cpu_kv_space_gib=1))):
        cases = configurations(n)
        verdicts: dict[str, int] = {}
        t0 = time.perf_counter()
        for _config, hw, args in cases:
            result = plan(config, hardware or hw, args, weights=WeightsSize(int(220 * GiB), "given", "benchmark") if hardware is None else None)
            verdicts[result.verdict] = verdicts.get(result.verdict, 0) + 1
        elapsed = time.perf_counter() - t0
        print(f"{label}: {n} plans in {elapsed * 1000:.1f} ms ({elapsed / n * 1e6:.0f} us per plan); verdicts {verdicts}")
    t0 = time.perf_counter()
    refused = plan(SEED_003, HardwareInputs(gpus=3, gpu_memory_gib=95), ServingArgs(tensor_parallel_size=3, max_model_len=32768),
                   weights=WeightsSize(int(220 * GiB), "given", "benchmark"))
    elapsed = time.perf_counter() - t0
    print(f"seed 003 at TP 3: {refused.verdict} in {elapsed * 1000:.1f} ms (target: under 1000 ms); {refused.reasons[0]}")


if __name__ == "__main__":
    main()
