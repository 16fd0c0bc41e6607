"""Tests for llmtrial.logs.lines: startup facts and failure diagnosis from vLLM server logs.

The log lines are copied from real vLLM runs (several releases) and a field report.
"""

from __future__ import annotations

import re

import pytest

from conftest import DATA
from llmtrial.logs.failures import FAILURE_PATTERNS, FailurePattern, diagnose_failure
from llmtrial.logs.lines import read_log, strip_ansi, tail
from llmtrial.logs.startup_log import parse_startup

# A 0.10-era TP=4 startup, prefixes as vLLM prints them (the field report lines included).
FIELD_STARTUP = """\
INFO 08-21 18:16:50 [__init__.py:241] Automatically detected platform cuda.
(APIServer pid=380) INFO 08-21 18:16:55 [api_server.py:1805] vLLM API server version 0.10.1.1
(APIServer pid=380) INFO 08-21 18:16:55 [utils.py:326] non-default args: {'model': 'Qwen/Qwen3-32B', 'tensor_parallel_size': 4}
(APIServer pid=380) INFO 08-21 18:17:05 [__init__.py:1750] Using max model len 32768
(EngineCore pid=558) INFO 08-21 18:17:12 [core.py:636] Waiting for init message from front-end.
(Worker_TP0 pid=770) INFO 08-21 18:17:20 [default_loader.py:262] Loading weights took 46.80 seconds
(Worker_TP0 pid=770) INFO 08-21 18:18:05 [gpu_model_runner.py:5405] Model loading took 55.19 GiB memory and 48.502592 seconds
(Worker_TP1 pid=771) INFO 08-21 18:18:05 [default_loader.py:262] Loading weights took 46.95 seconds
(Worker_TP1 pid=771) INFO 08-21 18:18:06 [gpu_model_runner.py:5405] Model loading took 55.19 GiB memory and 48.61 seconds
(Worker_TP2 pid=772) INFO 08-21 18:18:06 [gpu_model_runner.py:5405] Model loading took 55.20 GiB memory and 48.70 seconds
(Worker_TP3 pid=773) INFO 08-21 18:18:07 [gpu_model_runner.py:5405] Model loading took 55.21 GiB memory and 49.01 seconds
(Worker_TP0 pid=770) INFO 08-21 18:21:40 [gpu_worker.py:276] Available KV cache memory: 75.86 GiB

(EngineCore pid=558) INFO 08-21 18:21:55 [kv_cache_utils.py:2235] GPU KV cache size: 621,392 tokens
(EngineCore pid=558) INFO 08-21 18:21:55 [kv_cache_utils.py:2236] Maximum concurrency for 32,768 tokens per request: 18.96x
(EngineCore pid=558) INFO 08-21 18:22:30 [core.py:214] init engine (profile, create kv cache, warmup model) took 265.12 seconds
(APIServer pid=380) INFO 08-21 18:22:41 [api_server.py:1880] Starting vLLM API server 0 on http://0.0.0.0:8000
"""


# ------------------------------------------------------------------ strip_ansi / tail


def test_strip_ansi_removes_colour_codes_only():
    assert strip_ansi("\x1b[32mINFO\x1b[0m 06-19 \x1b[1;31mboom\x1b[0m") == "INFO 06-19 boom"
    assert strip_ansi("\x1b]0;title\x07plain \x1b[2K") == "plain "
    assert strip_ansi("no escapes [x] (y)") == "no escapes [x] (y)"


def test_tail_last_non_empty_lines_stripped_of_ansi():
    text = "a\n\n\x1b[31mb\x1b[0m\n   \nc\n  Traceback indent kept\n\n"
    assert tail(text, 3) == ["b", "c", "  Traceback indent kept"]
    assert tail(text) == ["a", "b", "c", "  Traceback indent kept"]
    assert tail(text, 0) == []
    assert tail("") == []


def test_tail_default_is_forty_lines():
    text = "\n".join(f"line {i}" for i in range(100))
    got = tail(text)
    assert len(got) == 40
    assert got[0] == "line 60" and got[-1] == "line 99"


# ------------------------------------------------------------------ parse_startup


def test_parse_field_report_startup_values_and_sources():
    facts = parse_startup(FIELD_STARTUP, source="logs/server.log")

    load = facts["model_load_gib"]
    assert load["value"] == pytest.approx(55.19)
    assert load["unit"] == "GiB"
    assert load["kind"] == "measured"
    assert load["source"] == "logs/server.log:7"
    assert load["line"].startswith("(Worker_TP0 pid=770) INFO 08-21 18:18:05")
    assert facts["model_load_seconds"]["value"] == pytest.approx(48.502592)
    assert facts["model_load_seconds"]["unit"] == "s"
    assert facts["model_load_seconds"]["source"] == "logs/server.log:7"

    assert facts["loading_weights_seconds"]["value"] == pytest.approx(46.80)
    assert facts["loading_weights_seconds"]["source"] == "logs/server.log:6"

    assert facts["available_kv_gib"]["value"] == pytest.approx(75.86)
    assert facts["available_kv_gib"]["unit"] == "GiB"
    assert facts["available_kv_gib"]["source"] == "logs/server.log:12"

    # Line 13 is blank: numbering must still count it.
    tokens = facts["kv_cache_tokens"]
    assert tokens["value"] == 621392 and isinstance(tokens["value"], int)
    assert tokens["unit"] == "tokens"
    assert tokens["source"] == "logs/server.log:14"
    assert facts["kv_pool"]["value"] == "GPU"
    assert facts["kv_pool"]["source"] == "logs/server.log:14"
    assert "unit" not in facts["kv_pool"]

    assert facts["max_concurrency"]["value"] == pytest.approx(18.96)
    assert facts["max_concurrency"]["unit"] == "x"
    assert facts["max_concurrency"]["source"] == "logs/server.log:15"
    assert facts["max_concurrency_tokens_per_request"]["value"] == 32768
    assert facts["max_concurrency_tokens_per_request"]["source"] == "logs/server.log:15"

    assert facts["engine_init_seconds"]["value"] == pytest.approx(265.12)
    assert facts["engine_init_seconds"]["unit"] == "s"
    assert facts["engine_init_seconds"]["source"] == "logs/server.log:16"

    assert facts["max_model_len"]["value"] == 32768
    assert facts["max_model_len"]["source"] == "logs/server.log:4"
    assert facts["vllm_version"]["value"] == "0.10.1.1"
    assert facts["vllm_version"]["source"] == "logs/server.log:2"

    assert set(facts) == {
        "model_load_gib",
        "model_load_seconds",
        "loading_weights_seconds",
        "available_kv_gib",
        "kv_cache_tokens",
        "kv_pool",
        "max_concurrency",
        "max_concurrency_tokens_per_request",
        "engine_init_seconds",
        "max_model_len",
        "vllm_version",
    }


