"""The planner against real vLLM start-ups: per case, what it predicts from config.json and what vLLM logged.

The data set is read from where it lies, never copied into the project: a ``truth.json`` whose
``cases`` each give the model's ``config`` (a config.json path next to it), the vLLM ``args``, the
``gpus`` and the ``logged`` figures (``model_loading_gib``, ``kv_cache_tokens``,
``available_kv_gib_binding``, ``requested_memory_gib``, ``total_memory_gib`` and each worker's
``profile_per_worker``: ``weights_gib``, ``torch_peak_gib``, ``non_torch_fwd_gib``). For every
successful case with a config it plans twice:

* from config.json alone, as before a launch: weights per rank, KV tokens and their error, and the
  planner's non-torch and peak-activation terms beside the logged ones, each by the case's vLLM version;
* given the KV memory vLLM logged: the arithmetic per token alone.

and prints the memory outside the budget (``headroom_bytes``: what the utilization leaves free less
the CUDA graphs and the sampler's warm-up) from config.json and given the logged CUDA graph memory.

Cases the data set gives no config.json for are planned from ``--configs`` folders where one
holds ``<model>.json`` (this project's own real configs in tests/data/configs, with their sources).

For every failed case it prints the planner's verdict and first reason beside vLLM's failure line,
and the headroom warning where the plan, given the terms the case logged, gives one.

llm-d-planner's harness asks Kubernetes for ``tensor_parallel_size x pipeline_parallel_size`` GPUs
per pod whatever ``data_parallel_size`` is (``num_gpus = run["tp"] * run["pp"]`` in its
``accuracy/scripts/sweep_runner.py``), so the GPUs a case saw are that product (``--gpus pod``, the
default); ``--gpus case`` takes the data set's own ``gpus`` instead.

    .venv/bin/python benchmarks/planner_vs_logs.py ../shared/anchors/llmd/truth.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from llmtrial.core.units import GiB
from llmtrial.plan.budget import MemoryTerms
from llmtrial.plan.plan_inputs import HardwareInputs, ServingArgs
from llmtrial.plan.planner import Plan, plan
from llmtrial.plan.shape import PlanError


def _args(case: dict[str, Any]) -> ServingArgs:
    return ServingArgs.from_config({k: v for k, v in case["args"].items() if not k.endswith("_note")})


def _error(predicted: float | None, logged: float | None) -> float | None:
    return None if predicted is None or not logged else (predicted - logged) / logged


def _pct(x: float | None) -> str:
    return "     -" if x is None else f"{100 * x:+6.1f}%"


def _logged_terms(logged: dict[str, Any]) -> MemoryTerms:
    """The memory terms the case's first worker logged, as the trial file would give them."""
    usage = (logged.get("actual_usage_per_worker") or [{}])[0]
    return MemoryTerms(non_torch_gib=usage.get("non_torch"), peak_activation_gib=usage.get("peak_activation"),
                       cuda_graph_gib=usage.get("cuda_graph"))


def _headroom(p: Plan) -> float | None:
    return p.facts["headroom_bytes"]["value"] / GiB if "headroom_bytes" in p.facts else None


def _one(case: dict[str, Any], config: dict[str, Any], hw: HardwareInputs) -> dict[str, Any]:
    logged = case["logged"]
    args = _args(case)
    try:
        cold = plan(config, hw, args, vllm_version=logged.get("vllm_version"))
        given = plan(config, hw, args, available_kv_gib=logged.get("available_kv_gib_binding"),
                     vllm_version=logged.get("vllm_version"))
        given_terms = plan(config, hw, args, memory=_logged_terms(logged), vllm_version=logged.get("vllm_version"))
    except PlanError as exc:
        return {"id": case["id"], "verdict": f"error: {exc}"}
    graphs = cold.facts.get("cuda_graph_outside_bytes") or cold.facts.get("cuda_graph_bytes")
    weights = (cold.data.get("weights_bytes_per_rank") or [None])[0]
    profile = (logged.get("profile_per_worker") or [{}])[0]
    terms = {k: (cold.facts[k]["value"] / GiB if k in cold.facts else None) for k in ("non_torch_bytes",
                                                                                      "peak_activation_bytes")}
    return {
        "id": case["id"], "verdict": cold.verdict,
        "weights": (weights / GiB if weights else None, (logged.get("model_loading_gib") or [None])[0]),
        "kv": (cold.data.get("predicted_kv_cache_tokens"), logged.get("kv_cache_tokens")),
        "kv_given": (given.data.get("predicted_kv_cache_tokens"), logged.get("kv_cache_tokens")),
        "non_torch": (terms["non_torch_bytes"], profile.get("non_torch_fwd_gib")),
        "activation": (terms["peak_activation_bytes"], profile.get("torch_peak_gib")),
        "graphs": (graphs["value"] / GiB if graphs else None, (logged.get("cuda_graph_actual_gib") or [None])[0]),
        "headroom": (_headroom(cold), _headroom(given_terms)),
    }


