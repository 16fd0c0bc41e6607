"""What the report concludes, worked out of real records of the default trial (tests/data/demo,
written by a run of it) and of variants of them: rankings, medians over passes, differences
from the baseline, stability, generated sentences, cold against warm and what was not measured."""

from __future__ import annotations

import copy
import math
import statistics

import pytest

import synthetic
from conftest import DATA
from llmtrial.core.records import read_record
from llmtrial.core.scenario_model import Repetition
from llmtrial.report.conclusions import (
    FIGURES,
    Settings,
    cold_warm,
    not_measured,
    outcome_sentences,
    repetition,
    repetition_note,
    scenario_sentences,
    scenario_tables,
    streams,
)
from llmtrial.serve.scenarios import repetition_of
from synthetic import as_model, demo, models

DEMO = DATA / "demo"


def records():
    return [read_record(DEMO / "tp1.json"), read_record(DEMO / "tp2.json")]


def typed(*recs):
    """Configuration records (dicts, changed as a test needs) read as their model, as the report reads them."""
    return models("configuration", list(recs))


def tok_s(record, scenario):
    sc = next(s for s in record["scenarios"] if s["name"] == scenario)
    return [p["summary"]["output_throughput"] for p in sc["pass_results"]]


def cell(tables, scenario, name):
    return next(c for t in tables if t.name == scenario for c in t.cells if c.configuration == name)


def test_each_scenario_ranks_the_configurations_on_the_median_over_passes():
    tp1, tp2 = records()
    tables = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings())
    assert [t.name for t in tables] == ["c1", "c4"]
    for t in tables:
        medians = {c.configuration: c.figures["output_tok_s"].median for c in t.cells}
        assert medians == {"tp1": statistics.median(tok_s(tp1, t.name)), "tp2": statistics.median(tok_s(tp2, t.name))}
        assert [c.configuration for c in t.cells] == sorted(medians, key=medians.get, reverse=True)
        assert [c.rank for c in t.cells] == [1, 2]
    c4 = cell(tables, "c4", "tp2").figures["output_tok_s"]
    assert (c4.min, c4.max) == (min(tok_s(tp2, "c4")), max(tok_s(tp2, "c4")))


def test_a_figure_is_the_median_of_three_passes_not_one_pass_picked():
    tp1, tp2 = records()
    sc = tp1["scenarios"][1]
    third = copy.deepcopy(sc["pass_results"][0])
    third["pass"], third["summary"]["output_throughput"] = 3, 1.0
    sc["pass_results"].append(third)
    fig = cell(scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings()), "c4", "tp1").figures["output_tok_s"]
    assert fig.median == statistics.median(tok_s(tp1, "c4")) and fig.min == 1.0 and fig.n == 3


def test_per_accelerator_and_per_user_divide_by_tp_x_pp_and_by_concurrency():
    tp1, tp2 = records()
    c = cell(scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings()), "c4", "tp2").figures
    assert c["tok_s_per_accelerator"].median == pytest.approx(c["output_tok_s"].median / 2)
    assert c["tok_s_per_user"].median == pytest.approx(c["output_tok_s"].median / 4)


def geo_ratio(a, b):
    """The ratio of two lists' geometric means, worked out here from the pass values."""
    return math.exp(statistics.fmean(map(math.log, a)) - statistics.fmean(map(math.log, b)))


def test_each_figure_has_its_verdict_against_the_baseline_and_the_best_is_marked_where_detectable():
    tp1, tp2 = records()
    tables = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings())
    a, b = cell(tables, "c4", "tp1"), cell(tables, "c4", "tp2")
    v = b.figures["output_tok_s"].vs_baseline
    ratio = geo_ratio(tok_s(tp2, "c4"), tok_s(tp1, "c4"))  # the real run: tp2 about a seventh of tp1
    assert v.word == "slower" and v.test.ratio == pytest.approx(ratio) and v.test.low < ratio < v.test.high < 1
    assert v.as_text().startswith(f"slower, {ratio:.2f}x (95 % CI ")
    assert a.figures["output_tok_s"].vs_baseline is None  # the baseline itself
    assert a.figures["output_tok_s"].best and not b.figures["output_tok_s"].best
    assert not a.figures["output_tok_s"].tied
    flipped = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings(baseline="tp2"))
    assert cell(flipped, "c4", "tp1").figures["output_tok_s"].vs_baseline.word == "faster"
    assert cell(flipped, "c4", "tp2").figures["output_tok_s"].vs_baseline is None


