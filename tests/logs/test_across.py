"""Failures compared across configurations (llmtrial.logs.across) and the report's "Why it failed"
(llmtrial.report.why_failed), on crashes read from real vLLM logs of public issues
(tests/data/vllm-logs; each log's source is in its .yaml beside it).

Seed 002 as a trial would have recorded it: two configurations whose memory budgets differ crash on one
line while the quantized weights are repacked after loading (here: club-3090 issue 60's Marlin repack
out of memory, "RuntimeError: CUDA driver error: out of memory" in vllm/_custom_ops.py
gptq_marlin_repack, line 1279), and the configuration without the speculative-decoding flag starts.
"""

from __future__ import annotations

import pytest

from conftest import DATA
from llmtrial.core.configuration_model import ConfigurationRecord, Failure
from llmtrial.core.records import load_record
from llmtrial.logs.across import compare_failures, differing_knobs
from llmtrial.logs.lines import read_log
from llmtrial.logs.signature import signature_record
from llmtrial.report.conclusions import outcome_sentences
from llmtrial.report.why_failed import why_failed

CORPUS = DATA / "vllm-logs"
RECORD = DATA / "records" / "demo-default" / "configs" / "tp1" / "record.json"
MARLIN = "more-club3090-60-cuda-driver-oom-marlin"  # post-load processing, out of memory
CAPTURE = "mem-vllm-6746-capture-cuda-error-oom"  # graph capture, out of memory
SPEC = '{"method": "ngram", "num_speculative_tokens": 3}'
BASE = {"max_model_len": "32768", "quantization": "gptq_marlin"}


def record(name: str, knobs: dict[str, str], log: str | None = None, *, timeout: bool = False) -> ConfigurationRecord:
    """A configuration record of the default trial's, named ``name`` with ``knobs``: ok without ``log``,
    else failed with the crash that log shows (or a start-up timeout that shows none)."""
    base = load_record(RECORD, "configuration")
    if log is None and not timeout:
        return base.model_copy(update={"configuration": name, "knobs": knobs})
    source = f"logs/{log}.log" if log else "logs/server.log"
    failure = Failure(phase="startup", reason="timeout" if timeout else "exited", message="the server stopped",
                      signature=signature_record([(source, read_log(CORPUS / f"{log}.log"))]) if log else None)
    return base.model_copy(update={"configuration": name, "knobs": knobs, "status": "failed", "failure": failure})


@pytest.fixture
def seed_002() -> list[ConfigurationRecord]:
    return [
        record("util90", {**BASE, "gpu_memory_utilization": "0.9", "max_num_seqs": "8", "speculative_config": SPEC},
               MARLIN),
        record("util95", {**BASE, "gpu_memory_utilization": "0.95", "max_num_seqs": "16", "speculative_config": SPEC},
               MARLIN),
        record("no-spec", {**BASE, "gpu_memory_utilization": "0.9", "max_num_seqs": "8"}),
    ]


def test_two_configurations_with_one_signature_rule_out_every_knob_that_differs_between_them(seed_002):
    comparison = compare_failures(seed_002)
    [group] = comparison.groups
    assert group.configurations == ("util90", "util95")
    sig = group.signature
    assert (sig.exception, sig.message, sig.phase, sig.out_of_memory) == (
        "RuntimeError", "CUDA driver error: out of memory", "post_load_processing", True)
    assert (sig.frame.file, sig.frame.function, sig.frame.line) == ("vllm/_custom_ops.py", "gptq_marlin_repack", 1279)
    assert [(d.knob, dict(d.values)) for d in group.ruled_out] == [
        ("gpu_memory_utilization", {"util90": "0.9", "util95": "0.95"}),
        ("max_num_seqs", {"util90": "8", "util95": "16"})]
    assert group.ruled_out[0].text() == "gpu_memory_utilization 0.9 against 0.95"


def test_a_memory_knob_is_out_of_phase_where_vllm_does_not_read_it_in_the_crashs_phase(seed_002):
    [group] = compare_failures(seed_002).groups
    out = {o.knob: o for o in group.out_of_phase}
    # the budget knobs a reader blames for an out-of-memory error, neither read after the weights load
    assert set(out) == {"gpu_memory_utilization", "max_num_seqs", "max_model_len"}
    util = out["gpu_memory_utilization"]
    assert util.phase == "post_load_processing" and "post_load_processing" not in util.acts_in
    assert util.acts_in[0] == "device_init" and util.where.startswith("v1/worker/")
    assert util.text().startswith("gpu_memory_utilization cannot act in post-load weight processing: in vLLM it acts in "
                                  "device initialisation")


