"""Benchmark glue: vLLM benchmark argv, seeds, result summaries, /metrics parsing."""

from __future__ import annotations

import json

import pytest

from conftest import DATA
from llmtrial.bench import (
    bench_argv,
    first_request,
    output_rate,
    pass_seed,
    rate_summary,
    request_output_rates,
    stall_flag,
    summarize_result,
)
from llmtrial.records import check_record, read_record

SCENARIO = {"input_len": 64, "output_len": 32, "num_prompts": 12, "concurrency": 4, "request_rate": "inf"}


def argv(**kw):
    args = dict(host="127.0.0.1", port=8100, served_model_name="tiny", tokenizer="/staged/tiny",
                scenario=SCENARIO, seed=1001, result_dir="/r", result_filename="c1-pass1.json",
                percentiles=[50, 99.9], python="py")
    args.update(kw)
    return bench_argv(**args)


def value(a: list[str], flag: str) -> str:
    return a[a.index(flag) + 1]


def test_bench_argv_runs_vllm_serving_benchmark_on_random_data_with_detail():
    a = argv()
    assert a[:3] == ["py", "-m", "llmtrial.vllm_bench"]
    assert value(a, "--dataset-name") == "random"
    assert value(a, "--random-input-len") == "64" and value(a, "--random-output-len") == "32"
    assert value(a, "--max-concurrency") == "4" and value(a, "--num-prompts") == "12"
    assert value(a, "--seed") == "1001" and value(a, "--tokenizer") == "/staged/tiny"
    assert value(a, "--metric-percentiles") == "50,99.9"
    for flag in ("--ignore-eos", "--save-result", "--save-detailed"):
        assert flag in a


def test_vllm_accepts_the_bench_argv():
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    ns = parser.parse_args(argv()[3:])
    assert ns.ignore_eos and ns.save_detailed and ns.seed == 1001 and ns.max_concurrency == 4


def test_every_pass_of_every_scenario_has_its_own_seed():
    seeds = {pass_seed(1000, s, p) for s in range(5) for p in range(1, 6)}
    assert len(seeds) == 25


def test_summary_of_a_real_vllm_result_file():
    result = json.loads((DATA / "vllm-0.32.0-bench-result.json").read_text())
    s = summarize_result(result, [50, 90, 99])
    assert s["completed"] == result["completed"] and s["failed"] == result["failed"] == 0
    assert s["median_ttft_ms"] == result["median_ttft_ms"] and s["p99_itl_ms"] == result["p99_itl_ms"]
    assert s["output_throughput"] == result["output_throughput"]
    assert s["total_output_tokens"] == sum(result["output_lens"])
    assert "ttfts" not in s  # per-request arrays stay in the result file


def test_a_mean_far_above_the_median_is_a_stall():
    assert stall_flag(30.0, 10.0)
    assert not stall_flag(11.0, 10.0)
    assert not stall_flag(None, 10.0) and not stall_flag(5.0, 0.0)


def test_each_streams_own_output_throughput_from_a_real_vllm_result_file():
    result = json.loads((DATA / "vllm-0.32.0-bench-result.json").read_text())
    s = summarize_result(result, [50])
    rates = s["request_output_tok_s"]
    assert len(rates) == result["completed"] == 32
    assert rates[0] == round(result["output_lens"][0] / result["latencies"][0], 3) == 264.226
    assert rates == [round(n / t, 3) for n, t in zip(result["output_lens"], result["latencies"], strict=True)]
    summary = s["request_output_tok_s_summary"]
    assert summary == {"n": 32, "min": min(rates), "median": summary["median"], "max": max(rates)}
    assert summary["min"] <= summary["median"] <= summary["max"]
    record = read_record(DATA / "demo" / "tp1.json")
    record["scenarios"][0]["passes"][0]["summary"] = s
    check_record(record, "configuration")
    broken = json.loads(json.dumps(record))
    broken["scenarios"][0]["passes"][0]["summary"]["request_output_tok_s_summary"] = {"n": 1}
    with pytest.raises(ValueError, match="request_output_tok_s_summary"):
        check_record(broken, "configuration")


def test_failed_and_zero_latency_requests_have_no_throughput_of_their_own():
    result = {"output_lens": [128, 128, 0, 128], "latencies": [29.09, 29.29, 0.0, 29.3],
              "errors": ["", "", "timeout", "boom"]}
    assert request_output_rates(result) == [4.4, 4.37]
    assert rate_summary([4.4, 4.37, 4.37, 4.37]) == {"n": 4, "min": 4.37, "median": 4.37, "max": 4.4}
    assert rate_summary([]) == {"n": 0, "min": None, "median": None, "max": None}
    assert request_output_rates({"completed": 3}) == []  # a result file without per-request detail


def test_the_first_request_counts_the_streamed_chunks_that_carry_text(completions_server):
    host, port = completions_server
    first = first_request(host, port, model="m", prompt="Hi", max_tokens=5, timeout=10)
    assert first["chunks"] == 5 and 0 < first["ttft_s"] <= first["total_s"]
    assert output_rate(first["chunks"], first["total_s"]) == round(5 / first["total_s"], 3)
    assert output_rate(5, 0.0) is None and output_rate(None, 1.0) is None
