"""The planner's figures beside what vLLM logged at start-up, with the relative error of each:
the configuration record's ``prediction`` rows (llmtrial.serve.trial writes them, the report shows them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmtrial.core.configuration_model import Prediction
from llmtrial.core.record_models import PlanRecord
from llmtrial.core.units import GiB
from llmtrial.logs.startup_log import logged_gib
from llmtrial.plan.shape import predict_kv_tokens


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured in (None, 0):
        return None
    return (predicted - measured) / measured


def compare_with_plan(plan: PlanRecord, startup: Mapping[str, Mapping[str, Any]]) -> list[Prediction]:
    """The planner's figures beside what vLLM logged (``startup``: the start-up facts by name), with the
    relative error of each."""
    data, facts = plan.figures, plan.facts
    rows: list[Prediction] = []

    def add(name: str, predicted: Any, fact: str, measured_key: str) -> None:
        measured = startup.get(measured_key)
        if predicted is None or measured is None:
            return
        # a memory figure is compared in GiB, and only where its logged unit says so (not an old "MB")
        value = logged_gib(measured) if measured_key.endswith("_gib") else measured["value"]
        if value is None:
            return
        rows.append(Prediction(name=name, predicted=predicted, predicted_kind=facts[fact].kind if fact else "predicted",
                               measured=value, measured_source=measured["source"],
                               relative_error=relative_error(predicted, value)))

    if not plan.plan:
        return rows
    add("KV cache tokens", data.predicted_kv_cache_tokens, "predicted_kv_cache_tokens", "kv_cache_tokens")
    add("max concurrency", data.max_concurrency, "max_concurrency", "max_concurrency")
    if data.weights_bytes_per_rank:
        add("weights per rank (GiB)", round(data.weights_bytes_per_rank[0] / GiB, 2), "weights_bytes_per_rank",
            "model_load_gib")
    for name, key, logged in (("GPU budget per rank (GiB)", "gpu_budget_bytes", "gpu_requested_gib"),
                              ("non-torch memory (GiB)", "non_torch_bytes", "non_torch_gib"),
                              ("peak activation (GiB)", "peak_activation_bytes", "peak_activation_gib"),
                              ("CUDA graph memory (GiB)", "cuda_graph_bytes", "cuda_graph_gib")):
        if key == "cuda_graph_bytes" and "cuda_graph_outside_bytes" in facts:
            key = "cuda_graph_outside_bytes"  # captured outside the budget: what the log's figure measures
        if key in facts:
            add(name, round(facts[key].value / GiB, 2), key, logged)
    if data.available_kv_bytes_per_rank and "gpu_budget_bytes" in facts:
        add("KV cache memory per rank (GiB)", round(data.available_kv_bytes_per_rank[0] / GiB, 2),
            "available_kv_bytes_per_rank", "available_kv_gib" if "available_kv_gib" in startup else "kv_cache_in_use_gib")
    avail = startup.get("available_kv_gib")
    per_rank = data.kv_cache_bytes_per_token_per_rank
    if avail and per_rank:
        per_rank = per_rank if isinstance(per_rank, list) else [per_rank]
        _, tokens, _ = predict_kv_tokens([avail["value"] * GiB] * len(per_rank), per_rank, data.block_size,
                                         data.max_model_len)
        add("KV cache tokens from the logged KV memory", tokens, "", "kv_cache_tokens")
    return rows
