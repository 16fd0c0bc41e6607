"""Which start-up phase a vLLM function or a vLLM line belongs to: the one place both the crash signature
(:mod:`llmtrial.logs.signature`) and the out-of-memory reading of the failure catalogue
(:func:`llmtrial.logs.failures.oom_phase`) read it from.

A function tells a phase only where it runs in one (:func:`phase_of_function`): ``load_weights`` loads,
``process_weights_after_loading`` and a quantization repack run after the weights loaded, ``capture_model``
and the compilation back end capture or compile, V1's ``execute_model`` and the engine's busy loop serve.
vLLM's own lines tell how far start-up got (:func:`line_phase`): after "Model loading took" comes
profiling, after "Available KV cache memory" the KV allocation, and so on.
"""

from __future__ import annotations

import re
from typing import get_args

from llmtrial.core.configuration_model import Phase
from llmtrial.logs.lines import LogLine

__all__ = ["COMPILE_FUNCTIONS", "METHOD", "PHASES", "line_phase", "phase_of_function", "vllm_path"]

#: The phases in start-up order (serving last).
PHASES: tuple[Phase, ...] = get_args(Phase)
#: V0's worker processes name the method they ran: "Exception in worker VllmWorkerProcess while processing
#: method load_model: CUDA out of memory ...".
METHOD = re.compile(r"while processing method (?P<func>\w+)")
#: A timed-out call from the engine to its workers names the method it waited for ("RPC call to sample_tokens
#: timed out"): the phase that method runs in.
_RPC = re.compile(r"RPC call to (?P<func>\w+) timed out")


_FUNCTION_PHASES: dict[str, Phase] = {
    **dict.fromkeys(("init_device", "init_worker_distributed_environment", "init_distributed_environment",
                     "initialize_model_parallel", "ensure_model_parallel_initialized", "ncclCommInitRank"),
                    "device_init"),
    **dict.fromkeys(("load_model", "get_model", "load_weights", "_load_weights", "_initialize_model",
                     "initialize_model", "create_weights", "weight_loader", "download_model"), "weight_loading"),
    **dict.fromkeys(("process_weights_after_loading",), "post_load_processing"),
    **dict.fromkeys(("profile_run", "determine_available_memory", "determine_num_available_blocks",
                     "profile_cudagraph_memory"), "memory_profiling"),
    **dict.fromkeys(("initialize_kv_cache", "initialize_from_config", "_allocate_kv_cache",
                     "_allocate_kv_cache_tensors", "initialize_kv_cache_tensors", "_reshape_kv_cache_tensors",
                     "get_kv_cache_config", "get_kv_cache_configs", "get_kv_cache_config_from_groups",
                     "check_enough_kv_cache_memory", "_check_enough_kv_cache_memory", "raise_if_cache_size_invalid",
                     "_init_cache_engine"), "kv_allocation"),
    **dict.fromkeys(("capture_model", "_capture_cudagraphs", "capture", "compile_or_warm_up_model", "_warm_up_model",
                     "warming_up_model"), "graph_capture_compile"),
    # the engine's loop; V0's AsyncLLMEngine hands its background loop's error to _raise_exception_on_finish
    **dict.fromkeys(("step", "step_async", "step_with_batch_queue", "run_busy_loop", "_process_engine_step",
                     "engine_step", "run_engine_loop", "execute_dummy_batch", "start_worker_execution_loop",
                     "_raise_exception_on_finish"), "serving"),
}
#: Compilation by torch (Dynamo tracing, Inductor code generation): these frames run only while compiling.
COMPILE_FUNCTIONS = frozenset({"compile_fx", "compile_fx_inner", "_compile_fx_inner", "fx_codegen_and_compile",
                                "codegen_and_compile", "compile_to_module", "call_user_compiler",
                                "_call_user_compiler", "compile_and_call_fx_graph", "compile_inner"})
#: vLLM's compilation back end, which runs only while compiling (not the wrappers a compiled model runs through).
COMPILE_FILES = ("vllm/compilation/backends.py", "vllm/compilation/compiler_interface.py")