def test_per_rank_duplicates_keep_first_and_list_all():
    facts = parse_startup(FIELD_STARTUP)
    load = facts["model_load_gib"]
    assert load["value"] == pytest.approx(55.19)
    assert load["source"] == "server.log:7"
    assert load["per_rank"] == pytest.approx([55.19, 55.19, 55.20, 55.21])
    assert facts["model_load_seconds"]["per_rank"] == pytest.approx([48.502592, 48.61, 48.70, 49.01])
    assert facts["loading_weights_seconds"]["per_rank"] == pytest.approx([46.80, 46.95])
    # Facts printed once carry no per_rank.
    assert "per_rank" not in facts["kv_cache_tokens"]
    assert "per_rank" not in facts["engine_init_seconds"]


def test_line_field_is_the_stripped_log_line():
    text = "  (EngineCore pid=1) INFO 01-01 00:00:00 [core.py:1] init engine (profile, create kv cache, warmup model) took 1.5 s  \n"
    f = parse_startup(text)["engine_init_seconds"]
    assert f["line"] == (
        "(EngineCore pid=1) INFO 01-01 00:00:00 [core.py:1] "
        "init engine (profile, create kv cache, warmup model) took 1.5 s"
    )
    assert f == {
        "value": 1.5,
        "kind": "measured",
        "source": "server.log:1",
        "unit": "s",
        "line": f["line"],
    }


def test_merged_one_line_cpu_form():
    text = (
        "(EngineCore pid=123) INFO 11-29 16:00:00 [cpu_worker.py:100] Available KV cache memory: 4.00 GiB\n"
        "(EngineCore pid=123) INFO 11-29 16:00:00 [kv_cache_utils.py:1150] CPU KV cache size: 524,288 tokens, "
        "Maximum concurrency for 512 tokens per request: 1024.00x\n"
    )
    facts = parse_startup(text, source="cpu.log")
    assert facts["kv_pool"]["value"] == "CPU"
    assert facts["kv_cache_tokens"]["value"] == 524288
    assert facts["max_concurrency"]["value"] == pytest.approx(1024.0)
    assert facts["max_concurrency_tokens_per_request"]["value"] == 512
    for key in ("kv_pool", "kv_cache_tokens", "max_concurrency", "max_concurrency_tokens_per_request"):
        assert facts[key]["source"] == "cpu.log:2", key
    assert facts["available_kv_gib"]["source"] == "cpu.log:1"


def test_older_release_wording_and_prefix():
    # 0.6-0.8 style: level-first prefix, "GiB and" without "memory".
    text = (
        "INFO 06-19 23:04:10 [__init__.py:239] Automatically detected platform cuda.\n"
        "INFO 06-19 23:04:40 [loader.py:458] Loading weights took 30.88 seconds\n"
        "INFO 06-19 23:04:41 [gpu_model_runner.py:1347] Model loading took 14.9934 GiB and 31.456 seconds\n"
        "INFO 06-19 23:05:01 [kv_cache_utils.py:634] GPU KV cache size: 1,071,264 tokens\n"
        "INFO 06-19 23:05:01 [kv_cache_utils.py:637] Maximum concurrency for 32,768 tokens per request: 32.69x\n"
        "INFO 06-19 23:05:30 [core.py:159] init engine (profile, create kv cache, warmup model) took 48.77 seconds\n"
    )
    facts = parse_startup(text)
    assert facts["model_load_gib"]["value"] == pytest.approx(14.9934)
    assert facts["model_load_seconds"]["value"] == pytest.approx(31.456)
    assert facts["model_load_gib"]["source"] == "server.log:3"
    assert facts["loading_weights_seconds"]["value"] == pytest.approx(30.88)
    assert facts["kv_cache_tokens"]["value"] == 1071264
    assert facts["kv_cache_tokens"]["source"] == "server.log:4"
    assert facts["max_concurrency"]["value"] == pytest.approx(32.69)
    assert facts["max_concurrency"]["source"] == "server.log:5"
    assert facts["engine_init_seconds"]["value"] == pytest.approx(48.77)
    assert "vllm_version" not in facts and "max_model_len" not in facts


def test_message_without_any_prefix():
    facts = parse_startup("Model loading took 7.5 GiB memory and 2 seconds\n")
    assert facts["model_load_gib"]["value"] == pytest.approx(7.5)
    assert facts["model_load_seconds"]["value"] == pytest.approx(2.0)
    assert facts["model_load_gib"]["line"] == "Model loading took 7.5 GiB memory and 2 seconds"


@pytest.mark.parametrize(
    ("tail_text", "seconds"),
    [
        ("took 12.34 s", 12.34),
        ("took 12.34 seconds", 12.34),
        ("took 3.10 s (compilation: 1.20 s)", 3.10),
    ],
)
def test_init_engine_variants(tail_text, seconds):
    text = "noise\n(EngineCore pid=9) INFO 10-01 12:00:00 [core.py:250] init engine (profile, create kv cache, warmup model) " + tail_text
    f = parse_startup(text)["engine_init_seconds"]
    assert f["value"] == pytest.approx(seconds)
    assert f["source"] == "server.log:2"


def test_ansi_coloured_lines():
    text = (
        "\x1b[32mINFO\x1b[0m 06-19 23:05:01 [gpu_worker.py:227] Available KV cache memory: 27.85 GiB\n"
        "\x1b[1;36m(EngineCore pid=558)\x1b[0;0m \x1b[32mINFO\x1b[0m 06-19 23:05:01 [kv_cache_utils.py:716] "
        "GPU KV cache size: 228,112 tokens\n"
    )
    facts = parse_startup(text)
    assert facts["available_kv_gib"]["value"] == pytest.approx(27.85)
    assert facts["available_kv_gib"]["line"] == (
        "INFO 06-19 23:05:01 [gpu_worker.py:227] Available KV cache memory: 27.85 GiB"
    )
    assert facts["kv_cache_tokens"]["value"] == 228112
    assert facts["kv_cache_tokens"]["source"] == "server.log:2"
    assert "\x1b" not in facts["kv_cache_tokens"]["line"]


def test_pool_with_host_offload_and_negative_available_kv():
    text = (
        "(Worker pid=5) INFO 09-09 09:09:09 [gpu_worker.py:300] Available KV cache memory: -1.25 GiB\n"
        "(EngineCore pid=4) INFO 09-09 09:09:10 [kv_cache_utils.py:900] GPU + host KV cache size: 2,000,000 tokens\n"
    )
    facts = parse_startup(text)
    assert facts["available_kv_gib"]["value"] == pytest.approx(-1.25)
    assert facts["kv_pool"]["value"] == "GPU + host"
    assert facts["kv_cache_tokens"]["value"] == 2000000