def test_overlapping_passes_are_a_tie_marked_on_both_and_said_as_no_detectable_difference():
    tp1, tp2 = records()
    for rec, values in ((tp1, (400.0, 480.0, 440.0)), (tp2, (430.0, 410.0, 470.0))):
        for p, v in zip(rec["scenarios"][1]["pass_results"] + [None], values, strict=False):
            if p is not None:
                p["summary"]["output_throughput"] = v
    t = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings(max_disagreement=1.0))[1]
    figs = [c.figures["output_tok_s"] for c in t.cells]
    assert [(f.best, f.tied) for f in figs] == [(False, True), (False, True)]
    line = scenario_sentences(t)[0]
    assert "show no detectable difference in output tok/s at 95 % confidence" in line and line.endswith("a tie.")


def test_one_pass_a_side_is_unstable_and_quotes_no_interval():
    tp1, tp2 = records()
    for rec in (tp1, tp2):
        del rec["scenarios"][1]["pass_results"][1:]
    t = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings())[1]
    v = t.cells[1].figures["output_tok_s"].vs_baseline or t.cells[0].figures["output_tok_s"].vs_baseline
    assert v.word == "unstable" and v.reason == "fewer than two passes" and "no interval: fewer than two passes" in v.as_text()
    assert "is unstable, fewer than two passes" in scenario_sentences(t)[0]
    assert all(c.figures["output_tok_s"].ci is None for c in t.cells)


def test_each_figure_carries_its_interval_over_passes_and_latencies_their_interval_over_requests():
    tp1, tp2 = records()
    sc = tp1["scenarios"][1]
    for p in sc["pass_results"]:
        p["summary"]["request_ttft_ms"] = [100.0, 110.0, 120.0, 130.0, 140.0]
    fig = cell(scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings()), "c4", "tp1").figures
    vals = tok_s(tp1, "c4")
    logs = [math.log(v) for v in vals]  # positive pass values: the t interval of their logarithms, exponentiated
    half = T975[len(vals) - 1] * statistics.stdev(logs) / math.sqrt(len(vals))
    ci = fig["output_tok_s"].ci
    assert (ci.low, ci.high) == pytest.approx((math.exp(statistics.fmean(logs) - half),
                                               math.exp(statistics.fmean(logs) + half)), rel=1e-4)
    assert ci.method == "Student t on the logarithms of pass values (the geometric mean's interval)"
    assert all(f.ci is None or f.ci.low >= 0 for f in fig.values() if f is not None)  # no interval below zero
    assert fig["output_tok_s"].cv == pytest.approx(statistics.stdev(vals) / statistics.fmean(vals))
    boot = fig["ttft_median_ms"].bootstrap
    assert boot.n == 5 * len(sc["pass_results"]) and 100.0 <= boot.low <= 120.0 <= boot.high <= 140.0
    assert fig["output_tok_s"].bootstrap is None  # throughput has no per-request interval
    assert cell(scenario_tables(typed(*records()), synthetic.plans(), Settings()), "c4", "tp1").figures[
        "ttft_median_ms"].bootstrap is None  # records written before per-request latencies were kept


#: Student t's 97.5th percentile by degrees of freedom (a printed table's values).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}


