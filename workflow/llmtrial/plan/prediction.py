"""The planner's figures beside what vLLM logged at start-up, with the relative error of each:
the configuration record's ``prediction`` rows (llmtrial.serve.trial writes them, the report shows them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmtrial.core.units import GiB
from llmtrial.logs.startup_log import logged_gib
from llmtrial.plan.shape import predict_kv_tokens


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured in (None, 0):
        return None
    return (predicted - measured) / measured


def compare_with_plan(plan: Mapping[str, Any], startup: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The planner's figures beside what vLLM logged, with the relative error of each."""
    data, facts = plan.get("plan") or {}, plan.get("facts") or {}
    rows: list[dict[str, Any]] = []

    def add(name: str, predicted: Any, kind: str, measured_key: str) -> None:
        measured = startup.get(measured_key)
        if predicted is None or measured is None:
            return
        # a memory figure is compared in GiB, and only where its logged unit says so (not an old "MB")
        value = logged_gib(measured) if measured_key.endswith("_gib") else measured["value"]
        if value is None:
            return
        rows.append({"name": name, "predicted": predicted, "predicted_kind": kind, "measured": value,
                     "measured_source": measured["source"], "relative_error": relative_error(predicted, value)})

    if not data:
        return rows
    add("KV cache tokens", data.get("predicted_kv_cache_tokens"), facts["predicted_kv_cache_tokens"]["kind"], "kv_cache_tokens")
    add("max concurrency", data.get("max_concurrency"), facts["max_concurrency"]["kind"], "max_concurrency")
    weights = data.get("weights_bytes_per_rank") or []
    if weights:
        add("weights per rank (GiB)", round(weights[0] / GiB, 2), facts["weights_bytes_per_rank"]["kind"], "model_load_gib")
    for name, key, logged in (("GPU budget per rank (GiB)", "gpu_budget_bytes", "gpu_requested_gib"),
                              ("non-torch memory (GiB)", "non_torch_bytes", "non_torch_gib"),
                              ("peak activation (GiB)", "peak_activation_bytes", "peak_activation_gib"),
                              ("CUDA graph memory (GiB)", "cuda_graph_bytes", "cuda_graph_gib")):
        if key == "cuda_graph_bytes" and "cuda_graph_outside_bytes" in facts:
            key = "cuda_graph_outside_bytes"  # captured outside the budget: what the log's figure measures
        if key in facts:
            add(name, round(facts[key]["value"] / GiB, 2), facts[key]["kind"], logged)
    kv_memory = data.get("available_kv_bytes_per_rank") or []
    if kv_memory and "gpu_budget_bytes" in facts:
        add("KV cache memory per rank (GiB)", round(kv_memory[0] / GiB, 2), facts["available_kv_bytes_per_rank"]["kind"],
            "available_kv_gib" if "available_kv_gib" in startup else "kv_cache_in_use_gib")
    avail = startup.get("available_kv_gib")
    per_rank = data.get("kv_cache_bytes_per_token_per_rank")
    if avail and per_rank:
        per_rank = per_rank if isinstance(per_rank, list) else [per_rank]
        _, tokens, _ = predict_kv_tokens([avail["value"] * GiB] * len(per_rank), per_rank, data["block_size"],
                                         data["max_model_len"])
        add("KV cache tokens from the logged KV memory", tokens, "predicted", "kv_cache_tokens")
    return rows