def test_carriage_return_progress_bars_do_not_shift_line_numbers():
    text = (
        "Loading safetensors checkpoint shards:   0% Completed | 0/4\r"
        "Loading safetensors checkpoint shards: 100% Completed | 4/4\r\n"
        "INFO 06-19 23:04:41 [gpu_model_runner.py:1347] Model loading took 14.99 GiB and 31.4 seconds\r\n"
    )
    f = parse_startup(text)["model_load_gib"]
    assert f["source"] == "server.log:2"
    assert f["line"].endswith("31.4 seconds")
    assert tail(text) == [
        "Loading safetensors checkpoint shards: 100% Completed | 4/4",
        "INFO 06-19 23:04:41 [gpu_model_runner.py:1347] Model loading took 14.99 GiB and 31.4 seconds",
    ]


def test_nothing_relevant():
    text = (
        "INFO 08-21 18:16:50 [__init__.py:241] Automatically detected platform cuda.\n"
        "(APIServer pid=380) INFO 08-21 18:22:41 [launcher.py:29] Available routes are:\n"
        "(APIServer pid=380) INFO:     Started server process [380]\n"
        "the kv cache size: 12 tokens\n"  # lowercase: not vLLM's message
    )
    assert parse_startup(text) == {}
    assert diagnose_failure(text) is None
    assert parse_startup("") == {}
    assert diagnose_failure("") is None


def test_healthy_startup_has_no_diagnosis():
    assert diagnose_failure(FIELD_STARTUP) is None


# ------------------------------------------------------------------ diagnose_failure


#: Whole logs, each diagnosed at one line: (log, pattern, line number, the line, a word of the advice).
#: Each line and number is read from the log as written here; None where the case is about another part.
DIAGNOSED = [
    pytest.param(
        "(APIServer pid=1) INFO 08-21 18:00:00 [utils.py:326] non-default args: {'tensor_parallel_size': 3}\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/bin/vllm", line 10, in <module>\n'
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
        "  Value error, Total number of attention heads (64) must be divisible by tensor\n"
        "  parallel size (3). [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n",
        # a terminal's wrap is rejoined without a separator (it may fall inside a word), up to the next exception
        "tp_divisibility", 5, "Value error, Total number of attention heads (64) must be divisible by tensor"
        "parallel size (3). [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]",
        "tensor_parallel_size", id="tp-divisibility-wrapped-over-two-lines-beats-later-exceptions"),
    pytest.param("ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).\n",
                 "tp_divisibility", 1,
                 "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).", None,
                 id="tp-divisibility-on-one-line"),
    pytest.param(
        "(Worker_TP0 pid=770) INFO 08-21 18:17:20 [gpu_model_runner.py:2007] Starting to load model\n"
        "(Worker_TP0 pid=770) ERROR [gpu_model_runner.py:5403] Failed to load model - not enough GPU memory.\n"
        "(Worker_TP0 pid=770) ERROR 08-21 18:17:30 [multiproc_executor.py:585] WorkerProc failed to start.\n"
        "(EngineCore pid=558) ERROR 08-21 18:17:31 [core.py:700] RuntimeError: Worker failed with error 'x'\n",
        "weights_oom", 2, "(Worker_TP0 pid=770) ERROR [gpu_model_runner.py:5403] Failed to load model - not enough GPU memory.",
        None, id="weights-oom-field-line-beats-the-generic-exception-after-it"),
    pytest.param(
        "(EngineCore pid=1) ERROR 01-01 00:00:00 [core.py:1] ValueError: No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine.\n"
        "(Worker pid=2) ERROR 01-01 00:00:01 [w.py:1] torch.OutOfMemoryError: CUDA out of memory.\n",
        "oom", 2, None, None, id="an-oom-beats-no-kv-memory-and-its-phase-is-not-guessed"),
    pytest.param("ValueError: error: something odd\n", "unknown", 1, None, None,
                 id="an-exception-containing-the-word-error-is-not-argparse"),
    pytest.param(
        "(Worker_TP0 pid=770) INFO 08-21 18:19:00 [deep_gemm.py:1] warming up DeepGEMM\n"
        "RuntimeError: Assertion error (/workspace/.deps/deepgemm-src/csrc/apis/layout.hpp:60):\n"
        "Unknown SF transformation\n",
        "deepgemm", 3, "Unknown SF transformation", "VLLM_USE_DEEP_GEMM=0", id="deepgemm-field-report"),
    pytest.param(
        "(EngineCore pid=558) INFO 08-21 18:30:00 [shm_broadcast.py:466] No available shared memory broadcast block "
        "found in 60 second.\n"
        "(Worker_TP1 pid=771) ERROR 08-21 18:30:05 [w.py:1] torch.OutOfMemoryError: CUDA out of memory.\n",
        "oom", 2, None, None, id="shm-broadcast-is-the-weakest-known-pattern"),
    pytest.param(
        "(Worker_TP0 pid=1) ERROR [gpu_model_runner.py:5403] Failed to load model - not enough GPU memory.\n"
        "(Worker_TP1 pid=2) ERROR [gpu_model_runner.py:5403] Failed to load model - not enough GPU memory.\n",
        "weights_oom", 1, None, None, id="the-first-occurrence-of-a-pattern-wins"),
    pytest.param(
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] EngineCore failed to start.\n"
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] Traceback (most recent call last):\n"
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] KeyError: 'model.layers.0.mlp.gate'\n"
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] huggingface_hub.errors.HFValidationError: bad repo id\n"
        "(APIServer pid=380) INFO 08-21 18:20:01 [api_server.py:1] shutting down\n",
        "unknown", 4,
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] huggingface_hub.errors.HFValidationError: bad repo id",
        None, id="generic-the-last-exception-after-the-log-prefix"),
    pytest.param(
        "INFO 01-01 00:00:00 [a.py:1] start\n"
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] EngineCore failed to start.\n"
        "ERROR 08-21 18:20:01 [launcher.py:1] Engine process died unexpectedly\n"
        "INFO 08-21 18:20:02 [a.py:1] bye\n",
        "unknown", 3, "ERROR 08-21 18:20:01 [launcher.py:1] Engine process died unexpectedly", None,
        id="generic-the-last-error-level-line-when-there-is-no-exception"),
    pytest.param(
        "\x1b[31mERROR\x1b[0m 08-21 18:18:05 [gpu_model_runner.py:5403] Failed to load model - not enough GPU memory.\n",
        "weights_oom", 1, "ERROR 08-21 18:18:05 [gpu_model_runner.py:5403] Failed to load model - not enough GPU memory.",
        None, id="colour-codes-are-stripped-from-the-line"),
]


@pytest.mark.parametrize(("text", "pattern", "line_no", "line", "advice"), DIAGNOSED)
def test_a_log_is_diagnosed_at_its_line(text, pattern, line_no, line, advice):
    d = diagnose_failure(text, source="trial/server.log")
    assert (d["pattern"], d["source"]) == (pattern, f"trial/server.log:{line_no}")
    if line is not None:
        assert d["line"] == line
    if advice is not None:
        assert advice in d["diagnosis"]


