"""Benchmark scenarios: vLLM's serving benchmark per pass, and the cold first request.

The load generator is vLLM's own (the scenario's dataset, random unless it names another:
:mod:`llmtrial.serve.datasets`; ``ignore_eos``, a distinct seed per pass, per-request detail kept).
Server-side counters around each pass come from the telemetry's /metrics series
(:class:`llmtrial.host.telemetry_sources.MetricsSource`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtrial.core.record_base import Number
from llmtrial.core.scenario_model import PassSummary, RequestSpread
from llmtrial.serve.datasets import JobScenario, PassLoad, dataset_flags
from llmtrial.serve.scenarios import RequestDetail, goodput_flags

#: Summary fields copied from vLLM's result file into the record.
SUMMARY_FIELDS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput", "max_concurrency",
)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


def headline(summary: PassSummary | None) -> dict[str, Number | None]:
    """Output tok/s and TTFT/TPOT median and p99 of one pass, by the names the records use, from its summary
    (None where absent)."""
    s = summary or PassSummary()
    return {"output_tok_s": s.output_throughput, "ttft_median_ms": s.median_ttft_ms, "ttft_p99_ms": s.p99_ttft_ms,
            "tpot_median_ms": s.median_tpot_ms, "tpot_p99_ms": s.p99_tpot_ms}


def pass_seed(base: int, scenario_index: int, pass_index: int) -> int:
    """The dataset seed of one pass: distinct for every scenario and pass."""
    return base + 1000 * scenario_index + pass_index


def bench_argv(
    *,
    host: str,
    port: int,
    served_model_name: str,
    tokenizer: str,
    scenario: JobScenario,
    load: PassLoad,
    seed: int,
    result_dir: str,
    result_filename: str,
    percentiles: list[float],
    python: str = sys.executable,
) -> list[str]:
    """The argv of one benchmark pass (or sweep step) ``load`` of ``scenario`` (vLLM serving benchmark flags, no
    shell)."""
    return [
        python, "-m", "llmtrial.serve.vllm_bench",
        "--backend", "vllm",
        "--host", host,
        "--port", str(port),
        "--endpoint", "/v1/completions",
        "--model", served_model_name,
        "--served-model-name", served_model_name,
        "--tokenizer", tokenizer,
        *dataset_flags(scenario, load),
        "--num-prompts", str(load.num_prompts),
        "--max-concurrency", str(load.concurrency),
        "--request-rate", str(scenario.block.request_rate),
        "--ignore-eos",
        "--seed", str(seed),
        "--percentile-metrics", ",".join(LATENCY_METRICS),
        "--metric-percentiles", ",".join(_fmt_pct(p) for p in percentiles),
        "--save-result",
        "--save-detailed",
        "--result-dir", result_dir,
        "--result-filename", result_filename,
        "--disable-tqdm",
        *goodput_flags(scenario.block.slo),
    ]


def _fmt_pct(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def summarize_result(result: Mapping[str, Any], percentiles: list[float]) -> PassSummary:
    """The figures the report shows, taken from vLLM's result file (other people's data, read by key) as they
    are."""
    out = {k: result.get(k) for k in SUMMARY_FIELDS}
    detail = RequestDetail.model_validate(result)
    if out["failed"] is None and detail.num_prompts is not None and out["completed"] is not None:
        out["failed"] = detail.num_prompts - out["completed"]
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{metric}_ms"] = result.get(f"{stat}_{metric}_ms")
        for p in percentiles:
            key = f"p{_fmt_pct(p)}_{metric}_ms"
            out[key] = result.get(key)
    rates = request_output_rates(detail)
    ttft_ms, tpot_ms = request_latencies(detail)
    itl_ms, e2el_ms = request_gaps(detail)
    starts = request_starts(detail)
    return PassSummary.model_validate({**out, "request_output_tok_s": rates,
                                       "request_output_tok_s_summary": rate_summary(rates),
                                       "request_ttft_ms": ttft_ms, "request_tpot_ms": tpot_ms,
                                       **({"request_itl_ms": itl_ms} if detail.itls is not None else {}),
                                       **({"request_e2el_ms": e2el_ms} if detail.latencies is not None else {}),
                                       **({"request_start_s": starts} if starts is not None else {})})


def request_latencies(detail: RequestDetail) -> tuple[list[float], list[float]]:
    """Each successful request's TTFT (ms) and, where it has more than one output token, its TPOT
    ((latency - TTFT) / (output tokens - 1), ms: vLLM's rule), from the per-request lists."""
    ttft_ms, tpot_ms = [], []
    for ttft, lat, n, err in detail.requests():
        if err or not isinstance(ttft, (int, float)) or not n:
            continue
        ttft_ms.append(round(ttft * 1000, 3))
        if n > 1 and isinstance(lat, (int, float)):
            tpot_ms.append(round((lat - ttft) * 1000 / (n - 1), 3))
    return ttft_ms, tpot_ms


def request_starts(detail: RequestDetail) -> list[float] | None:
    """Each successful request's send time, s after the first successful request's, 3 decimals, beside
    :func:`request_latencies`' TTFT and :func:`request_gaps`' latency (the same requests); None where the file
    has no start times, or a successful request lacks its start or its latency."""
    starts = detail.start_times or []
    kept = [(starts[i] if i < len(starts) else None, lat) for i, (ttft, lat, n, err) in enumerate(detail.requests())
            if not err and isinstance(ttft, (int, float)) and n]
    if not kept or any(not isinstance(t, (int, float)) or not isinstance(lat, (int, float)) for t, lat in kept):
        return None
    first = min(t for t, _ in kept)
    return [round(t - first, 3) for t, _ in kept]


def request_gaps(detail: RequestDetail) -> tuple[list[float], list[float]]:
    """Each successful request's inter-token gaps (its ``itls``, one after another, ms) and its end-to-end
    latency (ms), 3 decimals, from the per-request lists: the samples vLLM's ITL and E2EL figures are of."""
    itl_ms, e2el_ms = [], []
    gaps = detail.itls or []
    for i, (ttft, lat, n, err) in enumerate(detail.requests()):
        if err or not isinstance(ttft, (int, float)) or not n:
            continue
        if isinstance(lat, (int, float)):
            e2el_ms.append(round(lat * 1000, 3))
        itl_ms += [round(g * 1000, 3) for g in (gaps[i] if i < len(gaps) else None) or []]
    return itl_ms, e2el_ms


def request_output_rates(detail: RequestDetail) -> list[float]:
    """Each successful request's own output throughput (output tokens over its latency, tok/s),
    in the order of the result file's per-request lists (``--save-detailed``). A request
    that failed (a non-empty error) or has no positive latency is left out."""
    lens, latencies = detail.output_lens or [], detail.latencies or []
    errors = detail.errors or [""] * len(lens)
    return [round(n / lat, 3) for n, lat, err in zip(lens, latencies, errors, strict=False)
            if not err and isinstance(lat, (int, float)) and lat > 0 and isinstance(n, (int, float))]


def rate_summary(rates: list[float]) -> RequestSpread:
    """``{n, min, median, max}`` of per-request rates; the figures are None when there are none."""
    if not rates:
        return RequestSpread(n=0, min=None, median=None, max=None)
    return RequestSpread(n=len(rates), min=min(rates), median=round(statistics.median(rates), 3), max=max(rates))


def stall_flag(mean: float | None, median: float | None, ratio: float = 1.5) -> bool:
    """True when a mean sits far above its median: a few requests stalled."""
    if mean is None or median is None or median <= 0 or math.isnan(mean):
        return False
    return mean > ratio * median


@dataclass(frozen=True)
class FirstRequest:
    """The first request's timing: its start (Unix seconds), its time to first token and total time (s; TTFT
    None when no chunk carried text) and the streamed chunks that carried text."""

    start: float
    ttft_s: float | None
    total_s: float
    chunks: int


def first_request(host: str, port: int, *, model: str, prompt: str, max_tokens: int,
                  timeout: float) -> FirstRequest:
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
    return FirstRequest(start=start, ttft_s=ttft, total_s=time.time() - start, chunks=chunks)


def output_rate(tokens: int | None, seconds: float | None) -> float | None:
    """Tokens over seconds (tok/s, 3 decimals), or None when either is missing or seconds is not positive."""
    if tokens is None or not seconds or seconds <= 0:
        return None
    return round(tokens / seconds, 3)
