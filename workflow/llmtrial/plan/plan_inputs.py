"""What a plan is given: the hardware, and one configuration's vLLM arguments read once.

:class:`ServingArgs` is the one reading of a configuration's ``args``: the planner takes the
arguments that change memory from it, and the server's argv carries every argument it was given
(:func:`llmtrial.serve.server.build_server_argv`), so an alias is translated once, here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmtrial.core.trial_checks import canonical_args
from llmtrial.plan.shape import PlanError

__all__ = ["HardwareInputs", "ServingArgs"]

@dataclass
class HardwareInputs:
    """Where the model runs: GPUs and usable memory each, or a CPU KV space per worker."""

    gpus: int = 0
    gpu_memory_gib: float | None = None
    cpu_kv_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE
    cpu_kv_space_assumed: bool = False  # True when the KV space is a guess, not the configured value
    peer_access: bool | None = None  # every pair of the GPUs reaches the other directly (None: not known)

    @property
    def is_cpu(self) -> bool:
        return self.gpus == 0


def _draft_model(spec: Any) -> str | None:
    """The draft model a ``speculative_config`` (a mapping or its JSON) loads beside the target, or None
    (no speculation, or a method without weights of its own: ngram, the target's own MTP layers)."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            return None
    if not isinstance(spec, Mapping) or str(spec.get("method", "")).lower() in ("ngram", "mtp", "suffix"):
        return None
    model = spec.get("model")
    return str(model) if model and str(model) not in ("[ngram]", "ngram") else None


def _flag(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes", "")


@dataclass
class ServingArgs:
    """A configuration's vLLM arguments, read once from its args and env: those that change
    memory as typed fields, and every argument as given (under vLLM's names) for the argv."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    cpu_offload_gb: float = 0.0
    cpu_offload_params: tuple[str, ...] = ()
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None
    pp_layer_partition: list[int] | None = None
    dtype: str | None = None
    quantization: str | None = None
    draft_model: str | None = None  # speculative_config's draft model, when it names one
    enforce_eager: bool = False
    disable_custom_all_reduce: bool = False
    cudagraphs_in_budget: bool | None = None  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS; None: as the version does
    allow_long_max_model_len: bool = False  # VLLM_ALLOW_LONG_MAX_MODEL_LEN
    #: Every argument as the configuration gave it, under vLLM's names (:func:`canonical_args`).
    given: dict[str, Any] = field(default_factory=dict)

    @property
    def gpus_asked(self) -> int:
        """GPUs the configuration occupies: data x tensor x pipeline parallel."""
        return self.data_parallel_size * self.tensor_parallel_size * self.pipeline_parallel_size

    @classmethod
    def from_config(cls, args: Mapping[str, Any], env: Mapping[str, str] | None = None) -> ServingArgs:
        """From a configuration's ``args`` mapping (read by :func:`canonical_args`) and ``env``."""
        given = canonical_args(args)
        norm = {"kv_cache_memory_bytes": given.get("kv_cache_memory"), **given}
        out = cls(given=given)
        for name, conv in (("tensor_parallel_size", int), ("pipeline_parallel_size", int), ("data_parallel_size", int),
                           ("gpu_memory_utilization", float), ("max_model_len", int), ("max_num_seqs", int),
                           ("max_num_batched_tokens", int), ("cpu_offload_gb", float), ("block_size", int),
                           ("kv_cache_memory_bytes", int)):
            if norm.get(name) is not None:
                setattr(out, name, conv(norm[name]))
        if norm.get("kv_cache_dtype"):
            out.kv_cache_dtype = str(norm["kv_cache_dtype"])
        if norm.get("dtype") and str(norm["dtype"]) != "auto":
            out.dtype = str(norm["dtype"])
        out.draft_model = _draft_model(norm.get("speculative_config"))
        if norm.get("quantization"):
            out.quantization = str(norm["quantization"]).lower()
        params = norm.get("cpu_offload_params")
        if params:
            out.cpu_offload_params = tuple(params if isinstance(params, (list, tuple)) else str(params).split(","))
        out.enable_expert_parallel = "enable_expert_parallel" in norm and _flag(norm["enable_expert_parallel"])
        out.enforce_eager = "enforce_eager" in norm and _flag(norm["enforce_eager"])
        out.disable_custom_all_reduce = "disable_custom_all_reduce" in norm and _flag(norm["disable_custom_all_reduce"])
        env = env or {}
        graphs = env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
        out.cudagraphs_in_budget = None if graphs is None else str(graphs) != "0"
        out.allow_long_max_model_len = str(env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")).strip().lower() in ("1", "true")
        partition = env.get("VLLM_PP_LAYER_PARTITION")
        if partition:
            try:
                out.pp_layer_partition = [int(x) for x in str(partition).split(",")]
            except ValueError:
                raise PlanError(f"VLLM_PP_LAYER_PARTITION {partition!r} is not a comma-separated list of integers") from None
        return out