def _failed(case: dict[str, Any], config: dict[str, Any], hw: HardwareInputs) -> tuple[str, str, str | None]:
    """The verdict and first blocking reason (else the first reason), and the headroom warning given the
    case's logged terms (None without one)."""
    version = case["logged"].get("vllm_version")
    try:
        p = plan(config, hw, _args(case), vllm_version=version)
        given = plan(config, hw, _args(case), memory=_logged_terms(case["logged"]), vllm_version=version)
    except PlanError as exc:  # a run that died before it logged the GPU's memory
        return "not planned", str(exc), None
    warning = next((r for r in given.reasons if r.startswith("Memory outside the KV budget")), None)
    first = next((r for r in p.reasons if r.startswith("Memory outside the KV budget")), None) \
        if p.verdict == "fits" else None
    return p.verdict, first or (p.reasons or [""])[0], warning


def _hardware(case: dict[str, Any], opts: argparse.Namespace) -> HardwareInputs:
    args = case["args"]
    gpus = case["gpus"] if opts.gpus == "case" else \
        args.get("tensor_parallel_size", 1) * args.get("pipeline_parallel_size", 1)
    # llm-d's H100s reach each other over NVLink: vLLM's custom all-reduce runs at TP > 1;
    # a run that died before logging the GPU's memory ran on the same GPUs as the others (--gpu-memory-gib)
    return HardwareInputs(gpus=gpus, gpu_memory_gib=case["logged"].get("total_memory_gib") or opts.gpu_memory_gib,
                    peer_access=True)


def _row(r: dict[str, Any]) -> str:
    (pw, lw), (pk, lk), (gk, _) = r["weights"], r["kv"], r["kv_given"]
    nt, act, cg, (hc, hg) = r["non_torch"], r["activation"], r["graphs"], r["headroom"]
    return (f"{r['id'][:58]:58} {r['verdict']:12} {(pw or 0):8.2f}/{(lw or 0):8.2f} {_pct(_error(pw, lw))} "
            f"{(pk or 0):>10,}/{(lk or 0):>10,} {_pct(_error(pk, lk))} {_pct(_error(gk, lk))} "
            f"{(nt[0] or 0):5.2f}/{(nt[1] or 0):5.2f} {(act[0] or 0):5.2f}/{(act[1] or 0):5.2f} "
            f"{(cg[0] or 0):5.2f}/{(cg[1] or 0):5.2f} {_gib(hc)}/{_gib(hg)}")


def _gib(x: float | None) -> str:
    return "    -" if x is None else f"{x:+5.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("truth", type=Path, help="the data set's truth.json (configs are read relative to it)")
    ap.add_argument("--gpu-memory-gib", type=float, default=79.19,
                    help="the GPUs' memory where a case did not log it (default: an H100-80GB's 79.19)")
    ap.add_argument("--configs", type=Path, action="append", default=[],
                    help="a folder of config.json files named <model>.json (the model's name without its owner) "
                         "for cases the data set gives none, e.g. tests/data/configs; may repeat")
    ap.add_argument("--gpus", choices=("pod", "case"), default="pod",
                    help="the GPUs a case saw: its pod's TP x PP (default, as llm-d's harness asks) or the case's gpus")
    opts = ap.parse_args(argv)
    data = json.loads(opts.truth.read_text())
    rows, failed = [], []
    for case in data["cases"]:
        found = [opts.truth.parent / case["config"]] if case.get("config") else \
            [p for d in opts.configs if (p := d / f"{case['model'].split('/')[-1]}.json").is_file()]
        if not found:
            continue
        config = json.loads(found[0].read_text())
        if case["status"] == "ok":
            rows.append(_one(case, config, _hardware(case, opts)))
        else:
            failed.append((case, *_failed(case, config, _hardware(case, opts))))
    print(f"{'case':58} {'verdict':12} {'weights/rank GiB':>18} {'err':>7} {'KV tokens':>21} {'err':>7} "
          f"{'given':>7} {'non-torch':>11} {'activation':>11} {'CUDA graphs':>11} {'headroom':>11}")
    for r in rows:
        print(_row(r) if "kv" in r else f"{r['id'][:58]:58} {r['verdict']}")
    print()
    for case, verdict, reason, warning in failed:
        print(f"FAILED {case['id'][:60]:60} planned {verdict}: {reason[:110]}\n"
              f"       vLLM: {(case.get('failure_lines') or [''])[0][:140]}"
              + (f"\n       given the logged terms: {warning[:140]}" if warning else ""))
    _summary(rows, failed)
    return 0


def _summary(rows: list[dict[str, Any]], failed: list[tuple[Any, ...]]) -> None:
    kv = [e for r in rows if "kv" in r and (e := _error(*r["kv"])) is not None]
    given = [e for r in rows if "kv" in r and (e := _error(r["kv_given"][0], r["kv"][1])) is not None]
    if kv:
        print(f"\nKV tokens from config.json: {sum(1 for e in kv if abs(e) <= 0.05)} of {len(rows)} successful cases "
              f"within 5 % ({len(kv)} predicted), median |error| {100 * statistics.median(abs(e) for e in kv):.2f} %")
    if given:
        print(f"KV tokens given the logged KV memory: {sum(1 for e in given if abs(e) <= 0.005)} of "
              f"{len(given)} within 0.5 %")
    short = [r["id"] for r in rows if "headroom" in r and (r["headroom"][1] or 0) < 0]
    print(f"Headroom short given the logged CUDA graphs: {sum(1 for f in failed if f[3])} of {len(failed)} failed "
          f"cases warned; {len(short)} of {len(rows)} successful start-ups warned as well"
          + (f" ({', '.join(s[:28] for s in short)})" if short else ""))


if __name__ == "__main__":
    sys.exit(main())
