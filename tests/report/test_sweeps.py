"""A sweep's steps and its onset, worked out of configuration records in the format with
sweeps (tests/synthetic.py): the step rows, the predicted against observed onset of
preemption and of waiting requests, and the sentences generated from them."""

from __future__ import annotations

import copy
import dataclasses

import synthetic
from llmtrial.core.scenario_model import OnsetComparison
from llmtrial.report.sweeps import error_words, onset_sentence, sweep_gaps, sweep_tables
from synthetic import models


def ramp():
    return sweep_tables(models("configuration", synthetic.records()))


def tp1_with(*scenarios):
    """The default trial's tp1 record with only ``scenarios``, read as its model."""
    return models("configuration", [{**synthetic.records()[0], "scenarios": list(scenarios)}])


def test_one_table_per_sweep_with_every_configurations_steps():
    tables = ramp()
    assert [t.name for t in tables] == ["ramp"] and tables[0].spec.concurrency == [1, 2, 4, 8]
    tp1, tp2 = tables[0].cells
    assert (tp1.configuration, tp2.configuration) == ("tp1", "tp2")
    assert [r.concurrency for r in tp1.rows] == [1, 2, 4, 8] and [r.step for r in tp1.rows] == [1, 2, 3, 4]
    assert [r.preemptions for r in tp1.rows] == [0, 0, 14, 51]
    assert [r.kv_peak_pct for r in tp1.rows] == [31.0, 62.0, 99.0, 100.0]
    assert [r.predicted_preempts for r in tp1.rows] == [False, False, True, True]
    row = tp1.rows[2]
    assert (row.input_len, row.output_len, row.waiting_peak, row.output_tok_s) == (192, 128, 2, 88.2)
    assert row.kv_mean_pct == 69.3 and row.tokens_needed == 4 * 3 * 128
    assert not tables[0].has_goodput and tp1.warmup_note and tp2.warmup_note is None


def test_the_onset_is_compared_step_by_step_and_said_in_words():
    tp1, tp2 = ramp()[0].cells
    assert dataclasses.asdict(tp1.onset_rows[0]) == {"what": "preemption", "key": "preemption", "predicted_step": 3,
                                    "predicted_concurrency": 4, "observed_step": 3, "observed_concurrency": 4,
                                    "error_steps": 0, "error_requests": 0}
    assert tp1.sentences[0] == ("tp1 first preempted at concurrency 4 (step 3); the planner predicted "
                                   "concurrency 4 (step 3): on the mark.")
    assert tp2.sentences[0] == ("tp2 first preempted at concurrency 8 (step 4); the planner predicted "
                                   "concurrency 4 (step 3): one step late (1 step, 4 requests).")
    assert tp2.sentences[1].startswith("tp2 first had requests waiting at concurrency 8 (step 4)")
    assert tp1.sentences[2] == ("tp1 delivers the most output tok/s at concurrency 4 (88.2 tok/s, step 3 of 4; one pass "
                                   "per step, so no interval and no verdict between steps).")


def test_no_onset_predicted_or_seen_and_one_predicted_but_never_seen():
    calm = synthetic.sweep("calm", concurrency=[1, 2], preemptions=[0, 0], kv_peak=[0.3, 0.6], waiting=[0, 0],
                           tok_s=[30.0, 55.0])
    assert sweep_tables(tp1_with(calm))[0].cells[0].sentences[:2] == [
        "tp1: no step preempted up to concurrency 2; predicted none.",
        "tp1: no step had requests waiting up to concurrency 2; predicted none."]
    cmp = OnsetComparison(predicted_step=3, predicted_concurrency=4, observed_step=None, observed_concurrency=None)
    assert onset_sentence("tp2", "preemption", cmp, 8) == (
        "tp2: no step preempted up to concurrency 8; predicted at step 3 (concurrency 4) but none observed.")
    seen = OnsetComparison(predicted_step=None, observed_step=4, observed_concurrency=8)
    assert onset_sentence("tp2", "preemption", seen, 8).endswith("the planner predicted none: not foreseen.")
    assert error_words(-2, -6) == "two steps early (2 steps, 6 requests)" and error_words(0, 0) == "on the mark"


def test_without_a_kv_cache_size_nothing_is_predicted_and_the_sentence_says_why():
    blind = synthetic.sweep("ramp", **synthetic.TP1_SWEEP, kv_tokens=None)
    cell = sweep_tables(tp1_with(blind))[0].cells[0]
    assert cell.sentences[0] == ("tp1 first preempted at concurrency 4 (step 3); nothing was predicted "
                                    "(no KV cache size in the server log).")
    assert all(r.predicted_preempts is None for r in cell.rows)


def test_a_failed_configuration_and_a_failed_step_keep_their_place():
    recs = synthetic.records()
    recs[1] = {**recs[1], "status": "failed", "scenarios": [],
               "failure": {"phase": "startup", "reason": "exited", "message": "server exited", "error_line": None}}
    recs[0] = copy.deepcopy(recs[0])
    last = recs[0]["scenarios"][2]["steps"][3]
    last.update(status="failed", figures={k: None for k in last["figures"]})
    recs = models("configuration", recs)
    tp1, tp2 = sweep_tables(recs)[0].cells
    assert tp1.status == "failed" and tp1.rows[3].status == "failed" and len(tp1.rows) == 4
    assert tp2.status == "failed" and tp2.diagnosis == "failed in startup: server exited"
    assert sweep_tables(recs)[0].outcomes == ["tp2: failed in startup: server exited."]


def test_goodput_share_per_step_where_the_sweep_has_a_target():
    recs = synthetic.records()
    for i, step in enumerate(recs[0]["scenarios"][2]["steps"]):
        step["figures"]["goodput"] = {"share": [1.0, 0.95, 0.6, 0.2][i], "met": i < 2, "request_goodput": 1.0}
    t = sweep_tables(models("configuration", recs))[0]
    assert t.has_goodput and [r.slo_share_pct for r in t.cells[0].rows] == [100.0, 95.0, 60.0, 20.0]
    assert [r.slo_met for r in t.cells[0].rows] == [True, True, False, False]


def test_what_a_sweep_did_not_give_is_said():
    blind = synthetic.sweep("ramp", **synthetic.TP1_SWEEP, kv_tokens=None)
    blind["steps"][1]["figures"]["kv_cache_usage_peak"] = None
    t = sweep_tables(tp1_with(blind))
    assert sweep_gaps(t) == ["Sweep ramp: no onset predicted for tp1 (no KV cache size in the server log).",
                             "Sweep ramp: no KV cache usage sampled for tp1 in step(s) 2."]
    assert sweep_gaps(ramp()) == []
