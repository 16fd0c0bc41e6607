"""A start-up split into its phases, on real logs: this project's CPU start-ups (tests/data, whole logs) and
excerpts of GPU start-ups from public threads (tests/data/vllm-logs, and one quoted here verbatim). Every
expected figure is read from the log's own stamps and lines."""

from __future__ import annotations

import pytest

from conftest import DATA
from llmtrial.logs.lines import read_log
from llmtrial.logs.startup_phases import PHASES, compile_cache, startup_phases

CORPUS = DATA / "vllm-logs"

#: https://github.com/run-ai/runai-model-streamer/issues/67 (turn 1 by cr7258): the end of a vLLM start-up on a
#: GPU, from the compile to the API server (the sampling-parameters warning's line as it stands there).
RUNAI_67 = """\
INFO 06-02 11:03:11 [backends.py:170] Compiling a graph for general shape takes 36.76 s
INFO 06-02 11:03:17 [monitor.py:33] torch.compile takes 45.81 s in total
INFO 06-02 11:03:18 [kv_cache_utils.py:637] GPU KV cache size: 1,131,008 tokens
INFO 06-02 11:03:18 [kv_cache_utils.py:640] Maximum concurrency for 131,072 tokens per request: 8.63x
INFO 06-02 11:03:55 [gpu_model_runner.py:1933] Graph capturing finished in 37 secs, took 0.45 GiB
INFO 06-02 11:03:55 [core.py:167] init engine (profile, create kv cache, warmup model) took 90.84 seconds
INFO 06-02 11:03:56 [loggers.py:134] vllm cache_config_info with initialization after num_gpu_blocks is: 70688
INFO 06-02 11:03:56 [serving_chat.py:117] Using default chat sampling params from model: {'temperature': 0.6, 'top_p': 0.95}
INFO 06-02 11:03:56 [serving_completion.py:65] Using default completion sampling params from model: {'temperature': 0.6, 'top_p': 0.95}
INFO 06-02 11:03:56 [api_server.py:1336] Starting vLLM API server on http://0.0.0.0:8000
"""


def table(phases):
    return [(p.name, p.seconds, p.source, p.logged_seconds, p.logged_source) for p in phases]


def test_a_whole_cpu_start_up_splits_at_each_milestone_its_log_stamps():
    # first stamped line 6 at 16:24:20; loading begins line 51, 16:24:35; weights loaded line 59, 16:24:35
    # ("Loading weights took 0.01 seconds"); the last worker saves its compiled model line 66, 16:24:47; KV cache
    # sized line 73, 16:24:48; the engine is ready line 74, 16:24:51; the API server serves line 82, 16:24:52.
    log = read_log(DATA / "vllm-0.32.0-cpu-tp2-server.log")
    assert table(startup_phases(log, "configs/tp2/server.log", ready_seconds=40.0)) == [
        ("before the log", 8.0, "launch to configs/tp2/server.log:6 (ready time less the log's span)", None, None),
        ("process start", 15.0, "configs/tp2/server.log:51", None, None),
        ("weights", 0.0, "configs/tp2/server.log:59", 0.01, "configs/tp2/server.log:59"),
        ("compile", 12.0, "configs/tp2/server.log:66", None, None),
        ("profiling and KV allocation", 1.0, "configs/tp2/server.log:73", None, None),
        ("engine warm-up", 3.0, "configs/tp2/server.log:74", None, None),
        ("API server start", 1.0, "configs/tp2/server.log:82", None, None),
    ]
    assert compile_cache(log) == ("compiled again: the cache could not be loaded ('function' object has no "
                                  "attribute 'finalize_loading')")
    # the launch-to-ready time shorter than the log's span (another clock): no phase before the log is made up
    assert [p.name for p in startup_phases(log, ready_seconds=10.0)][0] == "process start"


def test_the_pipeline_parallel_cpu_start_up_compiles_once_per_stage_and_the_last_save_ends_the_compile():
    # 16:50:46 (line 6) to loading at 16:51:00 (line 52), weights line 60 16:51:00, saves at 16:51:17 (line 65) and
    # 16:51:19 (line 69), KV cache line 73 16:51:19, ready line 74 16:51:20, serving line 82 16:51:21
    log = read_log(DATA / "vllm-0.32.0-cpu-pp2-3-1-server.log")
    assert [(p.name, p.seconds, p.source) for p in startup_phases(log)] == [
        ("process start", 14.0, "server.log:52"), ("weights", 0.0, "server.log:60"), ("compile", 19.0, "server.log:69"),
        ("profiling and KV allocation", 0.0, "server.log:73"), ("engine warm-up", 1.0, "server.log:74"),
        ("API server start", 1.0, "server.log:82")]
    assert compile_cache(log) == "compiled, and saved to vLLM's compile cache"


def test_a_gpu_excerpt_that_begins_mid_compile_keeps_vllms_own_compile_time_and_times_the_rest():
    assert table(startup_phases(RUNAI_67)) == [
        ("compile", None, "server.log:2", 45.81, "server.log:2"),
        ("profiling and KV allocation", 1.0, "server.log:3", None, None),
        ("graph capture", 37.0, "server.log:5", 37.0, "server.log:5"),
        ("engine warm-up", 0.0, "server.log:6", None, None),
        ("API server start", 1.0, "server.log:10", None, None),
    ]
    assert compile_cache(RUNAI_67) == "compiled, and saved to vLLM's compile cache"


@pytest.mark.parametrize(("stem", "expected", "cache"), [
    # V1: model loaded line 1 (27.200487 s), compile to line 6 11:44:16 (19.69 s logged), KV cache line 8 11:44:18
    ("pre-vllm-pr29335-v1-enginecore-dp0-kv", [("weights", None, 27.200487), ("compile", 22.0, 19.69),
                                               ("profiling and KV allocation", 2.0, None)],
     "compiled, and saved to vLLM's compile cache"),
    # V1, compiled graphs loaded from the cache (line 4), torch.compile 31.68 s in total (line 5, 08:34:23)
    ("v1-lvllm-35-a40-indented", [("weights", None, 1940.360672), ("compile", 41.0, 31.68),
                                  ("profiling and KV allocation", 2.0, None)], "loaded from vLLM's compile cache"),
    # V0 under a k9s border: compile line 1, memory profiling 34.26 s (line 2), "# cuda blocks" line 5 20:15:46
    ("pre-gie-550-k9s-border-v0-profile", [("compile", None, 28.77), ("profiling and KV allocation", 2.0, 34.26)],
     "compiled, and saved to vLLM's compile cache"),
    # V0: weights line 1 (GB only, no time), "# GPU blocks" line 2 14:16:17, graphs captured line 5 14:16:33 (14 s)
    ("v0-lmflow-942-graph-capture-secs", [("weights", None, None), ("profiling and KV allocation", 1.0, None),
                                          ("graph capture", 16.0, 14.0)], "nothing compiled (eager, or the log does not say)"),
])
def test_gpu_excerpts_from_public_threads(stem, expected, cache):
    log = read_log(CORPUS / f"{stem}.log")
    assert [(p.name, p.seconds, p.logged_seconds) for p in startup_phases(log)] == expected
    assert compile_cache(log) == cache


def test_a_log_without_stamps_has_no_phases_and_the_names_are_in_start_up_order():
    assert startup_phases("Traceback (most recent call last):\n  File x\nValueError: no\n") == []
    assert startup_phases("") == []
    assert PHASES[0] == "before the log" and PHASES[-1] == "API server start" and len(set(PHASES)) == len(PHASES)
