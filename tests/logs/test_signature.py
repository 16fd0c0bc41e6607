"""A crash's signature (llmtrial.logs.signature) against real vLLM logs that nobody on this project wrote.

``tests/data/vllm-logs/`` holds the logs and, for each crash whose excerpt shows a traceback or an
exception line, the signature a careful reader takes from it (the ``signature:`` block, written by
reading the log; ``tests/data/vllm-logs/README.md`` says how). What is held: every annotated case
reads exactly as the reader wrote it, every other case has no signature, an out-of-memory error is
named by its phase where the log shows it, and a list of ranks' logs gives the rank that crashed first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from conftest import DATA
from llmtrial.core.configuration_model import CrashFrame
from llmtrial.logs.lines import read_log
from llmtrial.logs.signature import PHASES, FailureSignature, failure_signature, mask, phase_of_function, signature_record

CORPUS = DATA / "vllm-logs"


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    meta: dict[str, Any]


def _cases() -> list[Case]:
    return [Case(p.stem, read_log(p.with_suffix(".log")), yaml.safe_load(p.read_text()))
            for p in sorted(CORPUS.glob("*.yaml"))]


CASES = _cases()
SIGNED = [c for c in CASES if "signature" in c.meta]
UNSIGNED = [c for c in CASES if "signature" not in c.meta]


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def _read(sig: FailureSignature) -> dict[str, Any]:
    """The signature in the corpus's words."""
    frame = None if sig.frame is None else {"file": sig.frame.file, "function": sig.frame.function,
                                            "line": sig.frame.line}
    return {"exception": sig.exception, "message": sig.message, "frame": frame, "phase": sig.phase,
            "phase_line": sig.phase_line}


# ------------------------------------------------------------------ the corpus


def test_the_corpus_signs_every_kind_of_phase_and_the_crashes_without_one():
    assert len(SIGNED) >= 30
    phases = {c.meta["signature"]["phase"] for c in SIGNED}
    assert phases == {*PHASES, None}, phases
    assert all(c.meta["failure"] for c in SIGNED), "a signature on a clean start-up"


@pytest.mark.parametrize("case", SIGNED, ids=[c.name for c in SIGNED])
def test_each_signature_is_written_as_the_format_says(case):
    want = case.meta["signature"]
    assert set(want) == {"exception", "message", "frame", "phase", "phase_line"}
    assert want["phase"] in {*PHASES, None}
    assert (want["phase"] is None) == (want["phase_line"] is None)
    assert (want["exception"] is None) == (want["message"] is None)
    if want["frame"]:
        assert want["frame"]["file"].startswith("vllm/") and set(want["frame"]) == {"file", "function", "line"}


@pytest.mark.parametrize("case", SIGNED, ids=[c.name for c in SIGNED])
def test_each_crash_reads_as_the_reader_wrote_it(case):
    sig = failure_signature(case.text)
    assert sig is not None, "no signature read"
    assert _read(sig) == case.meta["signature"]


@pytest.mark.parametrize("case", UNSIGNED, ids=[c.name for c in UNSIGNED])
def test_a_log_without_a_traceback_or_an_exception_line_has_no_signature(case):
    assert failure_signature(case.text) is None


# ------------------------------------------------------------------ out of memory, named by its phase


@pytest.mark.parametrize(("name", "phase"), [
    ("mem-vllm-6746-capture-cuda-error-oom", "graph_capture_compile"),  # CUDA-graph capture at warm-up
    ("more-club3090-60-cuda-driver-oom-marlin", "post_load_processing"),  # the Marlin repack after loading
    ("oom-postload-vllm-backport-34-mxfp4-marlin-repack", "post_load_processing"),  # an MXFP4 MoE Marlin repack
    ("oom-serving-vllm-9290-v0-mq-engine-step", "serving"),  # V0's engine loop stepping
    ("more-axolotl-1971-v0-worker-load-model-oom", "weight_loading"),  # V0 prints no type, names load_model
    ("mem-vllm-28143-create-weights-oom", "weight_loading"),  # vLLM's own error line before the traceback
    ("mem-vllm-12529-v1-oom-no-frames", None),  # the excerpt does not show it
])
def test_an_out_of_memory_error_is_named_by_the_phase_the_log_shows(name, phase):
    sig = failure_signature(_case(name).text)
    assert sig is not None and sig.out_of_memory
    assert sig.phase == phase


