"""Benchmark glue: vLLM benchmark argv, seeds, result summaries, /metrics parsing."""

from __future__ import annotations

import json

from conftest import DATA
from llmtrial.bench import (
    bench_argv,
    pass_seed,
    stall_flag,
    summarize_result,
)

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
