"""The decode throughput bound (llmtrial.plan.ceiling): the seed's own arithmetic, bytes per token of
real models' config.json, and the bound in the plan and configuration records."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, written
from llmtrial.core.configuration_spec import ServingSpec
from llmtrial.core.preflight_model import Gpus, Probes
from llmtrial.core.record_models import PlanRecord
from llmtrial.core.records import check_record
from llmtrial.core.scenario_model import Scenario
from llmtrial.core.trial_config import HardwareBlock, PlanBlock
from llmtrial.plan import ceiling
from llmtrial.plan.planner import plan_record
from llmtrial.plan.shape import model_shape

CONFIGS = REPO / "tests" / "data" / "configs"


def load(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def probe(name: str, gbps: float, devices=(0,), **extra) -> dict:
    return {"name": name, "status": "measured", "kind": "measured", "devices": list(devices), "gbps": gbps,
            "method": None, "bytes": None, "repeats": None, "seconds_median": None, "reason": None, **extra}


def as_probes(probes: dict) -> Probes:
    """Probe results as preflight's record holds them."""
    return Probes.model_validate({"torch": "2.13.0", "cuda_available": True, "devices": [], "reason": None, **probes})


#: The seed's RTX 3060 host: pinned 3.26 GB/s and pageable 2.84 GB/s to the GPU, 2.79 GB/s GPU to GPU
#: (staged through RAM, no peer access), and the card's 360 GB/s memory.
SEED_PROBES = {"results": [probe("host_to_device", 3.26, memory="pinned"), probe("host_to_device", 2.84, memory="pageable"),
                           probe("device_to_device", 2.79, (0, 1), peer=True), probe("device_memory", 360.0)]}


def test_the_seeds_offload_arithmetic_gives_047_tok_s_against_046_measured():
    """15 layers of 0.466 GB in RAM: 6.99 GB cross PCIe per token, at 3.26 GB/s pinned."""
    bw = ceiling.bandwidths(as_probes(SEED_PROBES), is_cpu=False)
    assert bw["host_to_device"][0] == 3.26  # pinned, not pageable
    offload_only = ceiling.decode_ceiling(stage_layers=[28], tp=1, hidden_size=3584, dtype_bytes=2,
                                          weights_per_rank=[0.0], offload_per_rank=[6.99e9], bw=bw)
    assert offload_only["value"] == pytest.approx(3.26 / 6.99) and round(offload_only["value"], 2) == 0.47
    measured = 1000 / 2191  # TPOT 2,191 ms: 0.46 tok/s
    assert abs(offload_only["value"] - measured) / measured < 0.025
    # with the 7.69 GiB resident on the GPU read at its memory bandwidth, still above what was measured
    whole = ceiling.decode_ceiling(stage_layers=[28], tp=1, hidden_size=3584, dtype_bytes=2,
                                   weights_per_rank=[7.69 * 2**30], offload_per_rank=[6.99e9], bw=bw)
    assert measured < whole["value"] < offload_only["value"]
    assert whole["kind"] == "estimated" and whole["unit"] == "tok/s" and whole["not_counted"] == []


def test_the_seeds_tensor_parallel_example_392_kib_per_token_at_279_gb_s():
    """28 layers x 2 all-reduces x 3,584 x 2 bytes = 392 KiB per token; about 0.14 ms at 2.79 GB/s."""
    shape = model_shape(load("Qwen2.5-7B-Instruct-AWQ"))  # the seed's 7B model: 28 layers of hidden 3,584
    per_token = ceiling.allreduce_bytes_per_token(shape.num_layers, shape.hidden_size, 2)
    assert per_token == 392 * 1024
    bound = ceiling.decode_ceiling(stage_layers=[28], tp=2, hidden_size=3584, dtype_bytes=2,
                                   weights_per_rank=[7.6e9], offload_per_rank=[0.0],
                                   bw=ceiling.bandwidths(as_probes(SEED_PROBES), is_cpu=False))
    [stage] = bound["terms"]["stages"]
    assert stage["allreduce_bytes_per_token"] == per_token  # the ring factor 2(tp-1)/tp is 1 at TP 2
    assert stage["comm_s_per_token"] * 1e3 == pytest.approx(0.144, abs=0.001)
    assert "device_to_device" in bound["source"]
    # the weights' read dominates at one sequence; communication grows with the batch
    assert ceiling.bound_at(bound, 64) / ceiling.bound_at(bound, 1) < 64


@pytest.mark.parametrize(("name", "layers", "hidden"), [("Meta-Llama-3.1-8B-Instruct", 32, 4096),
                                                        ("Qwen3-30B-A3B", 48, 2048), ("Mixtral-8x7B-v0.1", 32, 4096)])
def test_bytes_per_token_follow_the_models_shape(name, layers, hidden):
    shape = model_shape(load(name))
    assert (shape.num_layers, shape.hidden_size) == (layers, hidden)
    assert ceiling.allreduce_bytes_per_token(shape.num_layers, shape.hidden_size, shape.dtype_bytes) == \
        layers * 2 * hidden * shape.dtype_bytes


