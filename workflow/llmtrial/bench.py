"""Benchmark scenarios: vLLM's serving benchmark per pass, and the cold first request.

The load generator is vLLM's own (random dataset, ``ignore_eos``, a distinct seed per
pass, per-request detail kept). Server-side counters around each pass come from the
telemetry's /metrics series (:class:`llmtrial.sources.MetricsSource`).
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmtrial.scenarios import goodput_flags

#: Summary fields copied from vLLM's result file into the record.
SUMMARY_FIELDS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput", "max_concurrency",
)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


def agreement(values: list[float]) -> float | None:
    """Spread of a figure across passes, (max - min) / mean; None with fewer than two."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2 or statistics.fmean(vals) == 0:
        return None
    return (max(vals) - min(vals)) / statistics.fmean(vals)


def pass_seed(base: int, scenario_index: int, pass_index: int) -> int:
    """The dataset seed of one pass: distinct for every scenario and pass."""
    return base + 1000 * scenario_index + pass_index


def bench_argv(
    *,
    host: str,
    port: int,
    served_model_name: str,
    tokenizer: str,
    scenario: Mapping[str, Any],
    seed: int,
    result_dir: str,
    result_filename: str,
    percentiles: list[float],
    python: str = sys.executable,
) -> list[str]:
    """The argv of one benchmark pass (vLLM serving benchmark flags, no shell)."""
    return [
        python, "-m", "llmtrial.vllm_bench",
        "--backend", "vllm",
        "--host", host,
        "--port", str(port),
        "--endpoint", "/v1/completions",
        "--model", served_model_name,
        "--served-model-name", served_model_name,
        "--tokenizer", tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(scenario["input_len"]),
        "--random-output-len", str(scenario["output_len"]),
        "--num-prompts", str(scenario["num_prompts"]),
        "--max-concurrency", str(scenario["concurrency"]),
        "--request-rate", str(scenario["request_rate"]),
        "--ignore-eos",
        "--seed", str(seed),
        "--percentile-metrics", ",".join(LATENCY_METRICS),
        "--metric-percentiles", ",".join(_fmt_pct(p) for p in percentiles),
        "--save-result",
        "--save-detailed",
        "--result-dir", result_dir,
        "--result-filename", result_filename,
        "--disable-tqdm",
        *goodput_flags(scenario.get("slo")),
    ]


def _fmt_pct(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def summarize_result(result: Mapping[str, Any], percentiles: list[float]) -> dict[str, Any]:
    """The figures the report shows, taken from vLLM's result file as they are."""
    out: dict[str, Any] = {k: result.get(k) for k in SUMMARY_FIELDS}
    if out["failed"] is None and result.get("num_prompts") is not None and out["completed"] is not None:
        out["failed"] = result["num_prompts"] - out["completed"]
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{metric}_ms"] = result.get(f"{stat}_{metric}_ms")
        for p in percentiles:
            key = f"p{_fmt_pct(p)}_{metric}_ms"
            out[key] = result.get(key)
    out["request_output_tok_s"] = request_output_rates(result)
    out["request_output_tok_s_summary"] = rate_summary(out["request_output_tok_s"])
    return out


def request_output_rates(result: Mapping[str, Any]) -> list[float]:
    """Each successful request's own output throughput (output tokens over its latency, tok/s),
    in the order of the result file's per-request lists (``--save-detailed``). A request
    that failed (a non-empty error) or has no positive latency is left out."""
    lens, latencies = result.get("output_lens") or [], result.get("latencies") or []
    errors = result.get("errors") or [""] * len(lens)
    return [round(n / lat, 3) for n, lat, err in zip(lens, latencies, errors, strict=False)
            if not err and isinstance(lat, (int, float)) and lat > 0 and isinstance(n, (int, float))]


def rate_summary(rates: list[float]) -> dict[str, Any]:
    """``{n, min, median, max}`` of per-request rates; the figures are None when there are none."""
    if not rates:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {"n": len(rates), "min": min(rates), "median": round(statistics.median(rates), 3), "max": max(rates)}


def stall_flag(mean: float | None, median: float | None, ratio: float = 1.5) -> bool:
    """True when a mean sits far above its median: a few requests stalled."""
    if mean is None or median is None or median <= 0 or math.isnan(mean):
        return False
    return mean > ratio * median


def run_pass(argv: list[str], *, log_path: Path, timeout: float) -> dict[str, Any]:
    """Run one benchmark pass; return start/end times, exit code and whether it timed out."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logf:
        start = time.time()
        try:
            proc = subprocess.run(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout, check=False)
            rc: int | None = proc.returncode
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
        end = time.time()
    return {"start": start, "end": end, "returncode": rc, "timed_out": timed_out}


def first_request(host: str, port: int, *, model: str, prompt: str, max_tokens: int,
                  timeout: float) -> dict[str, Any]:
    """Send one streaming completion and time it: TTFT and total, in seconds, and ``chunks``,
    the streamed chunks that carried text (vLLM streams one token per chunk)."""
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
        "temperature": 0.0, "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(f"http://{host}:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    start = time.time()
    ttft = None
    chunks = 0
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            payload = json.loads(line[5:])
            text = "".join(c.get("text", "") for c in payload.get("choices", []))
            if text:
                chunks += 1
                if ttft is None:
                    ttft = time.time() - start
    return {"start": start, "ttft_s": ttft, "total_s": time.time() - start, "chunks": chunks}


def output_rate(tokens: int | None, seconds: float | None) -> float | None:
    """Tokens over seconds (tok/s, 3 decimals), or None when either is missing or seconds is not positive."""
    if tokens is None or not seconds or seconds <= 0:
        return None
    return round(tokens / seconds, 3)