# Composed for this test (not a corpus excerpt): the frame lines of a V1 engine core's serving step as a
# public report prints them (noonghunna/club-3090#58, whose excerpts stop short of its error line), the
# futures frames vLLM goes through, and a shortened out-of-memory line of the same report.
SERVING_OOM = """\
(APIServer pid=1) INFO:     Application startup complete.
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138] Traceback (most recent call last):
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1170, in run_busy_loop
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]     self._process_engine_step()
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1209, in _process_engine_step
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]     outputs, model_executed = self.step_fn()
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 473, in step_with_batch_queue
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]     exec_future = self.model_executor.execute_model(
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/uniproc_executor.py", line 114, in execute_model
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]     output.result()
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]   File "/usr/lib/python3.12/concurrent/futures/_base.py", line 449, in result
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138]     return self.__get_result()
(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 56.88 MiB is free.
(APIServer pid=1) ERROR 05-05 12:36:59 [serving.py:1173] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def test_an_out_of_memory_error_in_the_serving_loop_is_a_serving_one():
    sig = failure_signature(SERVING_OOM)
    assert sig is not None and sig.out_of_memory
    assert sig.exception == "torch.OutOfMemoryError"
    assert sig.frame == CrashFrame(file="vllm/v1/executor/uniproc_executor.py", function="execute_model", line=114)
    assert (sig.phase, sig.phase_line) == ("serving", 9)
    assert sig.crash_line == 13  # the engine's error, not the API server's EngineDeadError after it


def test_without_frames_the_last_start_up_line_tells_the_phase_and_frames_win_over_it():
    oom = "ERROR 03-13 09:00:43 [core.py:330] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB."
    loaded = "INFO 03-13 09:00:40 [gpu_model_runner.py:2007] Model loading took 65.9651 GiB and 12.799889 seconds"
    ready = "(APIServer pid=1) INFO:     Application startup complete."
    assert failure_signature(f"{loaded}\n{oom}\n").phase == "memory_profiling"
    assert failure_signature(f"{loaded}\n{ready}\n{oom}\n").phase == "serving"
    # the engine taking a request in (vllm-project/vllm#13067's V0 line) is serving too
    added = "INFO 02-10 18:06:30 engine.py:275] Added request cmpl-30aaf466904d4d148c2e17a584f448e0-0."
    sig = failure_signature(f"{loaded}\n{added}\n{oom}\n")
    assert (sig.phase, sig.phase_line) == ("serving", 2)
    capture = _case("mem-vllm-6746-capture-cuda-error-oom").text
    sig = failure_signature(f"{loaded}\n{capture}")
    assert (sig.phase, sig.phase_line) == ("graph_capture_compile", 8)


# ------------------------------------------------------------------ every rank's log

RANK0_LATER = """\
(Worker_TP0 pid=770) INFO 08-21 18:18:05 [gpu_model_runner.py:5405] Model loading took 55.19 GiB memory and 48.502592 seconds
(Worker_TP0 pid=770) ERROR 08-21 18:21:47 [multiproc_executor.py:511] RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)
"""
RANK1_FIRST = """\
(Worker_TP1 pid=771) INFO 08-21 18:18:06 [gpu_model_runner.py:5405] Model loading took 55.19 GiB memory and 48.61 seconds
(Worker_TP1 pid=771) ERROR 08-21 18:21:40 [multiproc_executor.py:511] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
"""
RANK2_CLEAN = """\
(Worker_TP2 pid=772) INFO 08-21 18:18:06 [gpu_model_runner.py:5405] Model loading took 55.20 GiB memory and 48.70 seconds
"""


def test_of_every_rank_s_log_the_rank_that_crashed_first_gives_the_signature():
    sig = failure_signature([RANK0_LATER, RANK1_FIRST, RANK2_CLEAN])
    assert sig is not None
    assert (sig.log, sig.exception, sig.phase) == (1, "torch.OutOfMemoryError", "memory_profiling")
    assert sig.message == "CUDA out of memory. Tried to allocate <N> GiB."
    assert failure_signature([RANK2_CLEAN, RANK2_CLEAN]) is None
    assert failure_signature([RANK2_CLEAN, RANK0_LATER]).log == 1


def test_ranks_without_times_are_taken_in_the_order_given():
    untimed = "RuntimeError: NCCL error: unhandled cuda error\n"
    sig = failure_signature([RANK1_FIRST, untimed])
    assert sig.log == 0
    assert failure_signature([untimed, RANK1_FIRST]).log == 0


def test_the_same_failure_with_other_numbers_has_the_same_key():
    """The record's key, which the comparison across configurations groups by."""

    def key(text: str):
        return signature_record([("server.log", text)]).key

    text = _case("mem-vllm-12529-v1-oom-no-frames").text
    assert key(text.replace("1.16 GiB", "2.31 GiB").replace("GPU 0", "GPU 3")) == key(text)
    assert key(RANK1_FIRST.replace("2.00 GiB", "3.50 GiB")) == key(RANK1_FIRST)
    assert key(RANK1_FIRST) != key(text)


