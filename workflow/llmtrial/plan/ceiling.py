"""The decode throughput a configuration can reach at most, from measured bandwidths and the
model's shape: an ``estimated`` figure put beside the measured output tok/s.

A decode step reads every weight once for the whole batch, so a step takes at least, on each
pipeline stage (one rank of it),

* its resident weights over the memory bandwidth (``device_memory`` on a GPU, ``host_memory``
  for vLLM's CPU build),
* its offloaded weights (``cpu_offload_gb``) over the pinned host-to-device bandwidth,
* and per sequence in the batch, its layers' tensor-parallel all-reduces (two per layer of
  ``hidden_size`` activations, times nccl-tests' ring factor 2(tp-1)/tp over the all-reduce's
  bus bandwidth, or the GPU-to-GPU copy's when none was measured) and the pipeline hand-off to
  the next stage (``hidden_size`` activations over the same link).

At concurrency ``c`` a stage gives at most ``c / (t_weights + c * t_comm)`` tokens per second and
the pipeline the least of its stages (stages working at once on different micro-batches: an
upper bound). A term whose bandwidth was not measured is left out and named in
``not_counted``, so the figure stays an upper bound; without a memory bandwidth there is no
figure (``unknown``, with the reason). Latency (kernel launches, the small sends' own delay)
is not counted: real decode is slower.

The seed's own case: 6.99 GB offloaded per token over 3.26 GB/s pinned is 0.47 tok/s, against
0.46 measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmtrial.core.configuration_model import ThroughputBound
from llmtrial.core.preflight_model import Probes
from llmtrial.core.record_models import ModelShape, PlanRecord
from llmtrial.core.records import fact
from llmtrial.core.scenario_model import Scenario
from llmtrial.host.collective import busbw_factor

__all__ = ["allreduce_bytes_per_token", "bandwidths", "bound_at", "compare_with_measured", "decode_ceiling",
           "plan_ceiling"]

METHOD = ("per stage, weights read per step / memory bandwidth + offloaded bytes / pinned host-to-device bandwidth "
          "+ c x (2 all-reduces per layer of hidden_size activations x 2(tp-1)/tp + the hand-off to the next stage) "
          "/ the measured link; tok/s at concurrency c = c / (t_weights + c x t_comm), the slowest stage; weights "
          "are read once per step for the whole batch; latency is not counted")


def allreduce_bytes_per_token(layers: int, hidden_size: int, dtype_bytes: int) -> int:
    """Bytes a token's tensor-parallel all-reduces reduce: two per layer of ``hidden_size`` activations."""
    return layers * 2 * hidden_size * dtype_bytes


def _slowest(probes: Probes | None, name: str, *, memory: str | None = None,
             peer: bool | None = None) -> tuple[float, str] | None:
    """The lowest GB/s of a measured probe (every rank waits for the slowest), of the host memory's kind
    ``memory`` or with peer access ``peer`` where given, with its source."""
    got = [r for r in (probes.results if probes is not None else []) if r.name == name and r.status == "measured"
           and r.gbps and (memory is None or r.memory == memory) and (peer is None or r.peer == peer)]
    if not got:
        return None
    worst = min(got, key=lambda r: r.gbps or 0.0)
    return worst.gbps, f"preflight probe {name} on {worst.devices or 'the host'} ({worst.gbps:.3g} GB/s)"


def bandwidths(probes: Probes | None, *, is_cpu: bool) -> dict[str, tuple[float, str] | None]:
    """The bandwidths the bound needs (GB/s and where each came from), None where not measured."""
    return {"memory": _slowest(probes, "host_memory" if is_cpu else "device_memory"),
            "host_to_device": None if is_cpu else _slowest(probes, "host_to_device", memory="pinned"),
            "link": _slowest(probes, "all_reduce") or _slowest(probes, "device_to_device", peer=True)}