def test_cuda_oom_phase_comes_from_the_log_never_by_default():
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.19 GiB\n"
    # nothing before it says what was running: the phase is not known, and the kind says so
    d = diagnose_failure("INFO 06-19 23:04:10 [loader.py:1] loading\n" + oom)
    assert d["pattern"] == "oom" and d["source"] == "server.log:2"
    assert "does not show" in d["diagnosis"]
    # the weights had started loading and never finished: a load one
    loading = "INFO 06-19 23:04:10 [gpu_model_runner.py:1] Starting to load model Qwen/Qwen3-32B...\n"
    assert diagnose_failure(loading + oom)["pattern"] == "weights_oom"


@pytest.mark.parametrize(
    "line",
    [
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] ValueError: No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine.",
        "(Worker pid=5) INFO 09-09 09:09:09 [gpu_worker.py:300] Available KV cache memory: -3.02 GiB",
    ],
)
def test_no_kv_memory(line):
    text = f"INFO 01-01 00:00:00 [a.py:1] start\n{line}\nRuntimeError: Engine core initialization failed.\n"
    d = diagnose_failure(text)
    assert d["pattern"] == "no_kv_memory"
    assert d["source"] == "server.log:2"
    assert d["line"] == line
    assert "max_model_len" in d["diagnosis"]


@pytest.mark.parametrize(
    "line",
    [
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (9.5 GiB). Based on the available memory, the "
        "estimated maximum model length is 77808. Try increasing `gpu_memory_utilization` or decreasing `max_model_len`",
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in "
        "KV cache (9024). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
    ],
)
def test_kv_cache_too_small_for_max_model_len(line):
    d = diagnose_failure(f"{line}\n")
    assert d["pattern"] == "kv_cache_too_small"
    assert "max_model_len" in d["diagnosis"]


def test_positive_available_kv_is_not_a_failure():
    assert diagnose_failure("INFO 1 [g.py:1] Available KV cache memory: 3.02 GiB\n") is None


@pytest.mark.parametrize(
    "line",
    [
        "api_server.py: error: unrecognized arguments: --not-a-flag",
        "vllm serve: error: argument --compilation-config/-cc: Invalid JSON: expected value at line 2",
        "vllm serve: error: argument --dtype: invalid choice: 'fp13' (choose from 'auto', 'half', 'float16')",
    ],
)
def test_argparse_rejection(line):
    text = (
        "INFO 08-21 18:16:50 [__init__.py:241] Automatically detected platform cuda.\n"
        "usage: vllm serve [model_tag] [options]\n"
        f"{line}\n"
    )
    d = diagnose_failure(text, source="s.log")
    assert d == {
        "line": line,
        "source": "s.log:3",
        "pattern": "argparse",
        "diagnosis": d["diagnosis"],
    }
    assert "--help" in d["diagnosis"]


def assert_diagnosed(line, pattern):
    """``line`` in the middle of a log (line 3, a later error after it) is diagnosed as ``pattern``."""
    text = f"INFO 01-01 00:00:00 [a.py:1] start\n\n{line}\nRuntimeError: something later\n"
    d = diagnose_failure(text)
    assert d["pattern"] == pattern
    assert d["source"] == "server.log:3"
    assert d["line"] == line


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        (
            "(EngineCore pid=123) ERROR 11-29 16:00:00 [core.py:708] ValueError: Unsupported CPU attention "
            "configuration: head_size=80, dtype=torch.float16",
            "cpu_attention",
        ),
        (
            "(EngineCore pid=123) ERROR 11-29 16:00:00 [core.py:708] RuntimeError: Not enough allowed NUMA nodes to "
            "bind threads of 4 CPUWorkers. Allowed NUMA nodes are [0]. Please try to bind threads manually.",
            "numa_bind",
        ),
        (
            "(EngineCore pid=558) INFO 08-21 18:30:00 [shm_broadcast.py:466] No available shared memory broadcast "
            "block found in 60 second. This typically happens when some processes are hanging.",
            "shm_broadcast",
        ),
        (
            "(APIServer pid=1) ERROR 08-21 18:22:41 [api_server.py:1] OSError: [Errno 98] Address already in use",
            "port_in_use",
        ),
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
            "port_in_use",
        ),
    ],
)
def test_specific_patterns(line, pattern):
    assert_diagnosed(line, pattern)