def test_passes_that_disagree_more_than_the_threshold_mark_the_configuration_unstable():
    tp1, tp2 = records()
    spread = tp1["scenarios"][0]["agreement"]["output_throughput"]  # 13.2 % in the real run
    assert spread > 0.10
    loose = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings(max_disagreement=spread + 0.01))
    tight = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings(max_disagreement=0.10))
    assert cell(tight, "c1", "tp1").unstable and cell(tight, "c1", "tp1").spread == pytest.approx(spread)
    assert not cell(loose, "c1", "tp1").unstable
    assert "tp1" in tight[0].unstable
    assert f"Unstable: passes disagree on output tok/s by tp1 {100 * spread:.1f} %" in " ".join(scenario_sentences(tight[0]))


def test_sentences_are_generated_from_the_numbers_and_say_the_verdict_with_its_interval():
    tp1, tp2 = records()
    t = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings(max_disagreement=1.0))[1]
    a = statistics.median(tok_s(tp1, "c4"))
    b = statistics.median(tok_s(tp2, "c4"))
    ratio = geo_ratio(tok_s(tp1, "c4"), tok_s(tp2, "c4"))
    first = scenario_sentences(t)[0]
    assert first.startswith(f"In scenario c4 (concurrency 4), tp1 delivers {ratio:.2f}x (95 % CI ")
    assert first.endswith(f"the output tok/s of tp2 (medians {a:,.1f} against {b:,.1f} tok/s): faster at 95 % confidence.")
    ttft = {c.configuration: c.figures["ttft_median_ms"].median for c in t.cells}
    fast, slow = sorted(ttft, key=ttft.get)
    second = scenario_sentences(t)[1]
    # TTFT's ratio in this run has the interval 0.00-93555.69x: more than a factor of 100 wide, so no word on it
    assert second.startswith(f"{fast} against {slow} on time to first token is unresolved, its interval spans "
                             "more than a factor of 100 (median TTFT ")
    v = t.cells[0].figures["ttft_median_ms"].vs_baseline or t.cells[1].figures["ttft_median_ms"].vs_baseline
    assert v.word == "unresolved" and not v.decided and v.test.high / v.test.low > 100


def test_failed_and_skipped_configurations_sit_in_the_same_table_with_a_one_line_diagnosis():
    tp1, tp2 = records()
    bad = {**copy.deepcopy(tp2), "configuration": "badarg", "status": "failed", "scenarios": [],
           "failure": {"phase": "startup", "reason": "exited", "message": "server exited with code 2",
                       "error_line": {"line": "error: unrecognized arguments: --x", "source": "server.log:307",
                                      "pattern": "argparse", "diagnosis": "vLLM rejected a command-line argument."}}}
    skipped = {**copy.deepcopy(tp2), "configuration": "tp3", "status": "skipped", "scenarios": [],
               "plan": {"verdict": "does_not_fit", "reasons": ["4 heads do not divide over 3 ranks."], "forced": False}}
    tp1, tp2, bad, skipped = typed(tp1, tp2, bad, skipped)
    tables = scenario_tables([tp1, tp2, bad, skipped], synthetic.plans(), Settings())
    rows = {c.configuration: c for c in tables[0].cells}
    assert [c.configuration for c in tables[0].cells][-2:] == ["badarg", "tp3"]
    assert rows["badarg"].diagnosis == "failed in startup: vLLM rejected a command-line argument"
    assert rows["tp3"].diagnosis == "not launched: the planner said does_not_fit (4 heads do not divide over 3 ranks)"
    assert outcome_sentences([tp1, bad, skipped]) == [
        "badarg failed in startup: vLLM rejected a command-line argument.",
        "tp3 not launched: the planner said does_not_fit (4 heads do not divide over 3 ranks)."]


def test_cold_against_warm_gives_the_ratio_of_warm_c1_tok_s_to_the_first_request():
    tp1 = records()[0]
    tp1["cold_start"]["first_output_tok_s"] = {"value": 20.0, "kind": "measured", "source": "first streamed completion"}
    cw = cold_warm(as_model("configuration", tp1))
    warm = statistics.median(tok_s(tp1, "c1"))
    assert cw.warm_scenario == "c1" and cw.warm_tok_s.median == warm
    assert cw.tok_s_ratio == pytest.approx(warm / 20.0)
    first_ttft_ms = tp1["cold_start"]["first_ttft_s"]["value"] * 1000
    assert cw.ttft_ratio == pytest.approx(first_ttft_ms / cw.warm_ttft_ms.median)


