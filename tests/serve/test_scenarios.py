"""Scenarios: sweeps, repetition until passes agree, latency targets, and the predicted preemption onset."""

from __future__ import annotations

import copy
import math
import random
import statistics

import pytest

from conftest import REPO
from llmtrial.config import ConfigError, check_config, load_config, scenario_contexts, validate_config
from llmtrial.core.record_base import Fact
from llmtrial.core.scenario_model import Step
from llmtrial.core.trial_config import PassesRuleBlock, ScenarioBlock, SloBlock
from llmtrial.serve.bench import bench_argv
from llmtrial.serve.datasets import JobScenario, PassLoad
from llmtrial.serve.onset import onset, predict
from llmtrial.serve.scenarios import RepetitionRule, RequestDetail, goodput, is_sweep, steps


def _with_scenario(**spec):
    config = load_config(REPO / "config" / "config.yaml")
    config = copy.deepcopy(config)
    config["scenarios"] = {"s": spec}
    return config


@pytest.mark.parametrize(("spec", "message"), [
    ({"concurrency": []}, r"key 'scenarios\.s\.concurrency': a sweep's list is empty"),
    ({"concurrency": [1, 4, 2]}, r"key 'scenarios\.s\.concurrency': a sweep's values must increase.*\[1, 4, 2\]"),
    ({"concurrency": [1, 2], "input_len": [64, 64]}, r"key 'scenarios\.s\.input_len': a sweep's values must increase"),
    ({"concurrency": [1, 2], "output_len": [16, 32, 64]}, r"key 'scenarios\.s': a sweep's lists must have one value per step"),
    ({"num_prompts": [8, 4], "concurrency": [1, 2]}, r"key 'scenarios\.s\.num_prompts': a sweep's prompt counts must not decrease"),
    ({"slo": {"ttft_ms": 500, "p99_ms": 3}}, r"key 'scenarios\.s\.slo\.p99_ms'"),
    ({"slo": {"percentile": 99}}, r"key 'scenarios\.s\.slo': give at least one target"),
    ({"passes": {"min": 4, "max": 2, "agreement": 0.1}}, r"key 'scenarios\.s\.passes\.min': 4 is more than passes\.max \(2\)"),
    ({"concurrency": [1, 0]}, r"key 'scenarios\.s\.concurrency\.1': 0: Input should be greater than or equal to 1"),
])
def test_bad_sweeps_targets_and_repetition_are_rejected_naming_the_key(spec, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(_with_scenario(**spec), source="trial.yaml")


def test_a_sweep_is_its_steps_in_order_with_scalars_repeated():
    config = validate_config(_with_scenario(concurrency=[1, 2, 4, 8], num_prompts=16, input_len=192, output_len=128,
                                            slo={"ttft_ms": 500}))
    spec = ScenarioBlock.model_validate(config["scenarios"]["s"])
    assert is_sweep(spec) and not is_sweep(ScenarioBlock(concurrency=4))
    got = steps(spec)
    assert [(s.step, s.concurrency, s.num_prompts, s.input_len, s.output_len) for s in got] == [
        (1, 1, 16, 192, 128), (2, 2, 16, 192, 128), (3, 4, 16, 192, 128), (4, 8, 16, 192, 128)]
    assert spec.slo is not None and spec.slo.ttft_ms == 500 and spec.slo.percentile == 90
    # each step is one pass of the scenario: it builds vLLM benchmark flags, with the target as --goodput
    argv = bench_argv(host="h", port=1, served_model_name="m", tokenizer="t", scenario=JobScenario(spec), load=got[2],
                      seed=7, result_dir="d", result_filename="f.json", percentiles=[50, 99])
    assert argv[argv.index("--max-concurrency") + 1] == "4"
    assert argv[argv.index("--goodput") + 1:] == ["ttft:500"]
    lengths = check_config(_with_scenario(concurrency=4, input_len=[64, 128], output_len=[32, 64]))
    assert scenario_contexts(lengths) == [96, 192]


def test_repetition_runs_until_passes_agree_or_max():
    rule = RepetitionRule.of(PassesRuleBlock(min=2, max=4, agreement=0.1))
    assert rule.verdict([100.0], 1, False) is None
    assert rule.verdict([100.0, 125.0], 2, False) is None  # spread 0.22
    assert rule.verdict([100.0, 125.0, 104.0], 3, False) is None
    assert rule.verdict([100.0, 104.0, 102.0], 3, False) == "agreed"
    assert rule.verdict([100.0, 125.0, 110.0, 130.0], 4, False) == "max_reached"
    assert rule.verdict([100.0], 2, True) == "failed"
    fixed = RepetitionRule.of(2)
    assert (fixed.verdict([1.0], 1, True), fixed.verdict([1.0, 5.0], 2, False)) == (None, "fixed")


def log_t_width(values: list[float], t: float) -> float:
    """The width of the Student t interval of the values' logarithms, back on their scale, over their median:
    exp(m + h) - exp(m - h) with h = t x sd(logs) / sqrt n (``t`` from the table)."""
    logs = [math.log(v) for v in values]
    m, h = statistics.fmean(logs), t * statistics.stdev(logs) / math.sqrt(len(logs))
    return (math.exp(m + h) - math.exp(m - h)) / statistics.median(values)


def test_the_interval_rule_stops_on_the_width_of_the_reports_interval_over_the_median():
    # seed 000's two passes, 17.48 and 17.77 tok/s, agree within 1.65 %; their 95 % interval (t on the
    # logarithms, t(1) = 12.706) is about 21 % of the median wide: the spread rule stops there, the interval rule
    # goes on
    seed000 = [17.48, 17.77]
    spread = RepetitionRule.of(PassesRuleBlock(min=2, max=6, agreement=0.10))
    interval = RepetitionRule.of(PassesRuleBlock(min=2, max=6, agreement=None, interval=0.10))
    both = RepetitionRule.of(PassesRuleBlock(min=2, max=6, agreement=0.10, interval=0.10))
    assert interval.interval_width(seed000) == pytest.approx(log_t_width(seed000, 12.706), rel=1e-3)
    assert 0.20 < interval.interval_width(seed000) < 0.22
    assert spread.verdict(seed000, 2, False) == "agreed"
    assert interval.verdict(seed000, 2, False) is None and both.verdict(seed000, 2, False) is None
    third = [*seed000, 17.60]  # t(2) = 4.303: about 4.1 % wide
    assert interval.interval_width(third) == pytest.approx(log_t_width(third, 4.303), rel=1e-3)
    assert interval.verdict(third, 3, False) == "agreed" and both.verdict(third, 3, False) == "agreed"
    assert interval.verdict([10.0, 20.0, 12.0, 19.0, 11.0, 18.0], 6, False) == "max_reached"
    assert "their 95 % interval is within 10.0 % of the median" in interval.describe()
    assert RepetitionRule.of(PassesRuleBlock(min=2, max=6, interval=0.1), level=0.9).level == 0.9


def _outputs(n: int, seed: int) -> list:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    rnd = random.Random(seed)
    outs = []
    for i in range(n):
        ttft = rnd.uniform(0.05, 0.9)
        tokens = rnd.choice([1, 8, 32])
        lat = ttft + (tokens - 1) * rnd.uniform(0.01, 0.08)
        outs.append(RequestFuncOutput(success=i % 7 != 3, latency=lat, ttft=ttft, output_tokens=tokens, prompt_len=16,
                                      error="" if i % 7 != 3 else "boom"))
    return outs


@pytest.mark.slow
@pytest.mark.parametrize("slo", [{"ttft_ms": 400}, {"ttft_ms": 600, "tpot_ms": 50}, {"e2el_ms": 1200, "tpot_ms": 40}])
def test_goodput_counts_the_requests_vllm_counts(slo):
    """The share meeting the target agrees with vLLM's own goodput arithmetic (calculate_metrics)."""
    from vllm.benchmarks.datasets.datasets import SampleRequest
    from vllm.benchmarks.serve import calculate_metrics

    outs = _outputs(40, seed=len(slo))
    metrics, lens = calculate_metrics([SampleRequest(prompt="x", prompt_len=16)] * len(outs), outs, 10.0, None, [50],
                                      {k.removesuffix("_ms"): v for k, v in slo.items()})
    result = {"ttfts": [o.ttft for o in outs], "latencies": [o.latency for o in outs], "output_lens": lens,
              "errors": [o.error for o in outs], "request_goodput": metrics.request_goodput}
    got = goodput(RequestDetail.model_validate(result), SloBlock(**slo, percentile=90))
    assert got.requests == metrics.completed
    assert got.requests_meeting == round(metrics.request_goodput * 10.0)
    assert 0 < got.requests_meeting < got.requests
    assert got.share == got.requests_meeting / got.requests
    assert got.met is (got.share >= 0.9)


def _seed_sweep(concurrency, preemptions, context):
    """Seed 001's memory-boundary sweep (Qwen2.5-7B-AWQ, 56,192 KV tokens, 128 output tokens)."""
    return [Step.model_validate({"pass": i + 1, "seed": i, "start": 0.0, "end": 1.0, "argv": [], "log": "l",
                                 "step": i + 1, "status": "ok", "concurrency": c, "num_prompts": c,
                                 "input_len": context - 128, "output_len": 128,
                                 "figures": {"preemptions": p, "waiting_peak": None}})
            for i, (c, p) in enumerate(zip(concurrency, preemptions, strict=True))]


@pytest.mark.parametrize(("context", "concurrency", "preemptions", "step"), [
    (2048, [16, 24, 32, 48], [0, 0, 2, 2], 3),
    (4096, [8, 16, 24, 48], [0, 1, 1, 3], 2),
])
def test_the_seeds_memory_boundary_is_predicted_where_it_was_observed(context, concurrency, preemptions, step):
    """Seed 001: "preemption begins right between the two sweep points that bracket that boundary"
    (about 27 requests at 2,048 tokens, 13.7 at 4,096), with vLLM's 16-token GPU blocks."""
    got = onset(_seed_sweep(concurrency, preemptions, context),
                Fact(value=56192, kind="measured", source="seed 001: room for 56,192 tokens of KV"), 16)
    pre = got.preemption
    assert (pre.predicted_step, pre.observed_step, pre.error_steps, pre.error_requests) == (step, step, 0, 0)
    assert pre.predicted_concurrency == concurrency[step - 1]
    assert [r.tokens_needed for r in got.per_step] == [c * context for c in concurrency]
    assert got.waiting.observed_step is None  # the seed did not sample the queue
    assert got.waiting.predicted_step == step


def test_onset_rounds_to_blocks_and_says_what_it_could_not_predict():
    row = predict(PassLoad(concurrency=8, num_prompts=4, input_len=192, output_len=128, step=1), 1024, 128)
    assert (row.in_flight, row.blocks_per_request, row.blocks_needed) == (4, 3, 12)
    assert row.predicted_preempts and row.predicted_waits
    row = predict(PassLoad(concurrency=2, num_prompts=8, input_len=192, output_len=128, step=1), 1024, 128)
    assert (row.blocks_needed, row.predicted_preempts, row.predicted_waits) == (6, False, False)
    steps_ = _seed_sweep([1, 2], [0, 3], 256)
    late = onset(steps_, None, 16)
    assert late.unpredicted == "no KV cache size in the server log" and late.per_step == []
    assert (late.preemption.predicted_step, late.preemption.observed_step) == (None, 2)