def test_generic_prefers_root_cause_over_wrapper_exception():
    text = (
        "(EngineCore pid=558) ERROR 08-21 18:20:00 [core.py:700] ImportError: libcudart.so.12: cannot open shared object file\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    d = diagnose_failure(text)
    assert d["pattern"] == "unknown"
    assert d["source"] == "server.log:1"
    # With only the wrapper, the wrapper is reported.
    d = diagnose_failure("RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert d["pattern"] == "unknown"
    assert d["source"] == "server.log:1"


def test_failure_patterns_are_named_and_extensible():
    names = [p.name for p in FAILURE_PATTERNS]
    assert names[:7] == ["tp_divisibility", "gpus_too_few", "free_memory_below_utilization", "memory_profiling_error",
                         "runtime_oom", "weights_oom", "oom"]
    # symptoms last, and last of all an engine that failed to start with nothing else in its log
    assert names[-4:] == ["engine_handshake_timeout", "rpc_timeout", "shm_broadcast", "engine_start_failed"]
    assert len(names) == len(set(names))
    assert all(p.diagnosis.endswith(".") for p in FAILURE_PATTERNS)

    custom = FailurePattern("plugin", re.compile(r"my_plugin failed"), "The plugin failed; reinstall it.")
    text = "RuntimeError: my_plugin failed to initialise\n"
    assert diagnose_failure(text)["pattern"] == "unknown"
    d = diagnose_failure(text, patterns=(custom, *FAILURE_PATTERNS))
    assert d["pattern"] == "plugin"
    assert d["diagnosis"] == "The plugin failed; reinstall it."


# ------------------------------------------------- whole logs from the installed vLLM

def _data(name: str) -> str:

    return read_log(DATA / name)


def test_real_cpu_tp2_startup_log_from_vllm_0_32():
    facts = parse_startup(_data("vllm-0.32.0-cpu-tp2-server.log"), source="server.log")
    assert facts["vllm_version"]["value"] == "0.32.0" and facts["vllm_version"]["source"] == "server.log:8"
    assert facts["kv_cache_tokens"]["value"] == 1_048_576 and facts["kv_cache_tokens"]["source"] == "server.log:73"
    assert facts["kv_pool"]["value"] == "CPU"
    assert facts["max_concurrency"]["value"] == 2048.0
    assert facts["max_concurrency_tokens_per_request"]["value"] == 512
    assert facts["available_kv_gib"]["value"] == 1.0 and facts["available_kv_gib"]["per_rank"] == [1.0, 1.0]
    assert facts["engine_init_seconds"]["value"] == 15.39 and facts["engine_init_seconds"]["source"] == "server.log:74"
    assert facts["max_model_len"]["value"] == 512
    assert "model_load_gib" not in facts  # the CPU build prints no "Model loading took"


def test_real_cpu_log_of_an_unknown_flag_names_the_argparse_line():
    text = _data("vllm-0.32.0-cpu-bad-arg-server.log")
    found = diagnose_failure(text, source="server.log")
    assert found["pattern"] == "argparse"
    assert found["line"] == "api_server.py: error: unrecognized arguments: --not-a-vllm-flag"
    assert found["source"] == f"server.log:{text.split(chr(10)).index(found['line']) + 1}"
    assert parse_startup(text) == {}


# ------------------------------------------------- failures across nodes
#
# Each line is a real one: logged by torch 2.13 on this host (the rendezvous and gloo failures
# were provoked by running ranks that could not meet), quoted from the installed vLLM 0.32.0
# source with its file:line, or from the source of the project that prints it.

#: vllm/v1/executor/ray_utils.py:467-475 (logger.info while the placement group is pending),
#: with its log prefix as the engine core prints it.
RAY_PG_WAITING = (
    "(EngineCore pid=4021) INFO 12-01 10:15:20 [ray_utils.py:467] Waiting for creating a placement group of specs "
    "for 10 seconds. specs=[{'node:10.232.7.1': 0.001, 'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status` and "
    "`ray list nodes` to see if you have enough resources, and make sure the IP addresses used by ray cluster are "
    "the same as VLLM_HOST_IP environment variable specified in each node if you are running on a multi-node."
)
#: vllm/v1/executor/ray_utils.py:489-499 (raised after PG_WAIT_TIMEOUT = 1800 s, ray_utils.py:29).
RAY_PG_FAILED = (
    "ValueError: Cannot provide a placement group requiring 2.0 GPUs (placement_group_specs=[{'GPU': 1.0}, "
    "{'GPU': 1.0}]) within 1800 seconds."
)
#: vllm/v1/engine/utils.py:837-843 (data-parallel placement groups).
RAY_DP_PG = (
    "ValueError: Not enough resources to allocate 2 placement groups, only created 1 placement groups. "
    "Available resources: {'CPU': 16.0, 'GPU': 1.0}"
)
#: torch 2.13 on this host, rank 0 of 2 with no rank 1 (c10d TCPStore, libtorch_cpu.so:
#: "Timed out after {} seconds waiting for clients. {}/{} clients joined.").
STORE_WAIT = "torch.distributed.DistStoreError: Timed out after 6 seconds waiting for clients. 1/2 clients joined."
#: vllm/v1/engine/utils.py:1401-1404 (logger.debug while engines on other nodes have not connected).
DP_REMOTE_WAIT = (
    "(APIServer pid=77) DEBUG 12-01 10:15:20 [utils.py:1401] Waiting for 1 local, 1 remote core engine proc(s) "
    "to connect."
)
#: torch 2.13 on this host, rank 1 of 2 with nothing at the master's port (c10d socket.cpp:1028
#: and TCPStore.cpp:328, as printed on stderr).
CLIENT_TIMEOUT = (
    "[E1201 00:21:21.491091240 socket.cpp:1028] [c10d] The client socket has timed out after 5000ms while trying "
    "to connect to (127.0.0.1, 29612)."
)
CLIENT_GAVE_UP = (
    "[E1201 00:21:25.647560606 TCPStore.cpp:328] [c10d] TCP client failed to connect/validate to host "
    "127.0.0.1:29612 - timed out (try=1, timeout=5000ms): The client socket has timed out after 5000ms while "
    "trying to connect to (127.0.0.1, 29612)."
)
#: torch 2.13 on this host, two gloo ranks, rank 1 not calling all_reduce (gloo
#: third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78).
GLOO_RECV_TIMEOUT = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
    "waiting 5000ms for recv operation to complete"
)
#: NCCL's watchdog, torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (ProcessGroupNCCL's timed-out
#: collective: "[Rank ", rank, "] Watchdog caught collective operation timeout: ", work, " ran for ",
#: ms, " milliseconds before timing out."); not in the CPU build of torch installed here.
NCCL_WATCHDOG = (
    "[rank0]:[E1201 10:45:21.426415540 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=600000) ran "
    "for 600081 milliseconds before timing out."
)
#: torch 2.13 on this host with GLOO_SOCKET_IFNAME=nosuch0 on both ranks (gloo
#: third_party/gloo/gloo/transport/tcp/device.cc:84).
GLOO_NO_IFACE = (
    "RuntimeError: [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] "
    "ifa != nullptr. Unable to find address for: nosuch0"
)
#: vLLM 0.32 CPU, TP=2 across two hosts (tests/serve/test_multinode.py), node 0's worker when the
#: headless rank on node 1 was killed with SIGKILL mid-benchmark.
GLOO_PEER_RESET = (
    "(Worker_TP0 pid=6500) ERROR 12-01 03:12:01 [multiproc_executor.py:1063] RuntimeError: "
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.231.7.2]:26258: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application. "
    "Check the logs of the remote worker before reporting an error. GLHF!"
)
#: The same, another run: the peer's socket closed rather than reset.
GLOO_PEER_CLOSED = (
    "(Worker_TP0 pid=12609) ERROR 12-01 03:30:40 [multiproc_executor.py:1063] RuntimeError: "
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[10.231.1.2]:15520. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error."
)
#: vLLM 0.32 CPU with --distributed-executor-backend ray on a two-node Ray cluster
#: (tests/serve/test_multinode.py): the engine core refuses the executor.
RAY_CPU = ("(EngineCore pid=25144) ERROR 12-01 03:20:27 [core.py:1510] ValueError: current platform cpu does "
           "not support ray.")
#: Ray's check_version_info (ray/_private, Ray 2.x) raises this when a node joins a cluster
#: started under another Python; the versions are those of ../shared/seeds/000_c197a6980c1ee4eb.txt
#: line 29 ("a 3.12.13 worker could not join a 3.12.3 head node"). Ray is not installed here.
RAY_VERSION_MISMATCH = [
    "RuntimeError: Version mismatch: The cluster was started with:",
    "    Ray: 2.49.2",
    "    Python: 3.12.3",
    "This process on node 10.232.7.2 was started with:",
    "    Ray: 2.49.2",
    "    Python: 3.12.13",
]


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        (RAY_PG_WAITING, "ray_placement_group"),
        (RAY_PG_FAILED, "ray_placement_group"),
        (RAY_DP_PG, "ray_placement_group"),
        (STORE_WAIT, "node_not_joined"),
        (DP_REMOTE_WAIT, "node_not_joined"),
        (CLIENT_TIMEOUT, "master_unreachable"),
        (CLIENT_GAVE_UP, "master_unreachable"),
        (GLOO_RECV_TIMEOUT, "collective_timeout"),
        (NCCL_WATCHDOG, "collective_timeout"),
        (GLOO_NO_IFACE, "socket_interface"),
        (RAY_VERSION_MISMATCH[0], "node_version_mismatch"),
        (GLOO_PEER_RESET, "peer_lost"),
        (GLOO_PEER_CLOSED, "peer_lost"),
        (RAY_CPU, "ray_unsupported_platform"),
    ],
)
def test_multi_node_patterns(line, pattern):
    assert_diagnosed(line, pattern)