def phase_of_function(function: str, file: str = "") -> Phase | None:
    """The phase a vLLM function (``file`` from ``vllm/`` on) runs in only, or ``None`` when it runs in
    several (``forward``, ``_dummy_run``, V0's ``execute_model``, which profiling calls too).
    ``execute_model`` of V1 (``vllm/v1/``) runs only in the engine's serving steps; a quantization
    repack (``gptq_marlin_repack``, ``prepare_fp8_layer_for_marlin``) only after the weights loaded."""
    if file in COMPILE_FILES:
        return "graph_capture_compile"
    if function in _FUNCTION_PHASES:
        return _FUNCTION_PHASES[function]
    if function in ("execute_model", "sample_tokens") and file.startswith("vllm/v1/"):
        return "serving"
    if "repack" in function or (function.startswith("prepare_") and "marlin" in function):
        return "post_load_processing"
    return None



#: vLLM's lines that show how far start-up got, each with the phase a crash after it is in.
_PHASE_LINES: tuple[tuple[re.Pattern[str], Phase], ...] = (
    # checks that name their phase (vllm/v1/worker/utils.py request_memory; the platform's dtype check)
    (re.compile(r"Free memory on device .* on startup is less than desired|"
                r"Bfloat16 is only supported on GPUs with compute capability"), "device_init"),
    (re.compile(r"Starting to load model|Loading model from scratch|Loading (?:safetensors|pt) checkpoint shards:"
                r"|Loading weights with"), "weight_loading"),
    # the loader's load_weights, before process_weights_after_loading (model_loader/default_loader.py)
    (re.compile(r"Loading weights took"), "post_load_processing"),
    (re.compile(r"Model loading took|Loading model weights took|torch\.compile (?:takes|took) .* in total"),
     "memory_profiling"),
    (re.compile(r"Dynamo bytecode transform time|Compiling a graph for dynamic shape|Directly load the compiled graph|"
                r"Directly load AOT compilation"),
     "graph_capture_compile"),
    (re.compile(r"Available KV cache memory|Memory profiling takes|Memory profiling results|reserved for KV Cache is"),
     "kv_allocation"),
    # logged while the KV cache is set up, before its tensors are allocated (V1 kv_cache_utils, V0 llm_engine)
    (re.compile(r"KV cache size: [\d,]+ tokens|# (?:GPU|cuda|xpu) blocks: \d+|Maximum concurrency for"),
     "kv_allocation"),
    (re.compile(r"Capturing (?:CUDA graph|cudagraph|the model for CUDA graphs)|Graph capturing finished"),
     "graph_capture_compile"),
    # the server up, or the engine taking a request in ("Added request cmpl-...", V0's MQLLMEngine and V1's AsyncLLM)
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took|Starting vLLM API server"
                r"|Application startup complete|Avg prompt throughput|\bAdded request \S"), "serving"),
)


def line_phase(line: LogLine) -> Phase | None:
    """The phase line ``line`` shows: the method a V0 worker names, the method a V1 engine's call to its workers
    timed out on, or one of :data:`_PHASE_LINES`."""
    if not line.text:
        return None
    method = METHOD.search(line.text)
    if method is not None and phase_of_function(method["func"]) is not None:
        return phase_of_function(method["func"])
    rpc = _RPC.search(line.text)  # V1's engine waiting on its workers
    if rpc is not None and phase_of_function(rpc["func"], "vllm/v1/") is not None:
        return phase_of_function(rpc["func"], "vllm/v1/")
    return next((phase for regex, phase in _PHASE_LINES if regex.search(line.text)), None)


def vllm_path(file: str) -> str | None:
    """``file`` from its last ``vllm/`` folder on, or ``None`` outside the vLLM package (a virtual
    environment or site-packages below a folder named vllm is not it)."""
    parts = file.replace("\\", "/").split("/")
    if "vllm" not in parts[:-1]:
        return None
    path = "/".join(parts[len(parts) - 1 - parts[::-1].index("vllm"):])
    return None if "-packages/" in path or "/." in path else path
