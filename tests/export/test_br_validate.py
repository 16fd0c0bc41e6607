"""The Benchmark Report v0.2 check (llm-d's package's models) against the published example: the example
validates, and copies of it broken the ways a writer breaks a report (a required field missing, a unit the field
does not allow, the old layout's keys, a key the schema does not name) are refused, naming the report and the
field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from llmtrial.export.br_validate import ReportInvalid, validate_report

#: llm-d's own example report (its header names the release and the file's sha256).
EXAMPLE = Path(__file__).parents[1] / "data" / "benchmark-report" / "br_v0_2_example.yaml"


@pytest.fixture
def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def refusal(data: dict) -> str:
    with pytest.raises(ReportInvalid) as exc:
        validate_report(data, source="broken.yaml")
    return str(exc.value)


def test_the_published_example_validates(example):
    report = validate_report(example)
    assert report.version == "0.2.1" and report.run.uid == example["run"]["uid"]
    assert [c.metadata.label for c in report.scenario.stack] == ["vllm-svc-0", "epp-0"]
    ttft = report.results.request_performance.aggregate.latency.time_to_first_token
    assert (ttft.units, ttft.p50) == ("s", example["results"]["request_performance"]["aggregate"]["latency"]
                                      ["time_to_first_token"]["p50"])
    # a generic component's standardized part and observability are open: their ad-hoc keys are kept
    assert report.scenario.stack[1].standardized.some_config_param == 93
    assert "vllm_kv_cache_usage_perc" in report.results.observability.model_extra


@pytest.mark.parametrize("path,field", [
    (("run", "uid"), "run.uid: Field required"),
    (("results",), "results: Field required"),
    (("scenario", "stack", 0, "metadata", "cfg_id"), "scenario.stack.0.metadata.cfg_id: Field required"),
    (("scenario", "load", "standardized", "input_seq_len"), "scenario.load.standardized.input_seq_len: Field required"),
    (("results", "request_performance", "aggregate", "requests", "total"),
     "results.request_performance.aggregate.requests.total: Field required"),
])
def test_a_missing_required_field_is_refused_by_name(example, path, field):
    parent = example
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    assert field in refusal(example)


@pytest.mark.parametrize("section,field,unit", [
    ("latency", "time_to_first_token", "s/token"),      # a latency is ms or s
    ("latency", "time_per_output_token", "ms"),          # a per-token latency is ms/token or s/token
    ("throughput", "output_token_rate", "queries/s"),   # a token rate is tokens/s
    ("throughput", "request_rate", "tokens/s"),         # a request rate is queries/s
    ("requests", "input_length", "ms"),                 # a length is a count
])
def test_a_unit_the_field_does_not_allow_is_refused_by_name(example, section, field, unit):
    example["results"]["request_performance"]["aggregate"][section][field]["units"] = unit
    message = refusal(example)
    assert f"results.request_performance.aggregate.{section}.{field}: Value error, Invalid units \"{unit}\"" in message
    assert "Benchmark Report broken.yaml does not match the v0.2 schema" in message
    # the package names the unit in the holding object; of the statistics in that unit only the one at fault is named
    assert message.count("Invalid units") == 1


def test_two_statistics_in_a_unit_their_fields_do_not_allow_are_each_named(example):
    latency = example["results"]["request_performance"]["aggregate"]["latency"]
    assert latency["inter_token_latency"]["units"] == "s/token"  # allowed there, refused for the two below
    latency["time_to_first_token"]["units"] = latency["request_latency"]["units"] = "s/token"
    lines = refusal(example).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == [
        "results.request_performance.aggregate.latency.time_to_first_token",
        "results.request_performance.aggregate.latency.request_latency"]


def test_a_unit_the_schema_does_not_know_is_refused(example):
    example["results"]["observability"]["components"][0]["aggregate"]["power_consumption"] = {"units": "J", "mean": 1}
    assert "results.observability.components.0.aggregate.power_consumption.units: Input should be" in refusal(example)


def test_the_older_layout_with_kind_under_metadata_and_requests_rate_is_refused(example):
    old = copy.deepcopy(example)
    old["scenario"]["stack"][0]["metadata"]["kind"] = old["scenario"]["stack"][0]["standardized"].pop("kind")
    message = refusal(old)
    assert "scenario.stack.0.metadata.kind: Extra inputs are not permitted" in message
    throughput = example["results"]["request_performance"]["aggregate"]["throughput"]
    throughput["requests_rate"] = throughput.pop("request_rate")
    assert ("results.request_performance.aggregate.throughput.requests_rate: Extra inputs are not permitted"
            in refusal(example))


def test_an_inference_engine_refuses_keys_it_does_not_name_and_a_bad_concurrency(example):
    example["scenario"]["stack"][0]["standardized"]["gpu_count"] = 8
    example["scenario"]["load"]["standardized"]["concurrency"] = 2.5
    message = refusal(example)
    assert "scenario.stack.0.standardized.gpu_count: Extra inputs are not permitted" in message
    assert "scenario.load.standardized: Value error, concurrency must be integer or .inf" in message


def test_a_version_outside_the_0_2_line_is_refused(example):
    example["version"] = "0.1"
    assert "version: '0.1' is not of the 0.2 line" in refusal(example)
