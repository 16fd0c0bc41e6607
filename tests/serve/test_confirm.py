"""The confirming relaunch's choice of knob (llmtrial.serve.confirm) and what the report says it showed
(llmtrial.report.why_failed). The relaunches themselves run with real vLLM in
tests/workflow/test_why_it_failed.py."""

from __future__ import annotations

from conftest import DATA
from llmtrial.core.configuration_model import Confirmation, ConfirmLaunch
from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.core.records import load_record
from llmtrial.report.why_failed import confirmation_text
from llmtrial.serve.confirm import candidate

RECORD = DATA / "records" / "demo-default" / "configs" / "tp1" / "record.json"
FLAG = "LLMTRIAL_DEMO_POSTLOAD_RAISE"


def spec(name: str, args: dict, env: dict, nodes: dict | None = None) -> ConfigurationSpec:
    return ConfigurationSpec(name=name, description="", host="127.0.0.1", port=18000, startup_timeout_s=60,
                             stop_timeout_s=30, args=args, env=env, nodes=nodes or {})


def test_the_other_configuration_that_differs_in_one_knob_is_the_one_relaunched_against():
    failed = spec("kv1", {"max_num_seqs": 4}, {"VLLM_CPU_KVCACHE_SPACE": "1", FLAG: "1"})
    others = {"kv2": spec("kv2", {"max_num_seqs": 8}, {"VLLM_CPU_KVCACHE_SPACE": "2", FLAG: "1"}),
              "no-flag": spec("no-flag", {"max_num_seqs": 4}, {"VLLM_CPU_KVCACHE_SPACE": "1"})}
    found = candidate(failed, others)
    assert (found.knob, found.other.name, found.value, found.instead) == (FLAG, "no-flag", "1", None)
    # two knobs apart: nothing to relaunch against
    assert candidate(others["kv2"], {"no-flag": others["no-flag"]}) is None
    # an arg that differs alone is a knob too
    assert candidate(spec("a", {"max_num_seqs": 4}, {}), {"b": spec("b", {"max_num_seqs": 8}, {})}).knob == "max_num_seqs"


def test_a_configuration_across_nodes_is_not_relaunched():
    node = {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}}
    failed = spec("x", {}, {FLAG: "1"}, nodes=node)
    assert candidate(failed, {"y": spec("y", {}, {})}) is None


def record_with(confirmation: Confirmation):
    base = load_record(RECORD, "configuration")
    return base.model_copy(update={"configuration": "kv1", "status": "failed", "confirmation": confirmation})


def test_the_report_says_what_the_relaunches_showed_and_never_more():
    both = Confirmation(knob=FLAG, against="no-flag", value="1", instead=None, removing_fixes=True,
                        adding_back_breaks=True, launches=[ConfirmLaunch(knob_set=False, log="a.log", started=True),
                                                           ConfirmLaunch(knob_set=True, log="b.log", started=False)])
    assert confirmation_text(record_with(both)) == (
        f"kv1 relaunched with {FLAG} as no-flag has it (unset): it started, so removing it fixes the crash. "
        f"Relaunched with {FLAG} again: it failed with the same signature, so adding it back breaks it.")
    first_only = both.model_copy(update={"removing_fixes": False, "adding_back_breaks": None,
                                         "launches": both.launches[:1]})
    text = confirmation_text(record_with(first_only))
    assert text.endswith(f"it did not start, so removing it does not fix the crash. Adding {FLAG} back was not tried.")
    assert "breaks it" not in text
    other = both.model_copy(update={"adding_back_breaks": False})
    assert confirmation_text(record_with(other)).endswith("so adding it back was not shown to break it.")