def test_per_request_throughput_comes_from_concurrent_passes_only():
    tp1 = records()[0]
    for sc in tp1["scenarios"]:
        for p in sc["pass_results"]:
            p["summary"]["request_output_tok_s"] = [4.40, 4.37, 4.37, 4.37]
    got = streams(as_model("configuration", tp1))
    assert {(s.scenario, s.pass_) for s in got} == {("c4", 1), ("c4", 2)}
    assert got[0].requests == [4.40, 4.37, 4.37, 4.37] and got[0].concurrency == 4


def test_what_was_not_measured_is_read_from_the_records():
    tp1, tp2 = records()
    tp2["scenarios"][0]["pass_results"] = tp2["scenarios"][0]["pass_results"][:1]
    tables = scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings())
    lines = not_measured(preflight=demo("preflight", "preflight"), configurations=typed(tp1, tp2),
                         plans=synthetic.plans(), tables=tables)
    text = "\n".join(lines)
    assert "No GPU: NVML unavailable" in text
    assert "Telemetry source nvml: NVML unavailable: NVML Shared Library Not Found (tp1, tp2)" in text
    assert "Scenario c1: one pass only for tp2, so no agreement figure." in text
    assert "tp1: the weights' size is estimated" in text
    assert "No host probes are recorded" in text


def test_seed_000s_cold_and_warm_single_stream_give_its_4_7x():
    # seed 000: 1.86 tok/s on the first request, 8.80 tok/s once warm, "a 4.7x gain"
    tp1 = records()[0]
    tp1["cold_start"]["first_output_tok_s"] = {"value": 1.86, "kind": "measured", "source": "first streamed completion"}
    for p in tp1["scenarios"][0]["pass_results"]:
        p["summary"]["output_throughput"] = 8.80
    assert f"{cold_warm(as_model('configuration', tp1)).tok_s_ratio:.1f}" == "4.7"


# ---------------------------------------------------- sweeps left out, goodput, warm-up and repetition


def new_format():
    return typed(*synthetic.records()), synthetic.plans()


def test_sweeps_are_left_out_of_the_rankings_cold_warm_and_streams():
    recs, pl = new_format()
    tables = scenario_tables(recs, pl, Settings())
    assert [t.name for t in tables] == ["c1", "slo4"]  # "ramp" is a sweep: its spec holds lists
    assert cold_warm(recs[0]).warm_scenario == "c1"
    assert all(s.scenario != "ramp" for r in recs for s in streams(r))
    rec = synthetic.records()[0]
    bare = {**rec, "scenarios": [{k: v for k, v in rec["scenarios"][2].items() if k != "kind"}]}  # no kind: its steps tell
    assert scenario_tables(typed(bare), pl, Settings()) == []


def test_a_scenario_with_a_target_ranks_on_goodput_with_the_slo_share_over_passes():
    recs, pl = new_format()
    t = next(t for t in scenario_tables(recs, pl, Settings()) if t.name == "slo4")
    assert t.ranked_by == "goodput" and [f[0] for f in t.figures[:2]] == ["goodput", "slo_share"]
    # tp2 has the higher output tok/s, tp1 the higher goodput: goodput decides the order
    assert [c.configuration for c in t.cells] == ["tp1", "tp2"]
    tp1, tp2 = t.cells
    assert tp2.figures["output_tok_s"].median > tp1.figures["output_tok_s"].median
    g = tp1.figures["goodput"]
    assert (g.median, g.min, g.max, g.n) == (1.18, 1.10, 1.23, 3) and g.best
    share = tp2.figures["slo_share"]
    assert share.median == pytest.approx(100 * statistics.median(s for _r, s in synthetic.TP2_SLO["goodput"]))
    v = tp2.figures["goodput"].vs_baseline
    ratio = geo_ratio([g for g, _s in synthetic.TP2_SLO["goodput"]], [g for g, _s in synthetic.TP1_SLO["goodput"]])
    assert v.word == "worse" and v.test.ratio == pytest.approx(ratio) and v.test.high < 1
    assert (tp1.slo.met, tp1.slo.n, tp1.slo.percentile) == (3, 3, 90) and tp2.slo.met == 0
    lines = scenario_sentences(t)
    assert lines[0].startswith("In scenario slo4 (concurrency 4), under the target (TTFT ≤ 500 ms, TPOT ≤ 50 ms at p90), tp1 "
                               "has a better goodput than tp2 at 95 % confidence (1.18 against 0.83 req/s meeting every "
                               f"target; ratio {1 / ratio:.2f}x (95 % CI ")
    assert lines[0].endswith("); ranked by goodput.")
    assert lines[1].startswith("On output tok/s alone, tp2 delivers ") and lines[1].endswith(
        "the output tok/s of tp1 (medians 480.0 against 410.0 tok/s): faster at 95 % confidence.")
    assert lines[-1] == ("The SLO asks for at least 90 % of requests within the target: tp1 meets it in every pass "
                         "(93.0 % of requests within target); tp2 misses it in every pass (71.0 % of requests within target).")


