"""Seed 000: Qwen3.5-397B-A17B's FP8 checkpoint (378.23 GiB) on three GPUs of 97.9 GiB usable, pipeline
parallel 3, planned from the trial file (config/trials/seed000-qwen3.5-397b-fp8-pp3.yaml) and the model's
real config.json (tests/data/configs/Qwen3.5-397B-A17B.json, its source in SOURCES.md). Every expected
figure is worked out here from the seed's report and config.json, not read back from the planner; the KV
cache tokens follow by vLLM's block rule from the KV memory the plan states, itself bounded here by hand."""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import DATA, REPO
from llmtrial.cli import main as cli_main
from llmtrial.config import check_config, configuration_spec, load_config, scenario_contexts
from llmtrial.core.preflight_model import Gpus
from llmtrial.core.record_models import PlanRecord
from llmtrial.plan.checkpoint import WeightsSize
from llmtrial.plan.planner import plan_record

GiB = 2**30
TRIAL = REPO / "config" / "trials" / "seed000-qwen3.5-397b-fp8-pp3.yaml"
CONFIG_JSON = DATA / "configs" / "Qwen3.5-397B-A17B.json"
#: The seed's checkpoint as its safetensors index records it: 406.13 GB decimal, 378.23 GiB.
CHECKPOINT_GIB = 378.23
WEIGHTS = WeightsSize(int(CHECKPOINT_GIB * GiB), "given", "seed 000: model.safetensors.index.json, 378.23 GiB")
#: Each GPU reports about 97.9 GiB usable; 64 GB of CPU memory per GPU for the experts.
GPU_GIB, GPUS, OFFLOAD_GIB = 97.9, 3, 64
NO_GPUS_HERE = Gpus(present=False, count=0, devices=[])  # the trial file says what the GPUs are


def text_config() -> dict:
    return json.loads(CONFIG_JSON.read_text())["text_config"]


def kv_bytes_per_layer() -> int:
    """One token's K and V in one attention layer, FP8 (one byte a value): 2 x KV heads x head_dim."""
    text = text_config()
    return 2 * text["num_key_value_heads"] * text["head_dim"] * 1


def plans() -> dict[str, PlanRecord]:
    """Every configuration of the trial file, planned as the plan stage plans it, on the seed's weights."""
    config = check_config(load_config(TRIAL))
    return {name: plan_record(spec=configuration_spec(config, name), model_config=json.loads(CONFIG_JSON.read_text()),
                              weights=WEIGHTS, gpus=NO_GPUS_HERE, hardware=config.hardware, settings=config.plan,
                              contexts=scenario_contexts(config))
            for name in config.configurations}


def test_the_trial_file_describes_the_seeds_gpus():
    hardware = check_config(load_config(TRIAL)).hardware
    assert hardware.gpus == GPUS and hardware.gpu_memory_gib == GPU_GIB