def decode_ceiling(*, stage_layers: Sequence[int], tp: int, hidden_size: int, dtype_bytes: int,
                   weights_per_rank: Sequence[float], offload_per_rank: Sequence[float],
                   bw: Mapping[str, tuple[float, str] | None]) -> dict[str, Any]:
    """The bound as a fact (``value``: tok/s at concurrency 1) with ``terms`` per stage (seconds),
    ``method``, ``not_counted`` and the ``bandwidths`` used."""
    if bw.get("memory") is None:
        return {**fact(None, "no memory bandwidth was measured (preflight probes device_memory or host_memory)",
                       kind="unknown", unit="tok/s"), "method": METHOD, "terms": None, "not_counted": []}
    gbps = {k: v[0] * 1e9 for k, v in bw.items() if v is not None}
    not_counted: list[str] = []
    if any(offload_per_rank) and "host_to_device" not in gbps:
        not_counted.append("offloaded weights (no pinned host-to-device bandwidth measured)")
    if (tp > 1 or len(stage_layers) > 1) and "link" not in gbps:
        not_counted.append("tensor-parallel all-reduces and pipeline hand-offs (no all-reduce or GPU-to-GPU "
                           "bandwidth measured)")
    stages = []
    for i, layers in enumerate(stage_layers):
        weights_s = weights_per_rank[i] / gbps["memory"]
        offload_s = offload_per_rank[i] / gbps["host_to_device"] if offload_per_rank[i] and "host_to_device" in gbps else 0.0
        tp_bytes = allreduce_bytes_per_token(layers, hidden_size, dtype_bytes) * busbw_factor(tp) if tp > 1 else 0
        handoff = hidden_size * dtype_bytes if i < len(stage_layers) - 1 else 0
        comm_s = (tp_bytes + handoff) / gbps["link"] if "link" in gbps else 0.0
        stages.append({"weights_s": weights_s, "offload_s": offload_s, "comm_s_per_token": comm_s,
                       "allreduce_bytes_per_token": tp_bytes, "handoff_bytes_per_token": handoff})
    out = {"stages": stages}
    sources = "; ".join(f"{k}: {v[1]}" for k, v in bw.items() if v is not None)
    return {**fact(bound_at({"terms": out}, 1), f"estimated from {sources}", kind="estimated", unit="tok/s"),
            "method": METHOD, "terms": out, "not_counted": not_counted,
            "bandwidths_gbps": {k: v[0] for k, v in bw.items() if v is not None}}


def bound_at(ceiling: Mapping[str, Any], concurrency: float) -> float | None:
    """The bound's tok/s at ``concurrency`` sequences per step; None when it is unknown."""
    terms = ceiling.get("terms")
    if not terms or concurrency <= 0:
        return None
    per_stage = [concurrency / (s["weights_s"] + s["offload_s"] + concurrency * s["comm_s_per_token"])
                 for s in terms["stages"] if s["weights_s"] + s["offload_s"] + s["comm_s_per_token"] > 0]
    return min(per_stage) if per_stage else None


def plan_ceiling(plan: Mapping[str, Any], facts: Mapping[str, Any], model: ModelShape, probes: Probes | None, *,
                 is_cpu: bool, hosts: int = 1) -> dict[str, Any]:
    """:func:`decode_ceiling` of a planned configuration (the plan record's ``plan``, ``facts``
    and ``model``) against the preflight record's probes.

    On a CPU host every rank reads its weights through the one host memory at the same time, so
    each stage's memory term is the weights of all ranks on a host (the whole model spread over
    ``hosts``), not one rank's: a GPU has its own memory, a CPU rank does not."""
    weights = facts.get("weights_bytes") or {}
    if weights.get("kind") == "unknown" or not plan.get("weights_bytes_per_rank"):
        return {**fact(None, f"the weights' size is unknown ({weights.get('source')})", kind="unknown", unit="tok/s"),
                "method": METHOD, "terms": None, "not_counted": []}
    offload = (facts.get("offload_bytes_per_rank") or {}).get("value") or [0] * len(plan["stage_layers"])
    tp, per_rank = int(plan["tensor_parallel_size"]), list(plan["weights_bytes_per_rank"])
    if is_cpu:  # the ranks on a host share its memory
        per_rank = [sum(per_rank) * tp / max(1, hosts)] * len(per_rank)
    out = decode_ceiling(stage_layers=plan["stage_layers"], tp=tp, hidden_size=int(model.hidden_size),
                         dtype_bytes=int(model.dtype_bytes), weights_per_rank=per_rank, offload_per_rank=offload,
                         bw=bandwidths(probes, is_cpu=is_cpu))
    if is_cpu and out["terms"] is not None:
        out["method"] += f"; on CPU hosts ({hosts}) the ranks of a host share its memory: each stage reads the weights of every rank on its host"
    return out


def compare_with_measured(plan: PlanRecord, scenarios: Sequence[Scenario]) -> list[ThroughputBound]:
    """Each ok pass (or sweep step) of each scenario: the bound at its concurrency beside the
    measured output tok/s, and measured / bound. Empty when the plan has no bound."""
    ceiling = plan.facts.get("decode_tok_s_ceiling")
    if ceiling is None or ceiling.terms is None:
        return []
    rows = []
    for scenario in scenarios:
        for one in [*scenario.pass_results, *(scenario.steps or [])]:
            summary = one.summary if one.status == "ok" else None
            measured = summary.output_throughput if summary is not None else None
            c = getattr(one, "concurrency", None) or scenario.spec.concurrency
            bound = bound_at({"terms": ceiling.terms}, float(c)) if isinstance(c, (int, float)) else None
            if measured is None or bound is None:
                continue
            rows.append(ThroughputBound.model_validate({
                "scenario": scenario.name, "pass": one.pass_, "concurrency": c,
                "bound_tok_s": bound, "bound_kind": "estimated", "measured_tok_s": measured,
                "ratio": measured / bound if bound else None}))
    return rows
