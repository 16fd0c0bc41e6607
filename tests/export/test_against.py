"""A trial against another tool's runs, on the default trial's real records (tests/data/records/demo-default)
and Benchmark Reports: its own exports (what another tool reading the same runs would state), variants of them
with one statement changed, and files that are not reports. Against reports of a real `vllm bench serve` run on
a real CPU server: tests/export/test_against_vllm_bench.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from llmtrial.cli import main
from llmtrial.core.records import load_record
from llmtrial.core.stats import one_run_test, ratio_test
from llmtrial.export.against import compare_against, which_test
from llmtrial.export.exports import export_trial
from llmtrial.export.reports import ReportsError, read_reports, report_measured, tool_of

DEMO = Path(__file__).parents[1] / "data" / "records" / "demo-default"
VLLM_RESULT = Path(__file__).parents[1] / "data" / "vllm-0.32.0-bench-result.json"


@pytest.fixture
def trial(tmp_path) -> Path:
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    export_trial(folder, tmp_path / "exported")
    return folder


def exported(trial: Path, name: str = "tp1", scenario: str = "c1") -> dict:
    return json.loads((trial.parent / "exported" / "benchmark-report-v0.2" / name / f"{scenario}.json").read_text())


def report_file(folder: Path, name: str, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def rows_of(record, configuration="tp1", scenario="c1"):
    return {r.figure: r for r in record.rows if (r.configuration, r.scenario) == (configuration, scenario)}


def test_one_run_against_six_passes_is_a_prediction_interval_on_logarithms():
    # three values whose logarithms are 0, 0.2 and -0.2 (mean 0, standard deviation 0.2); the lone run e^1.
    # Standard error 0.2 * sqrt(1 + 1/3), 2 degrees of freedom: t(0.975, 2) = 4.3027 (the t table).
    many = [1.0, math.exp(0.2), math.exp(-0.2)]
    test = one_run_test([math.e], many, 0.95)
    half = 4.302653 * 0.2 * math.sqrt(4 / 3)
    assert test.ratio == pytest.approx(math.e)
    assert (test.low, test.high) == (pytest.approx(math.exp(1 - half), rel=1e-4), pytest.approx(math.exp(1 + half), rel=1e-4))
    assert test.outcome == "higher" and (test.n_a, test.n_b, test.df) == (1, 3, 2.0)
    mirrored = one_run_test(many, [math.e], 0.95)  # the ratio is A over B either way
    assert mirrored.ratio == pytest.approx(1 / math.e) and mirrored.outcome == "lower"
    assert one_run_test([1.05], many, 0.95).outcome == "none"
    # two or more a side, or one a side: the plain test
    assert one_run_test([1.0, 2.0], many) == ratio_test([1.0, 2.0], many)
    assert one_run_test([1.0], [2.0]).outcome == "unstable"


def test_a_trial_against_its_own_runs_as_one_report_each_is_comparable_and_says_which_test(trial):
    record = compare_against(trial, trial.parent / "exported" / "benchmark-report-v0.2" / "tp1")
    assert record.a.kind == "trial" and record.b.kind == "benchmark report" and record.b.tool.startswith("vllm-benchmark")
    assert record.workloads_match and record.only_in_a == ["tp2/c1", "tp2/c4"] and record.only_in_b == []
    rows = rows_of(record)
    out = rows["output_tok_s"]
    assert out.against == "tp1/c1" and out.verdict == "no detectable difference"
    assert len(out.a.values) == 6 and len(out.b.values) == 1
    assert out.low < 1 < out.high and out.test == which_test(6, 1)
    assert "one run in B against 6 in A" in out.test and "trust it only as far as B's runs would vary as A's do" in out.test
    # the report's output rate is the mean of the passes' rates
    assert out.b.values == [pytest.approx(sum(out.a.values) / 6)]
    assert set(rows) == {"output_tok_s", "ttft_median_ms", "ttft_p99_ms", "tpot_median_ms", "tpot_p99_ms",
                         "itl_median_ms", "e2el_median_ms"}
    assert all(r.verdict != "not comparable" for r in record.rows)
    assert any("tp1/c1 against B's tp1/c1 (1 run(s)): no detectable difference on output tok/s" in s
               for s in record.sentences)


def test_another_output_length_is_not_comparable_and_named(trial, tmp_path):
    data = exported(trial)
    data["scenario"]["load"]["standardized"]["output_seq_len"]["value"] = 16
    data["results"]["request_performance"]["aggregate"]["requests"]["output_length"]["mean"] = 16.0
    record = compare_against(trial, report_file(tmp_path / "other", "c1-out16.json", data), configuration="tp1")
    out = rows_of(record)["output_tok_s"]
    assert out.verdict == "not comparable" and out.ratio is None
    assert out.reason == ("not comparable: output length (fixed 32 against fixed 16), output tokens served per "
                          "request (32 against 16) differ")
    assert not record.workloads_match
    assert any("no verdict" in s and "output length (fixed 32 against fixed 16)" in s for s in record.sentences)


def test_a_model_or_a_length_the_report_does_not_state_is_not_comparable(trial, tmp_path):
    data = exported(trial)
    data["scenario"]["stack"][0]["standardized"]["model"]["name"] = ""
    del data["scenario"]["load"]["standardized"]["output_seq_len"]
    record = compare_against(trial, report_file(tmp_path / "other", "unstated.json", data), configuration="tp1")
    assert rows_of(record)["ttft_median_ms"].reason == (
        "not comparable: model (not stated by B), output length (not stated by B) differ")


def test_an_unstated_accelerator_is_assumed_alike_and_said_a_differing_one_is_not_comparable(trial, tmp_path):
    data = exported(trial)
    data["scenario"]["stack"][0]["standardized"]["accelerator"]["model"] = ""
    record = compare_against(trial, report_file(tmp_path / "a", "noacc.json", data), configuration="tp1")
    assert rows_of(record)["output_tok_s"].verdict != "not comparable"
    assert "Not stated, so assumed alike: accelerator (not stated by B)." in record.sentences
    data["scenario"]["stack"][0]["standardized"]["accelerator"]["model"] = "NVIDIA H100 80GB HBM3"
    record = compare_against(trial, report_file(tmp_path / "b", "h100.json", data), configuration="tp1")
    assert "accelerator (model Intel(R) Xeon(R) Processor @ 2.80GHz, count 1 against model NVIDIA H100 80GB HBM3, " \
           "count 1)" in rows_of(record)["output_tok_s"].reason


def test_another_engine_version_is_the_change_under_test(trial, tmp_path):
    data = exported(trial)
    data["scenario"]["stack"][0]["standardized"]["tool_version"] = "0.11.0"
    record = compare_against(trial, report_file(tmp_path / "o", "old.json", data), configuration="tp1")
    assert record.changes == ["engine: vllm 0.32.0 in A, vllm 0.11.0 in B"]
    assert rows_of(record)["output_tok_s"].verdict != "not comparable"


def test_a_folder_of_runs_of_one_workload_is_tested_over_runs(trial, tmp_path):
    folder = tmp_path / "runs"
    for i, scale in enumerate((0.5, 0.52)):  # two runs at about half the trial's output rate
        data = exported(trial)
        rate = data["results"]["request_performance"]["aggregate"]["throughput"]["output_token_rate"]
        rate["mean"] *= scale
        report_file(folder, f"run{i}.json", data)
    units, converters = report_measured(folder)
    assert len(units) == 1 and units[0].sources == ("run0.json", "run1.json") and converters == []
    record = compare_against(trial, folder, configuration="tp1", scenario="c1")
    out = rows_of(record)["output_tok_s"]
    assert out.test == which_test(6, 2) and out.test.startswith("over runs, 6 in A against 2 in B")
    assert out.verdict == "slower" and out.high < 1
    assert record.only_in_a == [] and len({r.configuration for r in record.rows}) == 1


def test_a_run_at_another_concurrency_is_not_paired(trial, tmp_path):
    data = exported(trial, "tp1", "c4")
    record = compare_against(trial, report_file(tmp_path / "c4", "c4.json", data), configuration="tp1")
    assert record.only_in_a == ["tp1/c1"] and {r.scenario for r in record.rows} == {"c4"}


def test_what_is_not_a_report_is_refused_naming_the_file(tmp_path):
    assert tool_of(json.loads(VLLM_RESULT.read_text())) == "vllm-benchmark"
    assert tool_of({"benchmarks": []}) == "guidellm" and tool_of({"load_summary": {}}) == "inference-perf"
    odd = report_file(tmp_path, "odd.json", {"hello": 1})
    with pytest.raises(ReportsError, match=r"odd.json: neither a Benchmark Report nor a result file of vllm-benchmark"):
        read_reports(odd)
    old = report_file(tmp_path / "v01", "old.json", {"version": "0.1", "scenario": {}, "results": {}})
    with pytest.raises(ReportsError, match=r"old.json: a Benchmark Report of version '0.1'; only v0.2"):
        read_reports(old)
    bad = report_file(tmp_path / "bad", "bad.json", {"version": "0.2", "scenario": {}, "results": {}})
    with pytest.raises(ReportsError, match=r"bad.json: not a valid Benchmark Report v0.2"):
        read_reports(bad)
    (tmp_path / "text.yaml").write_text("[unclosed")
    with pytest.raises(ReportsError, match=r"text.yaml: cannot be read as JSON or YAML"):
        read_reports(tmp_path / "text.yaml")
    with pytest.raises(ReportsError, match="no report in it"):
        read_reports(_empty(tmp_path))
    with pytest.raises(ReportsError, match="no such file or folder"):
        read_reports(tmp_path / "missing.json")


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def test_a_vllm_result_file_is_converted_by_the_package_and_says_what_it_does_not_state(trial):
    reports, converters = read_reports(VLLM_RESULT)
    assert converters == ["vllm-benchmark"] and len(reports) == 1
    record = compare_against(trial, VLLM_RESULT)
    assert "converted by llm-d's package from vllm-benchmark result files" in record.b.tool
    assert {r.scenario for r in record.rows} == {"c4"}  # the file's max_concurrency
    assert rows_of(record, "tp1", "c4")["output_tok_s"].reason.startswith(
        "not comparable: model (not stated by B), input length (fixed 64 against other 64.8125), output length "
        "(not stated by B)")


def test_the_command_writes_the_comparison_under_the_trial_and_a_yaml_report_reads_as_json(trial, tmp_path, capsys):
    data = exported(trial)
    yaml_file = tmp_path / "yaml" / "tp1-c1.yaml"
    yaml_file.parent.mkdir()
    yaml_file.write_text(yaml.safe_dump(data))
    assert main(["compare", str(yaml_file), str(trial), "--configuration", "tp1"]) == 0
    out = capsys.readouterr().out
    assert "B demo" in out and "against A tp1-c1.yaml" in out
    record = load_record(trial / "comparison" / "tp1-c1" / "comparison.json", "comparison")
    assert record.a.kind == "benchmark report" and record.b.kind == "trial"
    page = (trial / "comparison" / "tp1-c1" / "comparison.html").read_text()
    assert "Benchmark Reports v0.2 measured by vllm-benchmark 0.32.0" in page and "test: one run in A against 6 in B" in page
    assert main(["compare", str(yaml_file), str(yaml_file)]) == 2
    assert "neither side is a trial's results folder: say where the comparison goes (--out)" in capsys.readouterr().err
    assert main(["compare", str(yaml_file), str(yaml_file), "--out", str(tmp_path / "both")]) == 0
    assert (tmp_path / "both" / "comparison.json").is_file()
    assert main(["compare", str(trial), str(tmp_path / "nothing")]) == 2
    assert "nothing: no such file or folder" in capsys.readouterr().err


def test_a_load_by_rate_with_no_limit_on_either_side_is_alike_and_another_rate_is_not_paired(trial, tmp_path):
    data = exported(trial)
    load = data["scenario"]["load"]["standardized"]
    del load["concurrency"]
    load["rate_qps"] = 2.0
    mine = compare_against(report_file(tmp_path / "a", "r2.json", data), report_file(tmp_path / "b", "r2.json", data),
                           level=0.95)
    assert mine.workloads_match and {r.scenario for r in mine.rows} == {"2 req/s"}
    assert not any(d.key == "concurrency" for d in mine.differences)
    load["rate_qps"] = 4.0
    other = compare_against(tmp_path / "a" / "r2.json", report_file(tmp_path / "c", "r4.json", data))
    assert other.rows == [] and other.only_in_a == ["tp1/2 req/s"] and other.only_in_b == ["tp1/4 req/s"]
