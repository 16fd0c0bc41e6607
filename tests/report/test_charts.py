"""The report's charts: inline SVG that fetches nothing, the same bytes for the same data, ids
that do not clash between charts, and the numbers each chart draws beside it."""

from __future__ import annotations

import re
import time

import synthetic
from conftest import DATA, NvmlTelemetryDouble, wait_until
from llmtrial.core.records import read_record
from llmtrial.core.scenario_model import ScenarioSpec
from llmtrial.host.telemetry_sources import NvmlSource
from llmtrial.report.charts import (
    latency_chart,
    pareto_chart,
    pareto_front,
    prediction_chart,
    sweep_chart,
    timeseries_chart,
    windows_of,
)
from llmtrial.report.conclusions import Settings, scenario_tables
from llmtrial.report.sweeps import SweepTable, sweep_tables
from llmtrial.serve.telemetry import Sampler, read_samples
from synthetic import demo, models

DEMO = DATA / "demo"
NAMES = ["tp1", "tp2"]


def tables():
    recs = [demo(n, "configuration") for n in NAMES]
    return recs, scenario_tables(recs, synthetic.plans(), Settings())


def ids(svg: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', svg))


def test_charts_are_inline_svg_that_fetch_nothing_and_keep_text_as_text():
    recs, t = tables()
    for chart in (latency_chart(t, NAMES), pareto_chart(t, NAMES, "CPU worker"), prediction_chart(recs, NAMES)):
        assert chart.svg.startswith("<svg") and "<?xml" not in chart.svg
        assert "<script" not in chart.svg and not re.search(r'(href|src)="(https?:)?//', chart.svg)
        assert "@font-face" not in chart.svg and "<text" in chart.svg  # svg.fonttype none: text, no glyph paths
        assert chart.rows and all(len(r) == len(chart.columns) for r in chart.rows)


def test_the_same_data_draws_the_same_bytes_and_ids_differ_between_charts():
    recs, t = tables()
    assert latency_chart(t, NAMES).svg == latency_chart(t, NAMES).svg
    a, b = latency_chart(t, NAMES).svg, pareto_chart(t, NAMES, "CPU worker").svg
    assert ids(a) and not ids(a) & ids(b)
    for svg in (a, b):  # every clip path or use still finds its target
        refs = set(re.findall(r"url\(#([^)]+)\)", svg)) | set(re.findall(r'href="#([^"]+)"', svg))
        assert refs and refs <= ids(svg)


def test_the_latency_table_holds_the_medians_the_ranking_shows():
    _recs, t = tables()
    chart = latency_chart(t, NAMES)
    by = {(r[0], r[1]): r for r in chart.rows}
    for table in t:
        for c in table.cells:
            row = by[(c.configuration, table.name)]
            assert row[2] == table.spec.concurrency
            assert row[3] == c.figures["ttft_median_ms"].median and row[6] == c.figures["tpot_p99_ms"].median


def test_the_pareto_front_keeps_only_points_nothing_beats_on_both_axes():
    pts = [(1, 10), (2, 9), (3, 3), (2, 5), (0.5, 10)]
    assert pareto_front(pts) == [(1, 10), (2, 9), (3, 3)]
    _recs, t = tables()
    chart = pareto_chart(t, NAMES, "CPU worker")
    front = [(r[3], r[4]) for r in chart.rows if r[5] == "yes"]
    assert sorted(front) == pareto_front((r[3], r[4]) for r in chart.rows)


def test_predicted_against_measured_plots_every_planner_figure_the_log_reports():
    recs, _t = tables()
    chart = prediction_chart(recs, NAMES)
    expected = [(r.configuration, p.name) for r in recs for p in r.prediction if p.measured is not None]
    assert [(r[0], r[1]) for r in chart.rows] == expected


def test_a_gpu_timeline_draws_each_gpu_sampled_through_the_nvml_double(tmp_path):
    # NVML is a test double here (no GPU on this machine): two GPUs, GPU 0 at 50 % and GPU 1 at 51 %
    csv = tmp_path / "telemetry.csv"
    start = time.time()
    with Sampler(csv, [NvmlSource(NvmlTelemetryDouble())], interval=0.05) as sampler:
        wait_until(lambda: sampler.stats()["nvml"]["samples"] >= 2, "two samples of both GPUs")
        sampler.mark("c1-pass1:start")
        time.sleep(0.3)
        sampler.mark("c1-pass1:end")
    end = time.time()
    record = read_record(DEMO / "tp1.json")
    one = {**record["scenarios"][0]["pass_results"][0], "pass": 1, "window": {"start": start + 0.3, "end": end}}
    record.update(configuration="gpu", server={**record["server"], "launched_at": start, "ready_at": start + 0.25},
                  scenarios=[{**record["scenarios"][0], "name": "c1", "pass_results": [one]}])
    chart = timeseries_chart(models("configuration", [record])[0], read_samples(csv))
    assert "gpu0 utilisation %" in chart.columns and "gpu1 utilisation %" in chart.columns
    assert "gpu0 power % of limit" in chart.columns  # 300 W of a 700 W limit
    col = chart.columns.index("gpu0 power % of limit")
    assert {round(r[col], 2) for r in chart.rows if r[col] is not None} == {round(100 * 300 / 700, 2)}
    assert "GPU (NVML)" in chart.svg and "start-up 0-0 s; c1 pass 1 0-" in chart.caption


def sweep_table():
    return sweep_tables(models("configuration", synthetic.records()))[0]


def test_a_sweep_chart_draws_each_configurations_steps_and_the_predicted_onset():
    chart = sweep_chart(sweep_table(), NAMES)
    assert chart.name == "sweep-ramp" and chart.svg.startswith("<svg") and "<script" not in chart.svg
    assert not re.search(r'(href|src)="(https?:)?//', chart.svg)
    for text in ("preemptions", "KV cache usage peak (%)", "output tok/s", "tp1 predicted onset", "tp2 observed onset"):
        assert text in chart.svg, text
    by = {(r[0], r[2]): r for r in chart.rows}
    assert by[("tp1", 4)][3:] == [14, 99.0, 88.2, "yes", "yes"]  # predicted at step 3 and seen there
    assert by[("tp2", 4)][3:] == [0, 62.0, 140.2, "yes", ""]  # predicted at step 3, seen a step later
    assert by[("tp2", 8)][7] == "yes" and all(len(r) == len(chart.columns) for r in chart.rows)


def test_a_sweep_chart_is_the_same_bytes_for_the_same_data_and_its_ids_are_its_own():
    t = sweep_table()
    a = sweep_chart(t, NAMES).svg
    assert a == sweep_chart(t, NAMES).svg
    _recs, tabs = tables()
    assert ids(a) and all(i.startswith("sweep-ramp-") for i in ids(a))
    assert not ids(a) & ids(latency_chart(tabs, NAMES).svg)
    refs = set(re.findall(r"url\(#([^)]+)\)", a)) | set(re.findall(r'href="#([^"]+)"', a))
    assert refs <= ids(a)


def test_the_latency_and_pareto_charts_leave_sweeps_out():
    recs = models("configuration", synthetic.records())
    t = scenario_tables(recs, synthetic.plans(), Settings())
    assert {r[1] for r in latency_chart(t, NAMES).rows} == {"c1", "slo4"}
    assert {r[1] for r in pareto_chart(t, NAMES, "CPU worker").rows} == {"c1", "slo4"}
    assert sweep_chart(SweepTable("x", ScenarioSpec(), [], False, [], []), NAMES) is None


def test_the_timeline_shades_the_warm_up_and_each_sweep_step_too():
    tp1 = synthetic.records()[0]
    for sc in tp1["scenarios"][1:]:
        for label_run in [sc.get("warmup"), *sc["pass_results"], *sc.get("steps", [])]:
            if label_run:
                label_run["window"] = {"start": label_run["start"], "end": label_run["end"]}
    labels = [w.label for w in windows_of(models("configuration", [tp1])[0])]
    assert "slo4 warm-up" in labels and "slo4 pass 3" in labels and "ramp warm-up" in labels
    assert [x for x in labels if x.startswith("ramp step")] == ["ramp step 1", "ramp step 2", "ramp step 3", "ramp step 4"]


def test_a_sweep_over_lengths_at_one_concurrency_is_drawn_against_the_length():
    long = synthetic.sweep("long", concurrency=[4, 4, 4], preemptions=[0, 3, 20], kv_peak=[0.4, 0.9, 1.0],
                           waiting=[0, 1, 4], tok_s=[90.0, 80.0, 60.0])
    for step, n in zip(long["steps"], (128, 512, 2048), strict=True):
        step["input_len"] = n
    t = sweep_tables(models("configuration", [{**synthetic.records()[0], "scenarios": [long]}]))[0]
    chart = sweep_chart(t, NAMES)
    assert chart.columns[2] == "input len" and [r[2] for r in chart.rows] == [128, 512, 2048]
    assert "input len (one step each)" in chart.svg