def test_data_parallel_waiting_only_for_local_engines_is_not_a_missing_node():
    line = "(APIServer pid=77) DEBUG 12-01 10:15:20 [utils.py:1401] Waiting for 2 local, 0 remote core engine proc(s) to connect."
    assert diagnose_failure(line + "\n") is None


def test_ray_version_mismatch_beats_the_placement_group_it_starves():
    # the worker node's `ray start` fails, so the head's placement group waits for a node that never comes
    text = "\n".join([*RAY_VERSION_MISMATCH, RAY_PG_WAITING, RAY_PG_FAILED]) + "\n"
    d = diagnose_failure(text, source="node1.log")
    assert d["pattern"] == "node_version_mismatch"
    assert d["source"] == "node1.log:1"
    assert "patch level" in d["diagnosis"]


def test_a_missing_node_beats_the_collective_that_waited_for_it():
    text = f"{GLOO_RECV_TIMEOUT}\n{STORE_WAIT}\n"
    assert diagnose_failure(text)["pattern"] == "node_not_joined"
    assert diagnose_failure(f"{NCCL_WATCHDOG}\n{GLOO_NO_IFACE}\n")["pattern"] == "socket_interface"


def test_multi_node_patterns_come_before_the_shared_memory_symptom():
    names = [p.name for p in FAILURE_PATTERNS]
    assert names[-2:] == ["shm_broadcast", "engine_start_failed"]
    assert names.index("node_version_mismatch") < names.index("node_not_joined") < names.index("ray_placement_group")
    assert names.index("ray_placement_group") < names.index("collective_timeout") < names.index("peer_lost")


# ------------------------------------------------- out of memory: while loading, or after
#
# Two crash signatures the seeds tell apart: 003 ran out while the weights loaded (more GPUs), 001
# ran out for a large prefill's activations after the weights and the KV cache were in (smaller
# batches, more headroom). The frames are vLLM 0.32.0's own functions (v1/worker/gpu_worker.py,
# gpu_model_runner.py, model_executor/model_loader/base_loader.py, utils.py) under the prefixes
# vLLM prints; the error lines are the seeds' and real GitHub reports' (each cited).

_EC = "(EngineCore_DP0 pid=65064) ERROR 01-08 11:19:33 [core.py:866] "
#: vLLM 0.32.0's profiling run after the weights are in (gpu_worker.determine_available_memory ->
#: gpu_model_runner.profile_run -> _dummy_run), the error text as torch prints it.
RUNTIME_OOM_TRACEBACK = [
    "(EngineCore_DP0 pid=65064) INFO 01-08 11:19:02 [gpu_model_runner.py:3659] Model loading took 14.25 GiB memory and 6.433 seconds",
    _EC + "EngineCore failed to start.",
    _EC + "Traceback (most recent call last):",
    _EC + '  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 240, in _initialize_kv_caches',
    _EC + "    available_gpu_memory = self.model_executor.determine_available_memory()",
    _EC + '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", line 657, in determine_available_memory',
    _EC + "    self.model_runner.profile_run()",
    _EC + '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 6160, in profile_run',
    _EC + "    hidden_states, last_hidden_states = self._dummy_run(",
    _EC + '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 5650, in _dummy_run',
    _EC + "    outputs = self.model(",
    _EC + '  File "/usr/lib/python3.12/site-packages/torch/nn/modules/module.py", line 1773, in _wrapped_call_impl',
    # github.com/vllm-project/vllm/issues/27508 (gpt-oss-120b on H100, the error line of its traceback)
    _EC + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 140.75 MiB is free. Process 3270336 has 78.96 GiB memory in use.",
]
_W = "(Worker_PP2 pid=812) ERROR 06-19 23:05:01 [multiproc_executor.py:671] "
#: Seed 002's crash: the MoE experts repacked after the weights were read ("Loading weights took"
#: already printed, "Model loading took" not yet), in process_weights_after_loading; the error
#: text is seed 003's.
LOAD_OOM_TRACEBACK = [
    "(Worker_PP2 pid=812) INFO 06-19 23:04:10 [default_loader.py:291] Loading weights took 201.33 seconds",
    _W + "WorkerProc failed to start.",
    _W + "Traceback (most recent call last):",
    _W + '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", line 598, in load_model',
    _W + "    self.model_runner.load_model(load_dummy_weights=load_dummy_weights)",
    _W + '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 5060, in load_model',
    _W + "    self.model = model_loader.load_model(",
    _W + '  File "/usr/lib/python3.12/site-packages/vllm/model_executor/model_loader/base_loader.py", line 60, in load_model',
    _W + "    process_weights_after_loading(model, model_config, target_device)",
    _W + '  File "/usr/lib/python3.12/site-packages/vllm/model_executor/model_loader/utils.py", line 110, in process_weights_after_loading',
    _W + "    quant_method.process_weights_after_loading(module)",
    _W + '  File "/usr/lib/python3.12/site-packages/vllm/model_executor/layers/fused_moe/layer.py", line 900, in _repack',
    _W + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total capacity of "
    "95.01 GiB of which 438.31 MiB is free. Including non-PyTorch memory, this process has 94.57 GiB memory in use.",
]


def test_an_oom_in_the_profiling_run_is_a_runtime_one_with_its_own_fix():
    d = diagnose_failure("\n".join(RUNTIME_OOM_TRACEBACK) + "\n")
    assert d["pattern"] == "runtime_oom" and d["source"] == "server.log:13"
    assert "max_num_batched_tokens" in d["diagnosis"] and "max_num_seqs" in d["diagnosis"]
    assert "gpu_memory_utilization" in d["diagnosis"]
    # the frames decide on their own: without the "Model loading took" line it is still runtime
    assert diagnose_failure("\n".join(RUNTIME_OOM_TRACEBACK[1:]) + "\n")["pattern"] == "runtime_oom"


def test_an_oom_while_the_weights_are_processed_is_a_load_one_though_they_were_read():
    d = diagnose_failure("\n".join(LOAD_OOM_TRACEBACK) + "\n")
    assert d["pattern"] == "weights_oom" and d["source"] == "server.log:13"
    assert "tensor_parallel_size" in d["diagnosis"] and "max_num_seqs" not in d["diagnosis"]


