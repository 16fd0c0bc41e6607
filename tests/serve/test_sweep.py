"""The sweep trial (config/trials/onset-sweep-cpu.yaml) end to end with real vLLM (CPU build).

One server serves a concurrency sweep whose KV cache (vLLM's own kv_cache_memory_bytes, 1,024
tokens) is small enough that preemption starts inside the sweep, then a scenario with a
latency target, a warm-up pass and passes repeated until they agree. One session-scoped run
(tests/served_trials.py, which adds the workloads that tests/workflow/test_workloads.py reads
after these scenarios) is shared by every test here.
"""

from __future__ import annotations

import json
import re

import pytest

from llmtrial.logs.lines import read_log
from llmtrial.serve.telemetry import read_samples

pytestmark = [pytest.mark.e2e, pytest.mark.workflow, pytest.mark.aside, pytest.mark.long]  # no patch, ports of its own


def scenario(sweep, name):
    return next(s for s in sweep["record"]["scenarios"] if s["name"] == name)


def test_the_sweep_trial_runs_to_its_report(sweep):
    run = sweep["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sweep["record"]["status"] == "ok"
    assert (sweep["results"] / "report.html").exists()


def test_every_step_ran_once_on_the_same_warm_server(sweep):
    onset = scenario(sweep, "onset")
    assert onset["kind"] == "sweep" and onset["pass_results"] == []
    spec = sweep["config"]["scenarios"]["onset"]
    got = [(s["step"], s["concurrency"], s["num_prompts"]) for s in onset["steps"]]
    assert got == [(i + 1, c, n) for i, (c, n) in enumerate(zip(spec["concurrency"], spec["num_prompts"], strict=True))]
    seeds = [s["seed"] for s in onset["steps"]]
    assert len(set(seeds)) == len(seeds)
    for step in onset["steps"]:
        result = json.loads((sweep["results"] / "configs" / "tp1" / step["result_file"]).read_text())
        assert result["max_concurrency"] == step["concurrency"] and result["completed"] == step["num_prompts"]
        assert step["figures"]["failed"] == 0 and step["figures"]["output_tok_s"] > 0
        # the gauges' peaks are what the step's samples caught (None where a busy server answered none)
        peak, running = step["figures"]["kv_cache_usage_peak"], step["figures"]["running_peak"]
        assert peak is None or 0 <= peak <= 1
        assert running is None or running <= step["concurrency"]
    # a step serves for a second or two after its client starts, while the busy server may answer no scrape
    # of /metrics (one run here sampled nothing between 480.5 and 482.5 s, the whole of step 3's serving), so
    # no step's peak, nor the sweep's, is promised above 0. What one scrape says holds whenever it was taken:
    # a request running holds KV blocks, so every sample with one running shows the cache in use
    df = read_samples(sweep["results"] / "configs" / "tp1" / "telemetry.csv")
    scraped = df[(df["source"] == "metrics") & df["metric"].isin(["running", "kv_cache_usage"])].dropna(subset=["value"])
    by_scrape = scraped.pivot_table(index="t", columns="metric", values="value", aggfunc="max").dropna()
    assert (by_scrape.loc[by_scrape["running"] > 0, "kv_cache_usage"] > 0).all(), by_scrape[by_scrape["running"] > 0]
    # one server: launched once, its start-up window before the first step
    assert sweep["record"]["server"]["launched_at"] < onset["steps"][0]["window"]["start"]
    starts = [s["window"]["start"] for s in onset["steps"]]
    assert starts == sorted(starts)


def test_the_observed_preemption_onset_lies_where_the_planner_predicted(sweep):
    onset = scenario(sweep, "onset")["onset"]
    assert onset["kv_cache_tokens"] == 1024 and onset["block_size"] == 128
    log_line = int(onset["kv_cache_tokens_source"].removeprefix("server.log:"))
    server_log = read_log(sweep["results"] / "configs" / "tp1" / "server.log").split("\n")  # lines as sed numbers them
    assert "KV cache size: 1,024 tokens" in server_log[log_line - 1]  # the fact names the line it came from
    pre = onset["preemption"]
    assert pre["predicted_step"] == 3 and pre["predicted_concurrency"] == 4
    assert pre["observed_step"] is not None, "no step preempted"
    assert abs(pre["error_steps"]) <= 1
    steps = scenario(sweep, "onset")["steps"]
    # the counter is read at each step's edges (sampled on purpose as the window opens and closes), so it
    # is exact whatever the machine's speed: it moved only from the observed step on
    before, after = steps[: pre["observed_step"] - 1], steps[pre["observed_step"] - 1:]
    assert all(s["figures"]["preemptions"] == 0 for s in before)
    assert sum(s["figures"]["preemptions"] for s in after) > 0
    # the gauges are samples: a busy server may answer no scrape while it serves (one run here sampled
    # nothing during a whole step), so a step's peak is what its samples showed, whatever they caught.
    # What holds: no step before the onset shows a full cache (two requests can hold 6 of its 8 blocks),
    # each peak is the largest sample in its step's window, and the first step that waited is the first
    # whose sampled waiting gauge was above zero
    assert all(s["figures"]["kv_cache_usage_peak"] < 0.99 for s in before if s["figures"]["kv_cache_usage_peak"] is not None)
    for step in steps:
        assert step["figures"]["kv_cache_usage_peak"] == window_max(sweep, step, "kv_cache_usage")
        assert step["figures"]["waiting_peak"] == window_max(sweep, step, "waiting")
    waited = next((s["step"] for s in steps if (s["figures"]["waiting_peak"] or 0) > 0), None)
    assert onset["waiting"]["observed_step"] == waited
    assert onset["waiting"]["predicted_step"] == 3


def window_max(sweep, step, metric):
    """The largest /metrics sample of ``metric`` inside the step's window (None when none was taken)."""
    df = read_samples(sweep["results"] / "configs" / "tp1" / "telemetry.csv")
    start, end = step["window"]["start"], step["window"]["end"]
    inside = df[(df["source"] == "metrics") & (df["metric"] == metric) & (df["t"] >= start) & (df["t"] <= end)]
    inside = inside[inside["value"].notna()]
    return float(inside["value"].max()) if len(inside) else None


def test_step_preemptions_are_the_servers_own_counter_over_the_step(sweep):
    steps = scenario(sweep, "onset")["steps"]
    df = read_samples(sweep["results"] / "configs" / "tp1" / "telemetry.csv")
    counter = df[(df["source"] == "metrics") & (df["metric"] == "preemptions_total")]
    total = counter["value"].max() - counter["value"].min()
    assert sum(s["figures"]["preemptions"] for s in steps) == total > 0


def test_a_latency_target_gives_goodput_per_pass(sweep):
    slo = scenario(sweep, "slo")
    target = sweep["config"]["scenarios"]["slo"]["slo"]
    for p in slo["pass_results"]:
        g = p["summary"]["goodput"]
        assert g["targets"] == {"ttft_ms": target["ttft_ms"], "tpot_ms": target["tpot_ms"]}
        assert g["requests"] == p["summary"]["completed"]
        # vLLM's own goodput (req/s) is our count over its duration
        assert g["request_goodput"] == pytest.approx(g["requests_meeting"] / p["summary"]["duration"], rel=1e-6)
        assert g["met"] is (g["share"] >= target["percentile"] / 100)
        assert "--goodput" in p["argv"]


def test_passes_repeat_until_they_agree_and_the_warmup_is_kept_apart(sweep):
    slo = scenario(sweep, "slo")
    rep = slo["repetition"]
    rule = sweep["config"]["scenarios"]["slo"]["passes"]
    assert rule["min"] <= rep["passes_run"] == len(slo["pass_results"]) <= rule["max"]
    tok_s = [p["summary"]["output_throughput"] for p in slo["pass_results"]]
    spread = (max(tok_s) - min(tok_s)) / (sum(tok_s) / len(tok_s))
    assert rep["spread"] == pytest.approx(spread)
    if rep["stopped"] == "agreed":
        assert spread <= rule["agreement"]
        earlier = tok_s[:-1]
        assert len(earlier) < rule["min"] or (max(earlier) - min(earlier)) / (sum(earlier) / len(earlier)) > rule["agreement"]
    else:
        assert rep["stopped"] == "max_reached" and rep["passes_run"] == rule["max"] and spread > rule["agreement"]
    warm = slo["warmup"]
    assert warm["pass"] == 0 and warm["status"] == "ok"
    assert warm["seed"] not in {p["seed"] for p in slo["pass_results"]}
    assert warm["end"] <= slo["pass_results"][0]["start"]  # the warm-up ran first, then the passes
    assert slo["agreement"]["output_throughput"] == pytest.approx(spread)


def test_the_report_shows_the_sweep_beside_its_prediction(sweep):
    html = (sweep["results"] / "report.html").read_text()
    assert re.search(r"id=\"sweeps\"", html)
    assert "onset" in html and "predicted" in html