def test_a_scenario_without_a_target_keeps_its_figures_and_order():
    recs, pl = new_format()
    c1 = scenario_tables(recs, pl, Settings())[0]
    assert c1.ranked_by == "output_tok_s" and c1.figures == FIGURES
    assert all(set(c.figures) == {f[0] for f in FIGURES} for c in c1.cells)


def test_the_warm_up_pass_is_in_no_figure_and_the_repetition_says_why_passes_stopped():
    recs, pl = new_format()
    t = next(t for t in scenario_tables(recs, pl, Settings()) if t.name == "slo4")
    tp1, tp2 = t.cells
    assert recs[0].scenarios[1].warmup.summary.output_throughput == 5.0
    assert tp1.figures["output_tok_s"].min == 400.0 and tp1.figures["output_tok_s"].n == 3
    assert tp1.passes == 3 and tp2.passes == 6
    assert tp1.repetition_note == ("3 passes: stopped once they agreed within 10.0 % (spread 4.2 %); "
                                      "a warm-up pass ran first, kept out of the figures")
    assert tp2.repetition_note.startswith("6 passes, the most allowed: they never agreed within 10.0 % (spread 14.5 %)")
    assert t.passes_asked == "2–6 passes, stopping once they agree within 10.0 %"


def test_a_scenario_under_the_interval_rule_says_the_interval_it_reached():
    rep = Repetition(min=2, max=8, agreement=None, interval=0.10, level=0.95, passes_run=4, spread=0.06,
                     interval_width=0.083, stopped="agreed")
    assert repetition_note(rep) == ("4 passes: stopped once they agreed with their 95 % interval within 10.0 % of the "
                                    "median (width 8.3 %)")
    both = rep.model_copy(update={"agreement": 0.10, "stopped": "max_reached", "passes_run": 8, "interval_width": 0.21})
    assert repetition_note(both) == ("8 passes, the most allowed: they never agreed within 10.0 % (spread 6.0 %) and with "
                                     "their 95 % interval within 10.0 % of the median (width 21.0 %)")


def test_records_without_the_new_keys_read_as_fixed_passes_without_a_warm_up():
    tp1, tp2 = records()
    assert all("kind" not in s and "repetition" not in s for s in tp1["scenarios"])
    c4 = cell(scenario_tables(typed(tp1, tp2), synthetic.plans(), Settings()), "c4", "tp1")
    assert c4.repetition.stopped == "fixed" and c4.repetition.passes_run == 2
    assert c4.repetition_note == "2 passes, a fixed count"
    tp1["scenarios"][1]["pass_results"][1]["status"] = "failed"
    assert repetition_of(typed(tp1)[0].scenarios[1]).stopped == "failed"
    assert repetition(typed(tp1)[0].scenarios[1]).stopped == "failed"
    assert repetition_note(repetition_of(typed(tp1)[0].scenarios[1])) == "2 passes: stopped when pass 2 failed"