# ------------------------------------------------------------------ the parts


@pytest.mark.parametrize(("message", "masked"), [
    ("CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 7.75 GiB",
     "CUDA out of memory. Tried to allocate <N> GiB. GPU <N> has a total capacity of <N> GiB"),
    ("NCCL error in: ../ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.20.5",
     "NCCL error in: ../ProcessGroupNCCL.cpp:<N>, unhandled system error, NCCL version <N>"),
    ("lock for <_io.BufferedWriter> at 0x0000740556f53600 (tstate=0x1ae78c0)",
     "lock for <_io.BufferedWriter> at <HEX> (tstate=<HEX>)"),
    ("fragmentation.  See documentation", "fragmentation.  See documentation"),
    ("Free memory on device cuda:1 (19.77/22.05 GiB)", "Free memory on device cuda:<N> (<N>/<N> GiB)"),
])
def test_masking_replaces_numbers_and_addresses_and_keeps_the_rest(message, masked):
    assert mask(message) == masked


def test_a_function_tells_a_phase_only_where_it_runs_in_one():
    assert phase_of_function("process_weights_after_loading") == "post_load_processing"
    assert phase_of_function("gptq_marlin_repack", "vllm/_custom_ops.py") == "post_load_processing"
    assert phase_of_function("execute_model", "vllm/v1/worker/gpu_worker.py") == "serving"
    # V0's model runner calls execute_model while profiling too; _dummy_run and forward run everywhere
    assert phase_of_function("execute_model", "vllm/worker/model_runner.py") is None
    assert phase_of_function("_dummy_run", "vllm/v1/worker/gpu_model_runner.py") is None
    assert phase_of_function("forward", "vllm/attention/layer.py") is None
    assert phase_of_function("__call__", "vllm/compilation/backends.py") == "graph_capture_compile"


def test_a_frame_in_a_virtual_environment_under_a_folder_named_vllm_is_not_vllm():
    text = _case("mem-vllm-28143-create-weights-oom").text
    torch_frame = ('(EngineCore_DP0 pid=12473) ERROR 11-05 12:19:32 [core.py:708]   File '
                   '"/home/x/vllm/.venv/lib/python3.10/site-packages/torch/utils/_device.py", line 104, in __torch_function__')
    sig = failure_signature(f"{text.rstrip()}\n{torch_frame}\n")
    assert sig.frame == CrashFrame(file="vllm/model_executor/layers/linear.py", function="create_weights", line=202)


def test_a_crash_that_is_no_out_of_memory_error_is_not_called_one():
    for name in ("dist-vllm-6574-nccl-shm", "mem-vllm-23278-gptoss120b-negative-kv", "mem-vllm-10439-v0-no-cache-blocks"):
        assert not failure_signature(_case(name).text).out_of_memory, name


def test_a_wrapper_is_not_the_crash_and_nccl_s_own_error_names_are_not_exceptions():
    text = _case("dist-vllm-6574-nccl-shm").text
    sig = failure_signature(text.rstrip("\n") + "\nRuntimeError: Engine core initialization failed. See root cause above.\n")
    assert (sig.exception, sig.crash_line, sig.phase) == (None, 4, "memory_profiling")
    only_wrapper = failure_signature("RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert only_wrapper.exception == "RuntimeError" and only_wrapper.frame is None


def test_every_out_of_memory_crash_of_the_corpus_is_called_one_and_no_other():
    ooms = {"oom", "weights_oom", "runtime_oom"}
    for case in SIGNED:
        sig = failure_signature(case.text)
        assert sig.out_of_memory == (case.meta["failure"]["kind"] in ooms), case.name
