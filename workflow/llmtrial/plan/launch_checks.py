"""Checks before launch: what vLLM would refuse a configuration for within seconds of starting, and
the checks of its args and env against the host (allocator, NCCL interfaces, CPU thread binding, GPU
peer access, DeepGEMM on this GPU). Each names the argument and the model's field at fault."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from llmtrial.core.preflight_model import Gpus
from llmtrial.core.record_base import Check
from llmtrial.host.checks import check, check_allocator, check_nccl_interfaces
from llmtrial.host.probes import peer_check, selected_gpus
from llmtrial.plan.hf_config import HFConfig
from llmtrial.plan.plan_inputs import HardwareInputs, ServingArgs
from llmtrial.plan.shape import ConfigShape, derived_max_model_len

__all__ = ["DEEPGEMM_ARCHS", "VOCAB_PADDING", "configuration_checks", "cpu_binding_check", "refusals"]

#: GPU architectures DeepGEMM has kernels for (compute capability major.minor).
DEEPGEMM_ARCHS = ((9, 0), (10, 0))
#: vLLM pads the vocabulary of its parallel embedding to a multiple of this (vocab_parallel_embedding.py).
VOCAB_PADDING = 64


def _gpus_asked(args: ServingArgs, available: int) -> str:
    parts = [("data_parallel_size", args.data_parallel_size)] if args.data_parallel_size > 1 else []
    parts += [("tensor_parallel_size", args.tensor_parallel_size), ("pipeline_parallel_size", args.pipeline_parallel_size)]
    asked = " x ".join(f"{k} {v}" for k, v in parts)
    return f"{asked} = {args.gpus_asked} GPUs asked, {available} available (hardware.gpus)."


def _max_len(config: HFConfig, args: ServingArgs) -> list[str]:
    """max_model_len above what vLLM derives from config.json, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set."""
    derived, where = derived_max_model_len(config)
    if args.max_model_len is None or derived is None or args.max_model_len <= derived or args.allow_long_max_model_len:
        return []
    return [f"max_model_len {args.max_model_len:,} is above the {derived:,} tokens the model allows (config.json "
            f"{where}): vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (only with a position scaling that "
            "covers the length); lower max_model_len."]


def refusals(shape: ConfigShape, config: HFConfig, hardware: HardwareInputs,
             args: ServingArgs) -> tuple[list[str], list[str]]:
    """(reasons vLLM would refuse the configuration for in a second, other remarks), each naming the
    argument and the model's field."""
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    blocking: list[str] = []
    reasons: list[str] = []
    if not hardware.is_cpu and args.gpus_asked > hardware.gpus:
        blocking.append(_gpus_asked(args, hardware.gpus))
    if shape.num_heads % tp:
        blocking.append(f"Total number of attention heads ({shape.num_heads}) must be divisible by tensor parallel "
                        f"size ({tp}): pick a TP size that divides {shape.num_heads}.")
    padded = -(-shape.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    if shape.vocab_size and padded % tp:
        blocking.append(f"tensor_parallel_size {tp} does not divide the vocabulary (config.json vocab_size "
                        f"{shape.vocab_size:,}, {padded:,} padded to a multiple of {VOCAB_PADDING}): vLLM splits the "
                        f"embedding evenly and asserts '{padded} is not divisible by {tp}'.")
    blocking += _max_len(config, args)
    if shape.mla_kv_dim is None and tp > shape.num_kv_heads and tp % shape.num_kv_heads:
        blocking.append(f"TP {tp} exceeds the {shape.num_kv_heads} KV heads and is not a multiple of them.")
    elif shape.mla_kv_dim is None and tp <= shape.num_kv_heads and shape.num_kv_heads % tp:
        blocking.append(f"KV heads ({shape.num_kv_heads}) must be divisible by tensor parallel size ({tp}).")
    if shape.mla_kv_dim is None and tp > shape.num_kv_heads and not blocking:
        reasons.append(f"TP {tp} exceeds the {shape.num_kv_heads} KV heads: each rank replicates one KV head, "
                       "so KV memory does not shrink further with TP.")
    ep = tp * args.data_parallel_size
    if shape.num_experts and args.enable_expert_parallel and shape.num_experts % ep:
        blocking.append(f"{shape.num_experts} experts cannot be split evenly over an expert parallel size of {ep} "
                        "(data_parallel_size x tensor_parallel_size).")
    if pp > shape.num_layers:
        blocking.append(f"Pipeline parallel size {pp} exceeds the {shape.num_layers} layers.")
    return blocking, reasons


def cpu_binding_check(workers: int, hosts: Mapping[str, Mapping[str, str]]) -> Check:
    """VLLM_CPU_OMP_THREADS_BIND against the workers each host runs: ``hosts`` maps a host
    (a node of a multi-node configuration, each running its share of the workers) to the
    environment its workers see."""
    per_host = max(1, workers // max(1, len(hosts)))
    problems, seen = [], []
    for name, env in hosts.items():
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND")
        where = f" on node {name}" if len(hosts) > 1 else ""
        if per_host > 1 and not bind:
            problems.append(f"TP x PP = {per_host} workers{where or ' on a CPU host'} need VLLM_CPU_OMP_THREADS_BIND "
                            "(one core list per worker, such as 0|1), else the engine asserts 'Not enough allowed "
                            "NUMA nodes to bind threads'")
        elif bind and bind not in ("auto", "nobind") and len(bind.split("|")) != per_host:
            problems.append(f"VLLM_CPU_OMP_THREADS_BIND={bind}{where} lists {len(bind.split('|'))} core sets for "
                            f"{per_host} workers")
        seen.append(f"{bind or 'auto'}{where}")
    if problems:
        return check("cpu_thread_binding", "fail", "; ".join(problems))
    return check("cpu_thread_binding", "ok", f"{workers} worker(s); binding {', '.join(seen)}")


def configuration_checks(*, args: ServingArgs, env: Mapping[str, str], gpus: Gpus | None,
                         model_config: HFConfig | Mapping[str, Any], is_cpu: bool,
                         nodes_env: Mapping[str, Mapping[str, str]] | None = None,
                         name: str = "this configuration") -> list[Check]:
    """Checks that depend on one configuration's args and env (merged over the host's);
    ``nodes_env`` gives each node's own env when the configuration spans several; ``gpus`` is preflight's
    GPU inventory (None where none was taken). On a GPU host, peer access between the GPUs it splits
    over (the first TP x PP selected GPUs, in the order the servers see them)."""
    server_env = {"server": {**os.environ, **env}}
    out = [check_allocator(server_env), check_nccl_interfaces(server_env)]
    workers = args.tensor_parallel_size * args.pipeline_parallel_size
    if is_cpu:
        hosts = {name: {**env, **node_env} for name, node_env in nodes_env.items()} if nodes_env else {"": env}
        out.append(cpu_binding_check(workers, hosts))
        out.append(check("deepgemm", "skip", "CPU host"))
        return out
    out.append(check("cpu_thread_binding", "skip", "GPU host"))
    gpus = gpus or Gpus(present=False, count=0)
    out.append(peer_check(gpus.peer_access or {}, selected_gpus(gpus)[:workers], {name: workers}))
    quant = HFConfig.of(model_config).quantization_config
    block_fp8 = quant is not None and (quant.quant_method or "").lower() == "fp8" and quant.weight_block_size
    archs = {tuple(d.compute_capability) for d in gpus.devices or [] if d.compute_capability}
    unsupported = sorted(a for a in archs if a not in DEEPGEMM_ARCHS)
    if not block_fp8:
        out.append(check("deepgemm", "skip", "not a block-FP8 checkpoint"))
    elif env.get("VLLM_USE_DEEP_GEMM", "1") == "0":
        out.append(check("deepgemm", "ok", "block-FP8 checkpoint with VLLM_USE_DEEP_GEMM=0"))
    elif unsupported:
        out.append(check("deepgemm", "fail",
                         f"block-FP8 checkpoint (weight_block_size {quant.weight_block_size}) on GPUs of compute "
                         f"capability {', '.join(f'{a[0]}.{a[1]}' for a in unsupported)}, which DeepGEMM does not support "
                         "('Unknown SF transformation' at startup): set VLLM_USE_DEEP_GEMM=0 in the configuration's env"))
    else:
        out.append(check("deepgemm", "ok", "block-FP8 checkpoint on GPUs DeepGEMM supports"))
    return out