def test_an_all_reduce_measured_is_the_link_and_its_ring_factor_counts():
    probes = {"results": [*SEED_PROBES["results"], probe("all_reduce", 10.0, (0, 1, 2, 3))]}
    bw = ceiling.bandwidths(as_probes(probes), is_cpu=False)
    assert bw["link"][0] == 10.0
    bound = ceiling.decode_ceiling(stage_layers=[16, 16], tp=4, hidden_size=4096, dtype_bytes=2,
                                   weights_per_rank=[1e9, 1e9], offload_per_rank=[0, 0], bw=bw)
    first, last = bound["terms"]["stages"]
    assert first["allreduce_bytes_per_token"] == 16 * 2 * 4096 * 2 * 1.5  # 2(4-1)/4
    assert (first["handoff_bytes_per_token"], last["handoff_bytes_per_token"]) == (4096 * 2, 0)


def test_terms_not_measured_are_named_and_no_memory_bandwidth_is_unknown():
    cpu = {"results": [probe("host_memory", 17.0, ())]}
    bound = ceiling.decode_ceiling(stage_layers=[2, 2], tp=2, hidden_size=64, dtype_bytes=2, weights_per_rank=[1e6, 1e6],
                                   offload_per_rank=[0, 0], bw=ceiling.bandwidths(as_probes(cpu), is_cpu=True))
    assert bound["kind"] == "estimated" and bound["value"] == pytest.approx(17e9 / 1e6)
    assert bound["not_counted"] and "all-reduces" in bound["not_counted"][0]
    unknown = ceiling.decode_ceiling(stage_layers=[4], tp=1, hidden_size=64, dtype_bytes=2, weights_per_rank=[1e6],
                                     offload_per_rank=[0], bw=ceiling.bandwidths(as_probes(cpu), is_cpu=False))
    assert unknown["kind"] == "unknown" and unknown["value"] is None and "device_memory" in unknown["source"]
    assert ceiling.bound_at(unknown, 4) is None


def test_the_plan_record_carries_the_bound_and_the_configuration_record_compares_it(tmp_path):
    config = load("Meta-Llama-3.1-8B-Instruct")
    gpus = Gpus.model_validate({"present": True, "count": 1, "devices": [{"index": 0, "memory_total_bytes": 80 * 2**30}]})
    plan = written(plan_record(spec=ServingSpec(name="one", args={}), model_config=config, weights=None,
                               gpus=gpus, hardware=HardwareBlock(), settings=PlanBlock(), probes=as_probes(SEED_PROBES)))
    check_record(plan, "plan")
    bound = plan["facts"]["decode_tok_s_ceiling"]
    weights = plan["plan"]["weights_bytes_per_rank"][0]
    assert bound["kind"] == "estimated" and bound["value"] == pytest.approx(360e9 / weights)
    ran = {"seed": 0, "start": 0.0, "end": 1.0, "argv": [], "log": "bench.log"}
    scenarios = [Scenario.model_validate({
        "name": "short", "spec": {"concurrency": 4},
        "pass_results": [{"pass": 1, "status": "ok", "summary": {"output_throughput": 100.0}, **ran},
                         {"pass": 2, "status": "failed", **ran}]})]
    [row] = ceiling.compare_with_measured(PlanRecord.model_validate(plan), scenarios)
    assert row.pass_ == 1 and row.concurrency == 4 and row.bound_tok_s == pytest.approx(ceiling.bound_at(bound, 4))
    assert row.ratio == pytest.approx(100.0 / row.bound_tok_s) and row.bound_kind == "estimated"
    without = written(plan_record(spec=ServingSpec(name="one", args={}), model_config=config, weights=None,
                                  gpus=gpus, hardware=HardwareBlock(), settings=PlanBlock()))
    assert without["facts"]["decode_tok_s_ceiling"]["kind"] == "unknown"
    assert ceiling.compare_with_measured(PlanRecord.model_validate(without), scenarios) == []


def test_on_a_cpu_host_the_ranks_share_its_memory_so_tp2_reads_the_whole_model_per_step():
    """The CPU build's TP2 on one host: both ranks read through the same memory at once, so the
    bound's memory term is the whole model's weights, as at TP1; split over two hosts, half."""
    config = load("Meta-Llama-3.1-8B-Instruct")
    cpu = {"results": [probe("host_memory", 20.0, ())]}
    gpus = Gpus(present=False, count=0, devices=[])
    bounds = {}
    for name, tp, nodes in (("tp1", 1, {}), ("tp2", 2, {}), ("tp2-two-hosts", 2, {"a": {}, "b": {}})):
        plan = written(plan_record(spec=ServingSpec(name=name, args={"tensor_parallel_size": tp}, nodes=nodes),
                                   model_config=config, weights=None, gpus=gpus, hardware=HardwareBlock(gpus=0),
                                   settings=PlanBlock(), probes=as_probes(cpu)))
        bounds[name] = plan["facts"]["decode_tok_s_ceiling"]
    whole = sum(plan["plan"]["weights_bytes_per_rank"]) * 2
    assert bounds["tp1"]["value"] == pytest.approx(20e9 / whole, rel=0.01)
    assert bounds["tp2"]["value"] == pytest.approx(bounds["tp1"]["value"], rel=0.01)
    assert bounds["tp2-two-hosts"]["value"] == pytest.approx(2 * bounds["tp1"]["value"], rel=0.01)
    assert "share its memory" in bounds["tp2"]["method"]
