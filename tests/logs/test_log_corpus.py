"""The log readers against real vLLM logs that nobody on this project wrote.

``tests/data/vllm-logs/`` holds excerpts of real vLLM logs, each copied verbatim from a public
source (an issue or pull request of vLLM or of a project that runs it) into ``<case>.log``, with
``<case>.yaml`` saying where it came from and what a careful reader takes from it: the start-up
figures (value, unit as logged, line) and, for a crash, the failure's kind and the line that
explains it. The expectations were written by reading the log, not from the parser's output.
``tests/data/vllm-logs/README.md`` describes the format and the vocabulary.

What is held: every figure the parser reads for a key the reader listed has the reader's value,
unit and line; a crash is never read as a start-up and is never given a kind other than the
reader's; and across the corpus at least 95 % of the figures and 90 % of the crashes (kind and line)
are read.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from conftest import DATA
from llmtrial.logs.failures import FAILURE_PATTERNS, diagnose_failure
from llmtrial.logs.lines import read_log
from llmtrial.logs.signature import failure_signature
from llmtrial.logs.startup_log import STARTUP_LINES, parse_startup

CORPUS = DATA / "vllm-logs"
KINDS = {p.name for p in FAILURE_PATTERNS} | {"unknown"}
KEYS = {f.key for spec in STARTUP_LINES for _, figures in spec.terms for f in figures}
#: Spellings of one unit: the parser writes seconds as "s" however the log spells them.
SAME_UNIT = {"seconds": "s", "secs": "s", "sec": "s"}


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    meta: dict[str, Any]

    @property
    def figures(self) -> list[dict[str, Any]]:
        return self.meta["figures"] or []

    @property
    def failure(self) -> dict[str, Any] | None:
        return self.meta["failure"]


def _cases() -> list[Case]:
    return [Case(p.stem, read_log(p.with_suffix(".log")), yaml.safe_load(p.read_text()))
            for p in sorted(CORPUS.glob("*.yaml"))]


CASES = _cases()
IDS = [c.name for c in CASES]


def _unit(unit: str | None) -> str | None:
    return SAME_UNIT.get(unit, unit) if unit else None


def _read(case: Case, want: dict[str, Any], facts: dict[str, Any]) -> str:
    """``"exact"``, ``"absent"`` or what differs, for one expected figure."""
    got = facts.get(want["key"])
    if got is None:
        return "absent"
    differs = []
    if got["value"] != want["value"] and not (isinstance(want["value"], float) and got["value"] == pytest.approx(want["value"])):
        differs.append(f"value {got['value']!r} != {want['value']!r}")
    if got["source"] != f"{case.name}.log:{want['line']}":
        differs.append(f"source {got['source']} != line {want['line']}")
    if want.get("unit") and _unit(got.get("unit")) != _unit(want["unit"]):
        differs.append(f"unit {got.get('unit')!r} != {want['unit']!r}")
    return "; ".join(differs) or "exact"


def _diagnosis(case: Case) -> dict[str, str] | None:
    return diagnose_failure(case.text, source=f"{case.name}.log")


# ------------------------------------------------------------------ the corpus itself


def test_the_corpus_is_large_and_varied():
    assert len(CASES) >= 40
    engines = Counter(c.meta["engine"] for c in CASES)
    assert engines["V0"] >= 10 and engines["V1"] >= 10, engines
    assert sum(1 for c in CASES if c.failure) >= 25
    assert sum(len(c.figures) for c in CASES) >= 100


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_each_case_says_where_it_came_from_and_reads_from_its_own_lines(case):
    meta = case.meta
    assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull|discussions)/\d+", meta["source"]), meta["source"]
    for key in ("where", "vllm_version", "engine", "platform", "notes"):
        assert meta.get(key), f"{case.name}: {key} missing"
    assert meta["engine"] in {"V0", "V1", "unknown"}
    lines = case.text.split("\n")
    for want in case.figures:
        assert want["key"] in KEYS, f"{case.name}: {want['key']} is not a start-up key"
        # the figure is printed on its line or the lines a terminal wrapped it onto (a reader's check)
        around = "".join(lines[want["line"] - 1:want["line"] + 4]).replace(",", "")
        assert str(want["value"]).rstrip("0").rstrip(".") in around.replace(" ", ""), (case.name, want)
    if case.failure:
        assert case.failure["kind"] in KINDS, f"{case.name}: {case.failure['kind']} is not a kind"
        assert 1 <= case.failure["line"] <= len(lines) and lines[case.failure["line"] - 1].strip()


# ------------------------------------------------------------------ what the readers make of it


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_no_figure_is_read_wrong(case):
    facts = parse_startup(case.text, source=f"{case.name}.log")
    wrong = {w["key"]: r for w in case.figures if (r := _read(case, w, facts)) not in ("exact", "absent")}
    assert not wrong, wrong


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_no_figure_is_guessed(case):
    """A figure the reader did not see in the log is not in the parser's facts either (derived ones
    say they are derived)."""
    facts = parse_startup(case.text, source=f"{case.name}.log")
    listed = {w["key"] for w in case.figures}
    extra = sorted(k for k, f in facts.items() if k not in listed and "derived" not in f)
    assert not extra, extra


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_no_crash_gets_a_wrong_kind_and_no_start_up_a_failure(case):
    d = _diagnosis(case)
    if case.failure is None:
        assert d is None or d["pattern"] == "unknown", d
        return
    assert d is not None, "a crash read as a clean start-up"
    assert d["pattern"] in (case.failure["kind"], "unknown"), (d["pattern"], d["source"], d["line"])
    if case.failure["kind"] == "unknown":
        assert d["source"] == f"{case.name}.log:{case.failure['line']}", d


def test_figures_and_crashes_read_across_the_corpus():
    figures = Counter()
    misses = []
    for case in CASES:
        facts = parse_startup(case.text, source=f"{case.name}.log")
        for want in case.figures:
            outcome = _read(case, want, facts)
            figures[outcome == "exact"] += 1
            if outcome != "exact":
                misses.append(f"{case.name}: {want['key']} {outcome}")
    crashes = Counter()
    for case in (c for c in CASES if c.failure):
        d = _diagnosis(case)
        right = d is not None and d["pattern"] == case.failure["kind"] \
            and d["source"] == f"{case.name}.log:{case.failure['line']}"
        crashes[right] += 1
        if not right:
            misses.append(f"{case.name}: {case.failure['kind']} line {case.failure['line']} read as "
                          f"{d and (d['pattern'], d['source'])}")
    assert figures[True] >= 0.95 * sum(figures.values()), misses
    assert crashes[True] >= 0.90 * sum(crashes.values()), misses


#: The third round's kinds and wordings (what the held-out logs showed the readers missing), each with the cases
#: of the corpus that show it: a crash kind with its line and, for an out-of-memory error, the phase its
#: signature names; or a start-up figure's key.
THIRD_ROUND = {
    "rpc_timeout (the message queue's bare TimeoutError)": ["timeout-mq-vllm-22479", "timeout-mq-vllm-23582",
                                                           "timeout-mq-vllm-ascend-2264", "timeout-mq-mooncake-1458",
                                                           "timeout-mq-sparkvllm-348"],
    "engine_handshake_timeout": ["timeout-handshake-vllm-32116", "timeout-handshake-vllm-ascend-3977"],
    "engine_start_failed": ["start-failed-vllm-23176", "start-failed-vllm-31940", "start-failed-gpustack-2723",
                            "start-failed-rocm-5865-gfx1151"],
    "runtime_oom in graph capture": ["oom-capture-vllm-19186-v1-backends-graph", "oom-capture-vllm-7593-v0-gemma2-capture-end",
                                     "mem-vllm-6746-capture-cuda-error-oom"],
    "weights_oom in post-load weight processing (a quantization repack)": [
        "more-club3090-60-cuda-driver-oom-marlin", "oom-postload-club3090-60-marlin-repack-timxx",
        "oom-postload-vllm-backport-34-mxfp4-marlin-repack"],
    "runtime_oom while serving (the engine's execute-model loop)": ["oom-serving-vllm-9290-v0-mq-engine-step",
                                                                    "oom-serving-vllm-13067-v0-added-request"],
    "torch_compile_seconds (\"took\")": ["fig-xpu-compile-b70cookbook-4", "fig-xpu-compile-b70cookbook-14"],
    "gpu_memory_utilization (the engine's arguments)": ["fig-args-gpumemutil-llmscaler-578",
                                                        "fig-args-gpumemutil-proxmoxved-2047",
                                                        "v1-gguf-plugin-101-compose-apiserver-banner"],
}


#: The phase an out-of-memory entry of :data:`THIRD_ROUND` is in, which the signature names where the excerpt
#: shows an exception line or a traceback (an excerpt without one shows its phase by the kind alone).
THIRD_ROUND_OOM_PHASES = {
    "runtime_oom in graph capture": "graph_capture_compile",
    "weights_oom in post-load weight processing (a quantization repack)": "post_load_processing",
    "runtime_oom while serving (the engine's execute-model loop)": "serving",
}


@pytest.mark.parametrize("what", sorted(THIRD_ROUND))
def test_the_third_rounds_kinds_and_wordings_each_read_right_on_logs_of_two_sources_or_more(what):
    cases = [next(c for c in CASES if c.name == name) for name in THIRD_ROUND[what]]
    assert len({c.meta["source"] for c in cases}) >= 2, "two threads at least"
    for case in cases:
        if case.failure:
            d = _diagnosis(case)
            assert (d["pattern"], d["source"]) == (case.failure["kind"], f"{case.name}.log:{case.failure['line']}")
            assert d["pattern"] == what.split()[0]
            if what in THIRD_ROUND_OOM_PHASES and "signature" in case.meta:
                assert case.meta["signature"]["phase"] == THIRD_ROUND_OOM_PHASES[what], case.name
                assert failure_signature(case.text).phase == THIRD_ROUND_OOM_PHASES[what], case.name
        else:
            key = what.split()[0]
            want = next(w for w in case.figures if w["key"] == key)
            assert _read(case, want, parse_startup(case.text, source=f"{case.name}.log")) == "exact"
