"""A configuration's phases as a person watching the run reads them: the start-up phases as the
server's log reaches them, ready with the KV cache line, each pass with its output tok/s and the
agreement so far, why the passes stopped, the outcome. Read from a real vLLM 0.32.0 CPU log and
the default trial's real records (tests/data)."""

from __future__ import annotations

import logging

from conftest import DATA
from llmtrial.core.configuration_model import Failure
from llmtrial.core.joblog import PROGRESS
from llmtrial.core.records import read_record
from llmtrial.core.scenario_model import Pass, Repetition
from llmtrial.logs.lines import read_log
from llmtrial.logs.startup_log import parse_startup
from llmtrial.serve.progress import StartupWatch, outcome_line, pass_line, ready_line, stopped_line
from synthetic import demo

TP2_LOG = DATA / "vllm-0.32.0-cpu-tp2-server.log"
#: Line 73 of that log, as vLLM wrote it (after its process, level, time and file prefixes).
KV_LINE = "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x"


def test_ready_quotes_the_kv_cache_line_with_its_source():
    startup = parse_startup(read_log(TP2_LOG), source="server.log")
    assert ready_line("tp2", 15.93, startup) == f"tp2: ready after 15.9 s; {KV_LINE} (server.log:73)"
    assert ready_line("tp2", 2.0, {}) == "tp2: ready after 2.0 s; no KV cache line in its log"


def test_the_watch_says_each_startup_phase_once_as_the_log_reaches_it(tmp_path, caplog):
    lines = read_log(TP2_LOG).split("\n")
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines[:60]))  # up to "Loading weights took 0.01 seconds" (line 59)
    watch = StartupWatch("tp2", log, "server.log")
    with caplog.at_level(logging.INFO, logger=PROGRESS):
        watch()
        first = [r.getMessage() for r in caplog.records]
        log.write_text("\n".join(lines))
        watch()
        watch()  # nothing new: nothing said twice
    said = [r.getMessage() for r in caplog.records]
    assert first == ["tp2: start-up: model initialised in 0.104444 s (server.log:53)",
                     "tp2: start-up: weights loaded in 0.01 s (server.log:59)"]
    assert said[2:] == ["tp2: start-up: KV cache memory available: 1.0 GiB (server.log:70)",
                        "tp2: start-up: KV cache: 1,048,576 tokens (server.log:73)",
                        "tp2: start-up: engine initialised (profiling, KV cache, warm-up) in 15.39 s (server.log:74)"]


def test_a_pass_says_its_output_rate_ttft_and_the_spread_so_far():
    tp1 = read_record(DATA / "demo" / "tp1.json")
    one, two = tp1["scenarios"][0]["pass_results"][:2]
    rates = [one["summary"]["output_throughput"], two["summary"]["output_throughput"]]
    spread = (max(rates) - min(rates)) / (sum(rates) / 2)
    assert pass_line("tp1", "c1 pass 1", Pass.model_validate(one)) == (
        f"tp1: c1 pass 1: {rates[0]:,.1f} output tok/s, median TTFT {one['summary']['median_ttft_ms']:,.1f} ms")
    assert pass_line("tp1", "c1 pass 2", Pass.model_validate(two), spread, 2).endswith(
        f"; spread over 2 passes so far {100 * spread:.1f} %")
    failed = Pass.model_validate({**two, "status": "failed", "returncode": 1, "timed_out": False})
    assert pass_line("tp1", "c1 pass 2", failed) == f"tp1: c1 pass 2 FAILED (exit 1; its log: {two['log']})"


def test_why_the_passes_stopped_is_said_in_words():
    rep = Repetition(passes_run=3, stopped="agreed", spread=0.021)
    assert stopped_line("tp1", "c4", rep) == "tp1: c4: 3 pass(es), stopped because they agreed (spread 2.1 %)"
    assert stopped_line("tp1", "c4", rep.model_copy(update={"stopped": "max_reached", "spread": None})) == (
        "tp1: c4: 3 pass(es), stopped because the maximum was reached")


def test_the_outcome_names_the_phase_of_a_failure_or_the_record():
    ok = demo("tp1", "configuration")
    assert outcome_line(ok, "configs/tp1/record.json") == (
        f"tp1: ok in {ok.timing.wall_s:.0f} s; its record: configs/tp1/record.json")
    failure = Failure(phase="startup", reason="exited", message="server exited with code 1 before it was ready")
    failed = ok.model_copy(update={"status": "failed", "failure": failure})
    assert outcome_line(failed, "configs/tp1/record.json") == (
        "tp1: FAILED in startup (exited): server exited with code 1 before it was ready (configs/tp1/record.json)")