def test_without_a_traceback_the_phase_comes_from_the_log_or_from_readiness():
    bare = "(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory."
    assert diagnose_failure(bare + "\n")["pattern"] == "oom"  # an excerpt that does not say when
    assert diagnose_failure(bare + "\n", ready=True)["pattern"] == "runtime_oom"  # the server had served
    served = "INFO:     Application startup complete.\n" + bare + "\n"
    assert diagnose_failure(served)["pattern"] == "runtime_oom"
    # the engine had taken a request in (vllm-project/vllm#13067): serving
    added = "INFO 02-10 18:06:30 engine.py:275] Added request cmpl-30aaf466904d4d148c2e17a584f448e0-0.\n"
    assert diagnose_failure(added + bare + "\n")["pattern"] == "runtime_oom"
    # vLLM's own load-time message (seed 003) is a load one, and the first out-of-memory line decides
    seed003 = ("ERROR [gpu_model_runner.py:5403] Failed to load model - not enough GPU memory. (original error: "
               "CUDA out of memory. Tried to allocate 768.00 MiB.)")
    assert diagnose_failure(seed003 + "\n", ready=True)["pattern"] == "weights_oom"
    assert diagnose_failure(f"{served}{seed003}\n")["pattern"] == "runtime_oom"
    assert diagnose_failure(f"{seed003}\n{served}")["pattern"] == "weights_oom"


def test_vllms_sampler_warm_up_oom_is_a_runtime_one():
    # github.com/vllm-project/vllm/issues/17939 (vLLM 0.8.x), the frame and the error as logged
    w = "(VllmWorker rank=1 pid=2445156) ERROR 05-10 16:00:15 [multiproc_executor.py:470] "
    text = (w + "Traceback (most recent call last):\n"
            + w + '  File "/opt/conda/lib/python3.10/site-packages/vllm/v1/worker/gpu_model_runner.py", line 1548, '
            "in _dummy_sampler_run\n"
            + w + "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. Please "
            "try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.\n")
    d = diagnose_failure(text)
    assert d["pattern"] == "runtime_oom" and d["source"] == "server.log:3"


def test_oom_phase_reads_the_innermost_known_frame():
    from llmtrial.logs.failures import oom_phase
    from llmtrial.logs.lines import log_lines

    lines = log_lines("\n".join(LOAD_OOM_TRACEBACK))
    assert oom_phase(lines, len(lines) - 1) == "load"
    assert oom_phase(lines, len(lines) - 1, ready=True) == "runtime"
    lines = log_lines("\n".join(RUNTIME_OOM_TRACEBACK))
    assert oom_phase(lines, len(lines) - 1) == "runtime"


# ------------------------------------------------- NCCL failures and hangs

#: github.com (a Ray-launched vLLM, rank 4 on the second node): c10d raising NCCL's ncclRemoteError.
NCCL_REMOTE = (
    "(worker1, rank=1, pid=27522, ip=10.105.0.4) [rank4]: [rank4]: torch.distributed.DistBackendError: NCCL error in: "
    "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or there was a network error, "
    "NCCL version 2.26.2"
)
#: github.com (training log of 8 ranks, torch 2.4+): the watchdog line of a hung BROADCAST.
NCCL_WATCHDOG_BROADCAST = (
    "[rank1]:[E810 03:04:11.061727749 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=78, OpType=BROADCAST, NumelIn=80, NumelOut=80, Timeout(ms)=600000) ran for 600096 milliseconds "
    "before timing out."
)
#: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (heartbeat monitor: "ProcessGroupNCCL's watchdog got
#: stuck for ", heartbeatTimeoutInSec_, " seconds without making progress ..."), as a report quoted it.
NCCL_STUCK = ("[rank1]:[E1111 17:10:53] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress "
              "in monitoring enqueued collectives.")
#: vllm/v1/executor/multiproc_executor.py:442 (0.32.0): raise TimeoutError(f"RPC call to {method} timed out.")
RPC_TIMEOUT = "(EngineCore_DP0 pid=164) ERROR 01-23 15:58:33 [core.py:1131] TimeoutError: RPC call to sample_tokens timed out."