def test_with_64_gib_of_experts_offloaded_per_gpu_the_seeds_run_fits():
    record = plans()["pp3-offload"]
    assert record.verdict == "fits_with_offload", record.reasons
    layers = text_config()["num_hidden_layers"]
    assert record.plan["stage_layers"] == [layers // 3] * 3  # 60 layers, 20 a stage
    assert record.facts["offload_bytes_per_rank"].value == [OFFLOAD_GIB * GiB] * 3
    assert any(f"Fits with {OFFLOAD_GIB:.2f} GiB per GPU offloaded to CPU memory" in r for r in record.reasons)
    # what stays on the GPUs: the checkpoint less the experts offloaded, a third a stage (the first stage has the
    # embeddings and the last the head, 248,320 x 4,096 parameters each: under 1 GiB of 378.23)
    on_gpus = [w / GiB for w in record.plan["weights_bytes_per_rank"]]
    assert sum(on_gpus) == pytest.approx(CHECKPOINT_GIB - GPUS * OFFLOAD_GIB, rel=1e-6)
    assert all(abs(w - (CHECKPOINT_GIB - GPUS * OFFLOAD_GIB) / 3) < 1 for w in on_gpus)


def test_the_plan_states_the_kv_cache_of_every_stage():
    record = plans()["pp3-offload"]
    kinds = text_config()["layer_types"]
    full = kinds.count("full_attention")  # every fourth layer; the other 45 are gated DeltaNet, with no KV
    assert full == 15
    assert record.plan["kv_cache_bytes_per_token"] == full * kv_bytes_per_layer() == 15_360
    per_stage = [kinds[i * 20:(i + 1) * 20].count("full_attention") * kv_bytes_per_layer() for i in range(3)]
    assert record.plan["kv_cache_bytes_per_token_per_rank"] == per_stage == [5_120] * 3
    # each stage's KV memory is what the budget (97.9 GiB x 0.92) leaves after its weights, less at most a few GiB
    # of non-torch memory and activations (no CUDA graphs: enforce_eager)
    budget = GPU_GIB * 0.92
    for kv, weights in zip(record.plan["available_kv_bytes_per_rank"], record.plan["weights_bytes_per_rank"], strict=True):
        assert budget - weights / GiB - 3 < kv / GiB < budget - weights / GiB
    # vLLM's blocks of 16 tokens, the smallest stage's pool: the seed's 4 sequences of 2,048 tokens fit many times
    blocks = min(kv // (16 * 5_120) for kv in record.plan["available_kv_bytes_per_rank"])
    assert record.plan["predicted_kv_cache_tokens"] == blocks * 16
    assert record.plan["max_concurrency"] == pytest.approx(blocks / math.ceil(2048 / 16), abs=0.01)
    assert record.plan["max_concurrency"] > 4


def test_without_the_offload_it_is_refused_as_1_29x_the_gpus_memory():
    record = plans()["pp3-no-offload"]
    assert record.verdict == "does_not_fit" and not record.force
    whole = GPUS * GPU_GIB  # 293.70 GiB
    ratio = f"{CHECKPOINT_GIB / whole:.2f}x"
    assert ratio == "1.29x"  # the seed: "exceeds aggregate GPU memory by a factor of 1.29"
    [reason] = [r for r in record.reasons if "No memory left for the KV cache" in r]
    assert f"exceed the budget of {GPU_GIB * 0.92:.2f} GiB (97.9 GiB x gpu_memory_utilization 0.92)" in reason
    assert (f"The checkpoint's {CHECKPOINT_GIB:.2f} GiB of weights are {ratio} the memory of the 3 GPUs "
            f"(3 x 97.9 GiB = {whole:.2f} GiB)") in reason
    # a third of the checkpoint does not fit one GPU's budget, on any stage
    assert all(w / GiB > GPU_GIB * 0.92 for w in record.plan["weights_bytes_per_rank"])


def test_offload_restricted_to_the_experts_is_at_most_the_experts_of_a_stage():
    """cpu_offload_params experts offloads the routed experts only: asked for more than a stage's experts
    weigh, the planner offloads what they weigh, a little under a third of the checkpoint (routed experts:
    60 layers x 512 x 3 x 4,096 x 1,024 = 386.5B of the model's 397B parameters)."""
    config = check_config(load_config(TRIAL))
    spec = configuration_spec(config, "pp3-offload")
    spec.args["cpu_offload_gb"] = 200
    record = plan_record(spec=spec, model_config=json.loads(CONFIG_JSON.read_text()), weights=WEIGHTS, gpus=NO_GPUS_HERE,
                         hardware=config.hardware, settings=config.plan)
    text = text_config()
    experts = text["num_hidden_layers"] * text["num_experts"] * 3 * text["hidden_size"] * text["moe_intermediate_size"]
    share = experts / 397e9
    for offloaded in record.facts["offload_bytes_per_rank"].value:
        assert offloaded / GiB == pytest.approx(CHECKPOINT_GIB * share / 3, rel=0.01)
    assert any("Expert weights on stage 0 weigh" in r for r in record.reasons)


def plan_command(name: str) -> list[str]:
    """``llmtrial plan`` of one configuration of the trial file: its GPUs, its vLLM args, the seed's weights."""
    spec = configuration_spec(check_config(load_config(TRIAL)), name)
    sets = [f"{k}={','.join(v) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else v}"
            for k, v in spec.args.items()]
    return ["plan", "--model-config", str(CONFIG_JSON), "--gpus", str(GPUS), "--gpu-memory-gib", str(GPU_GIB),
            "--weights-gib", str(CHECKPOINT_GIB), *(x for s in sets for x in ("--set", s))]


def test_llmtrial_plan_prints_the_offload_and_the_kv_cache_per_rank(capsys):
    assert cli_main(plan_command("pp3-offload")) == 0
    out = capsys.readouterr().out
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines() if not line.startswith(("-", "!")))
    assert rows["verdict"] == "fits_with_offload"
    assert rows["offloaded per rank"] == ", ".join([f"{OFFLOAD_GIB:.2f} GiB"] * 3)
    assert rows["KV bytes per token"] == "15,360 B" and rows["KV bytes per token per rank"] == "[5120, 5120, 5120] B"
    assert rows["KV memory per rank"].count(" GiB") == 3


def test_llmtrial_plan_refuses_it_without_the_offload(capsys):
    assert cli_main(plan_command("pp3-no-offload")) == 1
    out = capsys.readouterr().out
    assert "does_not_fit" in out and "offloaded per rank" not in out
    assert "are 1.29x the memory of the 3 GPUs (3 x 97.9 GiB = 293.70 GiB)" in out