def test_the_one_knob_between_a_failure_and_a_configuration_that_ran_is_implicated(seed_002):
    comparison = compare_failures(seed_002)
    assert [(i.knob, i.failed, i.passed, i.failed_value, i.passed_value) for i in comparison.implicated] == [
        ("speculative_config", "util90", "no-spec", SPEC, None)]
    # util95 differs from no-spec in three knobs: nothing follows from that pair
    assert comparison.unsigned == ()


def test_the_same_exception_in_another_phase_is_another_group_and_a_crash_without_a_log_line_stands_apart():
    records = [
        record("a", {"gpu_memory_utilization": "0.9"}, MARLIN),
        record("b", {"gpu_memory_utilization": "0.8"}, CAPTURE),
        record("c", {"gpu_memory_utilization": "0.7"}, timeout=True),
    ]
    comparison = compare_failures(records)
    assert [(g.configurations, g.signature.phase) for g in comparison.groups] == [
        (("a",), "post_load_processing"), (("b",), "graph_capture_compile")]
    assert all(g.ruled_out == () for g in comparison.groups)  # alone in its group, nothing moved beside it
    assert comparison.unsigned == ("c",) and comparison.implicated == ()


def test_knobs_that_are_set_in_one_configuration_only_differ_from_unset():
    [d] = differing_knobs({"a": {"x": "1", "y": "2"}, "b": {"x": "1"}})
    assert (d.knob, dict(d.values)) == ("y", {"a": "2", "b": None})
    assert d.text() == "y 2 against unset"
    assert differing_knobs({"a": {"x": "1"}, "b": {"x": "1"}}) == []


def test_the_section_says_which_knobs_are_not_the_cause_and_which_is_implicated(seed_002):
    section = why_failed(seed_002)
    [group] = section.groups
    assert group.heading == "util90 and util95 fail with one signature"
    assert group.sentences[:2] == (
        "gpu_memory_utilization 0.9 against 0.95 and the crash did not move: not that knob.",
        "max_num_seqs 8 against 16 and the crash did not move: not that knob.")
    assert section.implicated == (f"speculative_config is implicated: util90 (speculative_config {SPEC}) fails and "
                                  "no-spec (speculative_config unset) ran, and the two differ in nothing else.",)
    assert section.headline == (
        "util90 and util95 fail with one signature (RuntimeError: CUDA driver error: out of memory at "
        "vllm/_custom_ops.py:gptq_marlin_repack:1279, in post-load weight processing); gpu_memory_utilization, "
        "max_num_seqs and max_model_len are not the cause; speculative_config is implicated.")


def test_a_trial_without_a_failure_has_no_section():
    assert why_failed([record("ok", {"max_num_seqs": "8"})]) is None


def test_the_record_keeps_the_log_and_line_the_signature_was_read_from():
    log = CORPUS / f"{MARLIN}.log"
    sig = signature_record([("logs/server.log", "INFO 05-05 10:00:00 nothing failed here\n"),
                            ("logs/b/rank1.log", read_log(log))])
    assert sig.source == "logs/b/rank1.log"
    assert sig.crash_line == 7  # the exception line of the excerpt, as its .yaml gives it (failure: line: 7)
    assert read_log(log).splitlines()[6].endswith("RuntimeError: CUDA driver error: out of memory")


def test_the_next_step_takes_the_implicated_knob_away_or_names_the_knobs_that_act_in_the_phase(seed_002):
    [group] = why_failed(seed_002).groups
    assert group.phase == "post-load weight processing"
    assert group.next_step.startswith("Take speculative_config away: no-spec ran without it.")
    [capture] = why_failed([record("b", {"gpu_memory_utilization": "0.8"}, CAPTURE)]).groups
    step = capture.next_step
    assert "Change a knob vLLM reads in graph capture or compilation: " in step
    named = step.split("graph capture or compilation: ")[1].rstrip(".").split(", ")
    assert {"enforce_eager", "compilation_config", "max_num_seqs"} <= set(named)
    assert "quantization" not in named  # vLLM 0.32 reads it while loading and processing the weights only


def test_a_crash_no_known_failure_explains_is_summed_up_by_its_signature(seed_002):
    [sentence] = [s for s in outcome_sentences(seed_002) if s.startswith("util90 ")]
    assert sentence == ("util90 failed in startup: RuntimeError: CUDA driver error: out of memory at "
                        "vllm/_custom_ops.py:gptq_marlin_repack:1279, in post-load weight processing "
                        f"(line 7 of logs/{MARLIN}.log; no known failure explains it).")