@pytest.mark.parametrize(
    ("line", "pattern", "fix"),
    [
        (NCCL_REMOTE, "nccl_error", "NCCL_SOCKET_IFNAME"),
        ("[rank13]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
         "nccl_error", "NCCL_IB_DISABLE=1"),  # the line under c10d's, same report family
        (NCCL_WATCHDOG_BROADCAST, "collective_timeout", "NCCL_SOCKET_IFNAME"),
        (NCCL_STUCK, "nccl_watchdog_stuck", "Xid"),
        (RPC_TIMEOUT, "rpc_timeout", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"),
    ],
)
def test_nccl_failures_and_hangs_are_diagnosed_with_their_fix(line, pattern, fix):
    assert_diagnosed(line, pattern)
    assert fix in diagnose_failure(f"{line}\n")["diagnosis"]


def test_a_cause_beats_the_hang_it_caused():
    shm = ("(EngineCore pid=558) INFO 08-21 18:30:00 [shm_broadcast.py:466] No available shared memory broadcast "
           "block found in 60 second.")
    assert diagnose_failure(f"{shm}\n{RPC_TIMEOUT}\n{NCCL_WATCHDOG_BROADCAST}\n")["pattern"] == "collective_timeout"
    assert diagnose_failure(f"{NCCL_WATCHDOG_BROADCAST}\n{NCCL_REMOTE}\n")["pattern"] == "nccl_error"
    assert diagnose_failure(f"{shm}\n{RPC_TIMEOUT}\n")["pattern"] == "rpc_timeout"


# ------------------------------------------------- wrapped lines, nested prefixes, OOM wordings

#: Seed 003's memory-profile line (one worker's, as logged at TP4).
SEED_003_FREE_MEMORY = (
    "(Worker_TP0 pid=770) INFO 08-21 18:22:06 [gpu_worker.py:789] Free memory on device (94.05/95.01 GiB) on startup. "
    "Desired GPU memory utilization is (0.9, 85.51 GiB). Actual usage is 56.89 GiB for consumed memory (weights + "
    "non-torch), 0.76 GiB for peak activation, and 0.32 GiB for CUDAGraph memory. Replace gpu_memory_utilization "
    "config with `--kv-cache-memory=29407858586` (27.39 GiB) to fit into requested memory, or "
    "`--kv-cache-memory=38581581312` (35.93 GiB) to fully utilize gpu memory. Current kv cache memory in use is 27.85 GiB."
)
SEED_003_FIGURES = {"gpu_free_on_startup_gib": 94.05, "gpu_total_gib": 95.01, "gpu_memory_utilization": 0.9,
                    "gpu_requested_gib": 85.51, "consumed_gib": 56.89, "peak_activation_gib": 0.76,
                    "cuda_graph_gib": 0.32, "kv_cache_memory_to_fit_bytes": 29407858586,
                    "kv_cache_memory_to_fill_bytes": 38581581312, "kv_cache_in_use_gib": 27.85}


@pytest.mark.parametrize("width", [0, 80, 97, 123])
def test_the_whole_memory_profile_line_also_as_a_terminal_wraps_it(width):
    line = SEED_003_FREE_MEMORY
    # a terminal breaks at its width, inside words and numbers alike
    text = line if not width else "\n".join(line[i:i + width] for i in range(0, len(line), width))
    text = "INFO 08-21 18:22:00 [a.py:1] before\n" + text + "\n(EngineCore pid=558) INFO 08-21 18:22:07 [core.py:1] after\n"
    facts = parse_startup(text)
    assert {k: facts[k]["value"] for k in SEED_003_FIGURES} == SEED_003_FIGURES
    assert {facts[k]["source"] for k in SEED_003_FIGURES} == {"server.log:2"}
    assert facts["kv_cache_memory_to_fit_bytes"]["unit"] == "bytes" and "unit" not in facts["gpu_memory_utilization"]


def test_the_refusal_of_the_same_words_is_a_failure_not_figures():
    refusal = ("(EngineCore_DP0 pid=6940) ValueError: Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less "
               "than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU "
               "memory used by other processes.")
    wrapped = "\n".join(refusal[i:i + 90] for i in range(0, len(refusal), 90))
    for text in (refusal, wrapped):
        assert "gpu_free_on_startup_gib" not in parse_startup(text)
        d = diagnose_failure(text + "\n")
        assert d["pattern"] == "free_memory_below_utilization" and d["source"] == "server.log:1"
        assert "gpu_memory_utilization" in d["diagnosis"]


def test_nested_process_prefixes_name_the_innermost_process():
    from llmtrial.logs.lines import find_lines

    line = ("(Worker pid=749) (Worker_TP0 pid=749) ERROR 04-27 19:04:42 [multiproc_executor.py:880] RuntimeError: "
            "Assertion error (csrc/apis/../jit_kernels/impls/../../jit/kernel_runtime.hpp:45): exit_code == 0")
    found = find_lines(line, re.compile("Assertion"))
    assert (found[0]["process"], found[0]["pid"]) == ("Worker_TP0", 749)
    assert diagnose_failure(line)["pattern"] == "deepgemm"
    # the unknown fallback reads the exception behind both prefixes
    other = line.replace("Assertion error (csrc/apis/../jit_kernels/impls/../../jit/kernel_runtime.hpp:45): exit_code == 0",
                         "KeyError: 'lm_head'")
    d = diagnose_failure(other)
    assert (d["line"], d["source"], d["pattern"]) == (other, "server.log:1", "unknown")
    assert d["diagnosis"].startswith("No known failure explains this log")


@pytest.mark.parametrize(
    "error",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
        "RuntimeError: CUDA error: out of memory",
        "RuntimeError: CUDA driver error: out of memory",
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 12.95 GiB.",
        "RuntimeError: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
    ],
)
def test_every_oom_wording_with_its_phase_told_by_the_log(error):
    assert diagnose_failure(error + "\n")["pattern"] == "oom"
    assert diagnose_failure("\n".join(RUNTIME_OOM_TRACEBACK[:-1] + [_EC + error]) + "\n")["pattern"] == "runtime_oom"
    assert diagnose_failure("\n".join(LOAD_OOM_TRACEBACK[:-1] + [_W + error]) + "\n")["pattern"] == "weights_oom"
    loaded = "INFO 03-07 10:42:35 model_runner.py:1115] Loading model weights took 0.4855 GB\n"
    assert diagnose_failure(loaded + error + "\n")["pattern"] == "runtime_oom"


def test_a_traceback_that_quotes_the_message_in_its_source_is_not_the_error():
    # github.com/vllm-project/vllm/issues/10439: the frame's source line spells the message too
    text = (
        'ERROR 11-18 18:07:28 engine.py:366]   File "/usr/local/lib/python3.12/dist-packages/vllm/worker/worker.py", '
        "line 493, in raise_if_cache_size_invalid\n"
        'ERROR 11-18 18:07:28 engine.py:366]     raise ValueError("No available memory for the cache blocks. "\n'
        "ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n"
    )
    assert diagnose_failure(text)["source"] == "server.log:3"


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        # vllm/distributed/device_communicators/shm_broadcast.py, 0.6.x wording
        ("(VllmWorkerProcess pid=2207) WARNING 10-01 12:00:00 shm_broadcast.py:386] No available block found in 60 "
         "second.", "shm_broadcast"),
        ("RuntimeError: No CUDA GPUs are available", "no_gpu"),
        ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
         "driver from http://www.nvidia.com/Download/index.aspx", "no_gpu"),
        ("RuntimeError: FlashAttention only supports Ampere GPUs or newer.", "unsupported_gpu_arch"),
        ("[rank0]:[E1224 13:23:05.483 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 0] Some NCCL operations have failed or timed "
         "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/"
         "incomplete data.", "collective_timeout"),
        ("ValueError: User-specified max_model_len (8192) is greater than the derived max_model_len "
         "(max_position_embeddings=2048 or model_max_length=None in model's config.json).", "max_model_len_exceeds_model"),
        ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has "
         "compute capability 7.5.", "unsupported_dtype"),
        ("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 80. Current "
         "capability: 75.", "unsupported_quantization"),
        ("ValueError: Model architectures ['InternLM2ForCausalLM'] are not supported for now.", "unsupported_architecture"),
        ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", "nccl_error"),
        ("Error while creating shared memory segment /dev/shm/nccl-bWHyCi (size 9637888)", "nccl_shm"),
        ("ERROR 02-09 02:31:11 engine.py:389] Ray does not allocate any GPUs on the driver node. Consider adjusting the "
         "Ray placement group or running the driver on a GPU node.", "ray_driver_no_gpu"),
    ],
)
def test_the_kinds_operators_meet(line, pattern):
    assert_diagnosed(line, pattern)


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        # vllm/distributed/utils.py:54 (0.32.0), a vocabulary of 151,936 over TP 5
        ("AssertionError: 151936 is not divisible by 5", "tp_divisibility"),
        ("(Worker_TP3 pid=812) ERROR 05-01 10:00:00 [multiproc_executor.py:671] AssertionError: 151936 is not divisible "
         "by 5", "tp_divisibility"),
        # vllm/v1/worker/gpu_worker.py:493 (0.32.0), DP 2 on a host that shows the server one GPU
        ("AssertionError: DP adjusted local rank 1 is out of bounds for 1 devices.", "gpus_too_few"),
        # transformers/models/auto/configuration_auto.py:432 (4.5x)
        ("Value error, The checkpoint you are trying to load has model type `gemma4` but Transformers does not "
         "recognize this architecture. This could be because of an issue with the checkpoint.", "unsupported_architecture"),
        # transformers/utils/hub.py:621
        ("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
         "cached files.", "model_files_unreachable"),
    ],
)
def test_the_kinds_vllms_own_checks_raise(line, pattern):
    assert_diagnosed(line, pattern)


def test_a_number_not_divisible_inside_a_sentence_is_not_taken_for_a_split():
    assert diagnose_failure("ValueError: the 7 layers of block 3 is not divisible by 2 in a way we explain\n")["pattern"] \
        == "unknown"
