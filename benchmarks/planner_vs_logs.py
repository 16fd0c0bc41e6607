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

For every failed case it prints the planner's verdict and first reason beside vLLM's failure line.

    .venv/bin/python benchmarks/planner_vs_logs.py ../shared/anchors/llmd/truth.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from llmtrial.plan import GiB, Hardware, ServingArgs, plan
from llmtrial.shape import PlanError


def _args(case: dict[str, Any]) -> ServingArgs:
    return ServingArgs.from_config({k: v for k, v in case["args"].items() if not k.endswith("_note")})


def _error(predicted: float | None, logged: float | None) -> float | None:
    return None if predicted is None or not logged else (predicted - logged) / logged


def _pct(x: float | None) -> str:
    return "     -" if x is None else f"{100 * x:+6.1f}%"


def _one(case: dict[str, Any], config: dict[str, Any], hw: Hardware) -> dict[str, Any]:
    logged = case["logged"]
    args = _args(case)
    try:
        cold = plan(config, hw, args, vllm_version=logged.get("vllm_version"))
        given = plan(config, hw, args, available_kv_gib=logged.get("available_kv_gib_binding"),
                     vllm_version=logged.get("vllm_version"))
    except PlanError as exc:
        return {"id": case["id"], "verdict": f"error: {exc}"}
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
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("truth", type=Path, help="the data set's truth.json (configs are read relative to it)")
    ap.add_argument("--gpu-memory-gib", type=float, default=79.19,
                    help="the GPUs' memory where a case did not log it (default: an H100-80GB's 79.19)")
    opts = ap.parse_args(argv)
    data = json.loads(opts.truth.read_text())
    rows, failed = [], []
    for case in data["cases"]:
        if not case.get("config"):
            continue
        config = json.loads((opts.truth.parent / case["config"]).read_text())
        # llm-d's H100s reach each other over NVLink: vLLM's custom all-reduce runs at TP > 1
        # a run that died before logging the GPU's memory ran on the same GPUs as the others (--gpu-memory-gib)
        hw = Hardware(gpus=case["gpus"], gpu_memory_gib=case["logged"].get("total_memory_gib") or opts.gpu_memory_gib,
                      peer_access=True)
        if case["status"] == "ok":
            rows.append(_one(case, config, hw))
        else:
            try:
                p = plan(config, hw, _args(case), vllm_version=case["logged"].get("vllm_version"))
                verdict, reason = p.verdict, (p.reasons or [""])[0]
            except PlanError as exc:  # a run that died before it logged the GPU's memory
                verdict, reason = "not planned", str(exc)
            failed.append((case["id"], verdict, reason, (case.get("failure_lines") or [""])[0]))
    print(f"{'case':58} {'verdict':12} {'weights/rank GiB':>18} {'err':>7} {'KV tokens':>21} {'err':>7} "
          f"{'given':>7} {'non-torch':>11} {'activation':>11}")
    kv_errors, given_errors = [], []
    for r in rows:
        if "kv" not in r:
            print(f"{r['id'][:58]:58} {r['verdict']}")
            continue
        (pw, lw), (pk, lk), (gk, _) = r["weights"], r["kv"], r["kv_given"]
        e, g = _error(pk, lk), _error(gk, lk)
        kv_errors += [e] if e is not None else []
        given_errors += [g] if g is not None else []
        nt, act = r["non_torch"], r["activation"]
        print(f"{r['id'][:58]:58} {r['verdict']:12} {(pw or 0):8.2f}/{(lw or 0):8.2f} {_pct(_error(pw, lw))} "
              f"{(pk or 0):>10,}/{(lk or 0):>10,} {_pct(e)} {_pct(g)} "
              f"{(nt[0] or 0):5.2f}/{(nt[1] or 0):5.2f} {(act[0] or 0):5.2f}/{(act[1] or 0):5.2f}")
    print()
    for fid, verdict, reason, line in failed:
        print(f"FAILED {fid[:60]:60} planned {verdict}: {reason[:110]}\n       vLLM: {line[:140]}")
    if kv_errors:
        within = sum(1 for e in kv_errors if abs(e) <= 0.05)
        print(f"\nKV tokens from config.json: {within} of {len(rows)} successful cases within 5 % "
              f"({len(kv_errors)} predicted), median |error| {100 * statistics.median(abs(e) for e in kv_errors):.2f} %")
    if given_errors:
        print(f"KV tokens given the logged KV memory: {sum(1 for e in given_errors if abs(e) <= 0.005)} of "
              f"{len(given_errors)} within 0.5 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
