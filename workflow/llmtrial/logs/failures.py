"""Why a vLLM server failed: the line of its log that explains it, and what to change.

:func:`diagnose_failure` tries the known patterns of :data:`FAILURE_PATTERNS` in priority order
(other code may extend the tuple) and takes the first line that matches the first pattern that
matches anywhere, so a cause beats the symptoms printed after it. Each pattern carries the
operator's next step. A log that none of them explains gives ``unknown`` with the last error line
it shows, never a guessed kind.

An out-of-memory error, in any of its wordings (torch's ``CUDA out of memory``, ``CUDA error: out
of memory``, ``CUDA driver error: out of memory``, HIP's, XPU's), is told by when it happened
(:func:`oom_phase`): while the weights load (``weights_oom``), after them (``runtime_oom``), or, where
the log does not show it, neither (``oom``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from llmtrial.logs.lines import EXCEPTION, LogLine, continued, log_lines, spaced
from llmtrial.logs.phases import METHOD, line_phase, phase_of_function, vllm_path

__all__ = ["FAILURE_PATTERNS", "FRAME", "METHOD", "OOM_LINE", "TRACEBACK", "WRAPPER", "FailurePattern", "diagnose_failure",
           "oom_phase"]


@dataclass(frozen=True)
class FailurePattern:
    """A known way for a vLLM server to fail.

    ``regex`` is searched in each cleaned line; the first line that matches is the explanation.
    With ``wraps``, a line is also read with the lines a terminal wrapped it onto (see
    :func:`llmtrial.logs.lines.continued`; the match must start on the first line, and the regex must
    allow any spacing). With ``accept``, a matching line counts only where
    ``accept(lines, index, ready)`` is true (``ready``: the server had answered /health before it
    failed).
    """

    name: str
    regex: re.Pattern[str]
    diagnosis: str
    wraps: bool = False
    accept: Callable[[list[LogLine], int, bool], bool] | None = None

    def find(self, lines: list[LogLine], ready: bool = False) -> tuple[int, str] | None:
        """The 0-based index and text of the first line matching (and accepted), or ``None``."""
        for i, line in enumerate(lines):
            if not line.text or _quotes_source(lines, i):
                continue
            text = self._match(lines, i)
            if text is not None and (self.accept is None or self.accept(lines, i, ready)):
                return i, text
        return None

    def _match(self, lines: list[LogLine], i: int) -> str | None:
        """Line ``i`` when it matches, or it with its wrapped continuation when that matches from line ``i``."""
        line = lines[i].text
        if self.regex.search(line):
            return line
        if self.wraps:
            prefix = line[: len(line) - len(lines[i].message)]
            joined = prefix + continued(lines, i)
            m = self.regex.search(joined)
            if m is not None and m.start() < len(line) and len(joined) > len(line):
                return joined
        return None


def _quotes_source(lines: list[LogLine], i: int) -> bool:
    """Line ``i`` is the source code a traceback quotes under a frame (``raise ValueError("No available
    memory ...``), not the error it raises."""
    return i > 0 and FRAME.search(lines[i - 1].text) is not None and not EXCEPTION.search(lines[i].message)


def _any(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


def _spaced(*alternatives: str) -> re.Pattern[str]:
    """:func:`_any` with every literal space allowing any spacing (for messages a terminal wraps)."""
    return _any(*(spaced(a) for a in alternatives))


# ------------------------------------------------------------------ out of memory

#: Every wording of a device out of memory: torch's (CUDA, HIP, XPU), the CUDA runtime's and driver's
#: error strings, Level Zero's, and vLLM's own at load time.
OOM_LINE = _any(
    r"\b(?:CUDA|HIP|XPU|NPU|MPS) out of memory",
    r"\bOutOfMemoryError: ",
    r"\bCUDA (?:driver )?error: out of memory",
    r"\bUR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY\b",
    r"Failed to load model - not enough GPU memory",
)
#: Messages that name the load themselves: vLLM's load_model and its linear layers' create_weights.
_LOAD_MESSAGE = re.compile(r"Failed to load model - not enough GPU memory|Failed to create \w+ (?:\w+ )?weights")
#: A traceback frame: ``File "<file>", line <line>, in <func>``.
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[\w<>]+)')
#: The line that opens a Python traceback.
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
#: The phases an out-of-memory error is told by (:mod:`llmtrial.logs.phases`): while the weights load (the
#: loader, and the processing of the weights after it), or once they are in.
_LOAD_PHASES = frozenset({"weight_loading", "post_load_processing"})
_RUNTIME_PHASES = frozenset({"memory_profiling", "kv_allocation", "graph_capture_compile", "serving"})
#: vLLM functions that run in more than one phase, each of them after the weights are in (profiling's and the
#: capture's dummy runs, V0's execute_model, which profiling calls too).
_AFTER_LOAD = frozenset({"_dummy_run", "_dummy_sampler_run", "_dummy_pooler_run", "execute_model", "sample_tokens",
                         "initialize_cache"})


def _side(function: str, file: str = "") -> str | None:
    """``"load"`` or ``"runtime"``: what an out-of-memory error in ``function`` of vLLM's ``file`` ran after."""
    phase = phase_of_function(function, file)
    if phase in _LOAD_PHASES:
        return "load"
    if phase in _RUNTIME_PHASES or function in _AFTER_LOAD:
        return "runtime"
    return None


def _frames_side(lines: list[LogLine], i: int) -> str | None:
    """What the innermost vLLM frame that tells it says, of the traceback the error on line ``i`` ends (read
    back to its ``Traceback`` line, at most 400 lines), else of the traceback that follows it (vLLM logs the
    error, then ``EngineCore failed to start.`` and the traceback), or None."""
    for line in reversed(lines[max(0, i - 400):i]):
        if TRACEBACK.search(line.text):
            break
        m = FRAME.search(line.text)
        if m is not None and (side := _side(m["func"], vllm_path(m["file"]) or "")) is not None:
            return side
    after = lines[i + 1:i + 400]
    start = next((k for k, line in enumerate(after[:5]) if TRACEBACK.search(line.text)), None)
    if start is None:
        return None
    innermost = None
    for line in after[start + 1:]:
        m = FRAME.search(line.text)
        if m is not None:
            innermost = _side(m["func"], vllm_path(m["file"]) or "") or innermost
        elif EXCEPTION.search(line.message):
            break
    return innermost


def oom_phase(lines: list[LogLine], i: int, ready: bool = False) -> str:
    """``"load"``, ``"runtime"`` or ``"unknown"``: when the out-of-memory error on line ``i`` (0-based,
    of :func:`llmtrial.logs.lines.log_lines`) happened. Load when vLLM's message says so ("Failed to load
    model - not enough GPU memory", "Failed to create ... weights"); runtime when the server had
    become ``ready``; else by the phase (:mod:`llmtrial.logs.phases`) of the method a V0 worker names
    ("while processing method load_model"), or of the innermost vLLM frame of its traceback that tells one
    (``load_weights``, ``process_weights_after_loading``, a Marlin repack: load; ``profile_run``,
    ``_dummy_run``, ``capture_model``, the compilation back end, ``execute_model``, the engine's loop:
    runtime); else by vLLM's last start-up line before it (loading started, the weights loaded, graphs
    being captured, the server serving). Without any of that, unknown: an excerpt does not say, and a guess
    would send the operator the wrong way."""
    if _LOAD_MESSAGE.search(lines[i].text):
        return "load"
    if ready:
        return "runtime"
    method = METHOD.search(lines[i].text)
    if method is not None and (side := _side(method["func"])) is not None:
        return side
    side = _frames_side(lines, i)
    if side is not None:
        return side
    for line in reversed(lines[:i]):
        phase = line_phase(line)
        if phase in _LOAD_PHASES:
            return "load"
        if phase in _RUNTIME_PHASES:
            return "runtime"
    return "unknown"


def _first_oom_phase(lines: list[LogLine], ready: bool) -> str | None:
    """The phase of the log's first out-of-memory line (what later ranks print follows from it)."""
    i = next((i for i, line in enumerate(lines) if line.text and OOM_LINE.search(line.text)), None)
    return None if i is None else oom_phase(lines, i, ready)


def _oom_in(phase: str) -> Callable[[list[LogLine], int, bool], bool]:
    return lambda lines, _, ready: _first_oom_phase(lines, ready) == phase


_OOM_AFTER = ("The GPUs ran out of memory after the weights were in, for activations (profiling, CUDA-graph capture or "
              "a large prefill), not for the weights; lower max_num_batched_tokens or max_num_seqs, or lower "
              "gpu_memory_utilization to leave headroom outside vLLM's budget (enforce_eager saves the CUDA-graph "
              "memory too).")
_OOM_LOAD = ("The GPUs ran out of memory while loading the model; use more GPUs (a larger tensor_parallel_size), a "
             "smaller or quantised model, or free the GPUs of other processes (gpu_memory_utilization does not limit "
             "what loading takes).")

#: Known failure patterns, most specific first; :func:`diagnose_failure` tries them in this order and
#: only then falls back to ``unknown`` with the last exception or ERROR line.
FAILURE_PATTERNS: tuple[FailurePattern, ...] = (
    FailurePattern(
        "tp_divisibility",
        _spaced(r"must be divisible by tensor parallel size", r"is not divisible by (?:the )?tensor parallel size",
                # vllm/distributed/utils.py (ensure_divisibility, 0.32.0: line 54; a vocabulary or a layer split over TP)
                r"(?:^|\s)\d+ is not divisible by \d+\.?$",
                r"Weight input_size_per_partition=\d+ is not divisible by"),
        "A model dimension (the attention heads, KV heads or vocabulary) is not divisible by the tensor parallel "
        "size; choose a tensor_parallel_size that divides it (e.g. 1, 2, 4 or 8).",
        wraps=True,
    ),
    FailurePattern(
        "gpus_too_few",
        # vllm/v1/worker/gpu_worker.py (0.32.0: lines 484-494): a data-parallel rank beyond the visible GPUs
        _any(r"DP adjusted local rank \d+ is out of bounds", r"local_world_size \(\d+\) exceeds assigned_physical_gpu_ids"),
        "The configuration asks for more GPUs (data_parallel_size x tensor_parallel_size x pipeline_parallel_size) "
        "than the server sees; lower a parallel size or make more GPUs visible (CUDA_VISIBLE_DEVICES, hardware.gpus).",
    ),
    FailurePattern(
        "free_memory_below_utilization",
        # vllm/v1/worker/utils.py (0.10 on): free memory at start-up below gpu_memory_utilization x total
        _spaced(r"Free memory on device [^(]*\([^)]*\) on startup is less than desired GPU memory utilization"),
        "Other processes hold part of the GPU, so the free memory at start-up is below what "
        "gpu_memory_utilization asks of the whole card; stop them (the GPU census names them) or lower "
        "gpu_memory_utilization to the free fraction.",
        wraps=True,
    ),
    FailurePattern(
        "memory_profiling_error",
        # vllm/v1/worker/gpu_worker.py: the free memory grew while vLLM profiled
        _any(r"Error in memory profiling\. Initial free memory"),
        "Another process on the GPU released memory while vLLM profiled its own use, so vLLM could not tell its "
        "budget; run the server on GPUs no other process uses (or after they settle), or give --kv-cache-memory.",
    ),
    FailurePattern("runtime_oom", OOM_LINE, _OOM_AFTER, accept=_oom_in("runtime")),
    FailurePattern("weights_oom", OOM_LINE, _OOM_LOAD, accept=_oom_in("load")),
    FailurePattern(
        "oom",
        OOM_LINE,
        "The GPUs ran out of memory, and the log does not show whether while the weights loaded or after; look "
        "for the last start-up line before it: without 'Model loading took', use more GPUs or a smaller model; "
        "after it, lower max_num_batched_tokens, max_num_seqs or gpu_memory_utilization.",
        accept=_oom_in("unknown"),
    ),
    FailurePattern(
        "kv_cache_too_small",
        _spaced(
            r"is larger than the maximum number of tokens that can be stored in KV cache",  # V0
            r"KV cache is needed, which is larger than the available KV cache memory",  # V1
            r"To serve at least one request with the models?'s max seq len",
        ),
        "The KV cache holds fewer tokens than one request of max_model_len; lower max_model_len (vLLM logs the "
        "largest that fits), raise gpu_memory_utilization, or add GPUs (tensor_parallel_size).",
        wraps=True,
    ),
    FailurePattern(
        "no_kv_memory",
        _any(r"No available memory for the cache blocks", r"Available KV cache memory: -\d"),
        "No memory is left for the KV cache after loading the weights; raise gpu_memory_utilization, lower "
        "max_model_len, or add GPUs (tensor_parallel_size).",
    ),
    FailurePattern(
        "max_model_len_exceeds_model",
        _any(r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len"),
        "max_model_len is above the context the model was trained for (max_position_embeddings in config.json); "
        "lower it, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 only with a RoPE scaling that supports the length.",
    ),
    FailurePattern(
        "model_files_unreachable",
        # transformers/utils/hub.py and huggingface_hub's errors: the model's files neither cached nor reachable
        _any(r"We couldn't connect to '[^']+' to load the files", r"Cannot access gated repo",
             r"Repository Not Found for url", r"is not a local folder and is not a valid model identifier"),
        "The model's files are neither in the local cache nor reachable on the Hub (offline, a gated repository, "
        "a wrong name); stage the weights first (model.source) and serve the local folder, or give HF_TOKEN for a "
        "gated model.",
    ),
    FailurePattern(
        "argparse",
        _any(r"(?:^|\s)(?![\w.]*(?:Error|Exception|Warning):)[\w.\-/]+(?: [\w.\-]+)?: error: "),
        "vLLM rejected a command-line argument; check the flag name and value against "
        "`vllm serve --help` for the installed vLLM version.",
    ),
    FailurePattern(
        "unsupported_dtype",
        _any(r"Bfloat16 is only supported on GPUs with compute capability", r"does not support (?:the )?bfloat16"),
        "This GPU cannot compute in bfloat16 (compute capability below 8.0); serve with dtype float16.",
    ),
    FailurePattern(
        "unsupported_quantization",
        _any(r"[Qq]uantization method \S+ is not supported for the current GPU", r"Unknown quantization method",
             r"is not supported for quantization method", r"Unsupported quantization method"),
        "The checkpoint's quantization (or the --quantization asked) has no kernel in this vLLM or on this GPU "
        "(each method has a minimum compute capability); pick a checkpoint quantized for this GPU, another "
        "quantization, or a vLLM that supports it.",
    ),
    FailurePattern(
        "unsupported_architecture",
        _any(r"Model architectures? \[[^\]]*\] (?:are|is) not supported", r"Model architectures? \[[^\]]*\] failed",
             # transformers/models/auto/configuration_auto.py: a model type newer than the installed Transformers
             r"Transformers does not recognize this architecture"),
        "This vLLM has no implementation of the model's architecture (config.json's architectures); use a vLLM "
        "release that lists it, or the model's own plugin.",
    ),
    FailurePattern(
        "unsupported_gpu_arch",
        _any(r"no kernel image is available for execution on the device",
             r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation",
             r"FlashAttention only supports Ampere GPUs or newer",
             r"fp8e4nv data type is not supported on CUDA arch"),
        "The installed torch or vLLM was not built for this GPU's architecture (a new GPU on an older build); "
        "install a build that includes its compute capability (e.g. CUDA 12.8+ wheels for sm_120).",
    ),
    FailurePattern(
        "deepgemm",
        # seed 003's DeepGEMM layout assertion, and DeepGEMM's host assertions of its JIT runtime
        _any(r"Unknown SF transformation", r"Assertion error \([^)]*(?:deepgemm|deep_gemm|jit_kernels|/jit/)[^)]*\): \S",
             r"\bDeepGEMM\b[^.]*\b(?:failed|error|not supported|assert)"),
        "DeepGEMM (vLLM's FP8 block-scaled GEMM) failed on this GPU (an unsupported scale-factor layout or a JIT "
        "kernel it could not build); disable it with VLLM_USE_DEEP_GEMM=0 to use vLLM's own FP8 kernels, or "
        "use a vLLM build made for this GPU.",
    ),
    FailurePattern(
        "kernel_jit",
        _any(r"OutOfResources: out of resource", r"triton\.compiler\.errors\.\w+Error", r"ninja: build stopped",
             r"Assertion `[^`']+' failed"),
        "A kernel could not be compiled or launched on this GPU (Triton's shared memory above the hardware limit, "
        "a JIT build, a kernel assertion); choose another attention backend or kernel (VLLM_ATTENTION_BACKEND, "
        "a different quantization), or a vLLM release that supports this GPU.",
    ),
    FailurePattern(
        "cpu_attention",
        _any(r"Unsupported CPU attention configuration", r"Torch SDPA does not support", r"Torch SPDA does not support"),
        "The CPU backend does not support this attention configuration; change dtype or "
        "block size, or run the model on a GPU.",
    ),
    FailurePattern(
        "numa_bind",
        _any(r"Not enough allowed NUMA nodes to bind threads"),
        "There are fewer allowed NUMA nodes than CPU workers; lower the parallel size or "
        "set VLLM_CPU_OMP_THREADS_BIND to CPUs the process may use.",
    ),
    FailurePattern(
        "port_in_use",
        _any(r"(?i:address already in use)"),
        "The server's port is already taken; stop the process holding it or choose a free port.",
    ),
    # Across nodes: the root causes first (versions, interface), then who did not join, then
    # what waited for them (a placement group, a collective).
    FailurePattern(
        "node_version_mismatch",
        # Ray's check_version_info, raised when a node joins a cluster started under another
        # Ray or Python (patch level included by default), or only warned about.
        _any(r"(?:Python patch )?[Vv]ersion mismatch: The cluster was started with"),
        "A node runs another Ray or Python version than the head node, and Ray will not join them; "
        "install the same Python (to the patch level) and Ray on every node.",
    ),
    FailurePattern(
        "socket_interface",
        # gloo's TCP device (third_party/gloo/gloo/transport/tcp/device.cc:84 in torch 2.13).
        _any(r"Unable to find address for:? \S+"),
        "The network interface named by GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME does not exist or "
        "has no address on this node; name the interface `ip addr` shows with the address the other "
        "nodes reach.",
    ),
    FailurePattern(
        "node_not_joined",
        _any(
            # c10d's TCPStore on the master when not every rank connected in time
            r"Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined",
            # vLLM's data-parallel start-up still waiting for engines on other nodes
            r"Waiting for \d+ local, [1-9]\d* remote core engine proc\(s\) to (?:connect|start)",
        ),
        "Not every node joined the rendezvous in time; start the missing nodes with the same "
        "--nnodes, --master-addr and --master-port, and check that each reaches the master's "
        "address and port.",
    ),
    FailurePattern(
        "master_unreachable",
        # c10d's TCPStore client on a node that cannot reach the master
        _any(
            r"The client socket has (?:timed out after \S+ while trying to connect|failed to connect) to",
            r"TCP client failed to connect/validate to host \S+ - timed out",
        ),
        "This node could not reach the master's rendezvous port; check --master-addr and "
        "--master-port, that the first node is up, and that no firewall drops the connection.",
    ),
    FailurePattern(
        "no_gpu",
        # torch's CUDA init where the process sees no GPU (container without --gpus, CUDA_VISIBLE_DEVICES,
        # a node of a Ray cluster without GPUs) or no driver
        _any(r"No CUDA GPUs are available", r"Found no NVIDIA driver on your system",
             r"Failed to infer device type"),
        "The server's process sees no GPU: check CUDA_VISIBLE_DEVICES, that the container was given the GPUs "
        "(--gpus all, the NVIDIA runtime), that nvidia-smi works where it runs, and under Ray that the node "
        "running the driver has GPUs.",
    ),
    FailurePattern(
        "ray_driver_no_gpu",
        # vllm/executor/ray_utils.py and ray_gpu_executor.py (V0): the driver's node holds none of the GPUs
        _any(r"Ray does not allocate any GPUs on the driver node", r"Current node has no GPU available"),
        "vLLM's driver process runs on a node where Ray placed no GPU worker; start the server on a GPU node of "
        "the Ray cluster (the head node with GPUs), or set VLLM_HOST_IP to the address Ray knows that node by.",
    ),
    FailurePattern(
        "ray_placement_group",
        # vLLM's Ray executor (v1/executor/ray_utils.py) and data-parallel placement (v1/engine/utils.py)
        _any(
            r"Waiting for creating a placement group of specs for \d+ seconds",
            r"Cannot provide a placement group (?:requiring|of)",
            r"Not enough resources to allocate \d+ placement groups",
        ),
        "Ray never created the placement group: the cluster lacks the GPUs or nodes the configuration "
        "asks for (a node did not join, or has fewer GPUs); check `ray status` and `ray list nodes`, "
        "and that VLLM_HOST_IP on each node is the address Ray uses.",
    ),
    FailurePattern(
        "nccl_shm",
        # NCCL's shared-memory transport (shmutils.cc) when /dev/shm is too small: a container's default 64 MB
        _any(r"Error while creating shared memory segment /dev/shm/nccl", r"failed to extend /dev/shm/nccl",
             r"/dev/shm/nccl-\S+.*No space left on device"),
        "NCCL could not create its shared-memory segment in /dev/shm, which is too small (a container's default "
        "64 MB); give the container more (docker --shm-size 16g or --ipc=host, a memory-backed emptyDir on "
        "Kubernetes), or set NCCL_SHM_DISABLE=1 at a cost in speed.",
    ),
    FailurePattern(
        "nccl_error",
        # torch's c10d raising what NCCL returned (DistBackendError: "NCCL error in: .../NCCLUtils.cpp:77,
        # remote process exited or there was a network error, NCCL version 2.26.2") and NCCL's result names
        _any(r"NCCL error in: \S+", r"\bnccl(?:System|Remote|Internal|UnhandledCuda|InvalidUsage)Error\b",
             # c10d's message of NCCL's result (0.5-era torch prints the code: "NCCL Error 2: unhandled system error")
             r"NCCL [Ee]rror(?: \d+)?: (?:unhandled|internal|invalid|remote|system)",
             r"\bNCCL WARN (?:Cuda failure|Call to \w+ failed|NET/\w+ : )"),
        "NCCL failed between the workers (its transport, the network, or a peer that exited); rerun with "
        "NCCL_DEBUG=INFO to see the transport it chose, pin NCCL_SOCKET_IFNAME to the interface the nodes "
        "reach each other on, set NCCL_IB_DISABLE=1 where there is no working InfiniBand, and check /dev/shm "
        "on a single node.",
    ),
    FailurePattern(
        "collective_timeout",
        _any(
            # NCCL's watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp)
            r"Watchdog caught collective operation timeout",
            # gloo's TCP transport (third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78)
            r"Timed out waiting \d+ms for (?:recv|send) operation to complete",
            # torch's c10d when the watchdog tears the process down
            r"Some NCCL operations have failed or timed out",
        ),
        "A collective between the workers timed out: a rank on another node stopped answering or "
        "the link between the nodes is down; read that node's log, and check NCCL_SOCKET_IFNAME or "
        "GLOO_SOCKET_IFNAME on each node (and NCCL_IB_DISABLE=1 where there is no InfiniBand).",
    ),
    FailurePattern(
        "nccl_watchdog_stuck",
        # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (the heartbeat monitor's message)
        _any(r"ProcessGroupNCCL's watchdog got stuck for \d+ seconds"),
        "A NCCL or CUDA call hung on a rank so long that NCCL's watchdog itself stopped (a GPU fault, or "
        "a collective one rank never joined); check the kernel log of each node for Xid errors and each "
        "rank's log for its first error.",
    ),
    FailurePattern(
        "ray_unsupported_platform",
        # vllm/v1/executor/ray_utils.py: the platform has no Ray device key (vLLM's CPU build)
        _any(r"current platform \w+ does not support ray"),
        "This build of vLLM cannot run its Ray executor on this platform (the CPU build has no Ray "
        "device); serve the configuration with vLLM's native multi-node launch (launch: native).",
    ),
    FailurePattern(
        "peer_lost",
        _any(
            # gloo's TCP transport when the other end of a pair went away, both seen when a
            # headless rank on another node was killed (third_party/gloo/gloo/transport/tcp/
            # pair.cc:537 "Read error [10.0.0.2]:26258: Connection reset by peer", pair.cc:553
            # "Connection closed by peer [10.0.0.2]:15520")
            r"gloo/transport/tcp/pair\.cc:\d+\] (?:(?:Read|Write) error \[[^\]]+\]:\d+: Connection reset by peer"
            r"|Connection closed by peer \[[^\]]+\]:\d+)",
        ),
        "A worker on another node went away in the middle of a collective (its process died or the link "
        "dropped): read that node's log for why it stopped; this node's engine stopped because of it.",
    ),
    # Last of the known ones: symptoms (a rank hung or died), not causes of their own.
    FailurePattern(
        "engine_handshake_timeout",
        # vllm/v1/engine/core_client.py (the API server waits for the engines' first message) and
        # vllm/v1/engine/core.py (startup_handshake: the engine waits for the front end); the one-word
        # "sendinitial" is vLLM's own joined string (vllm#32116, vllm-ascend#3977)
        _any(r"Timed out waiting for engines to send ?initial message on input socket",
             r"Did not receive response from front-end process within \d+ minutes?",
             r"Timed out waiting for engine core processes to start"),
        "The API server and its engine core never finished their start-up handshake: the engine did not come up "
        "within vLLM's limit (VLLM_ENGINE_READY_TIMEOUT_S), or, across nodes or data-parallel ranks, could not "
        "reach the front end's address and ports; look for the engine's own error above or in each rank's log, "
        "and check that every node can reach the others (data_parallel_address, the RPC port, firewalls).",
    ),
    FailurePattern(
        "rpc_timeout",
        # vllm/v1/executor/multiproc_executor.py (collective_rpc, 0.32.0: line 442): a worker did not
        # answer within VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS; shm_broadcast.py's acquire_read raises a bare
        # TimeoutError first (vllm#22479, #23582, vllm-ascend#2264, Mooncake#1458)
        _any(r"RPC call to \w+ timed out", r"(?:^|\s)TimeoutError\s*$"),
        "The engine gave up waiting for a worker over the shared-memory message queue: the worker hung (stuck in a "
        "collective or a kernel) or died; find the first error or watchdog line of each rank, and raise "
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS only when a step is legitimately that slow.",
        accept=lambda lines, i, _ready: "RPC call" in lines[i].text or _raised_in_message_queue(lines, i),
    ),
    FailurePattern(
        "shm_broadcast",
        # vllm/distributed/device_communicators/shm_broadcast.py: 0.6.x wording, then the current one
        _any(r"No available shared memory broadcast block found", r"No available block found in \d+ seconds?"),
        "Workers stopped answering over shared memory, so one rank hung or died; look for "
        "its error earlier in the log and check /dev/shm size.",
    ),
    FailurePattern(
        "engine_start_failed",
        # vllm/v1/engine/utils.py (wait_for_engine_startup): the engine core process exited during start-up and
        # this log names no failed process and holds no error of its own (vllm#23176, #31940, gpustack#2723)
        _any(r"Engine core initialization failed\. See root cause above\. Failed core proc\(s\): \{\}"),
        "The engine core exited while starting, and this log holds neither its error nor the process that failed "
        "(\"Failed core proc(s): {}\"): its own output went elsewhere (another rank's or container's log, a "
        "terminal) or it was killed (the kernel's OOM killer: check dmesg); rerun with its output kept.",
        accept=lambda lines, _i, _ready: _only_wrappers(lines),
    ),
)


#: A line logged at ERROR level (the exception lines are :data:`llmtrial.logs.lines.EXCEPTION`).
_ERROR_LEVEL = re.compile(r"(?:^|\s)ERROR(?:\s|:|$)")
#: Exceptions that only point elsewhere; used only when no other exception line exists.
WRAPPER = re.compile(r"See root cause above|Engine core initialization failed|See stack trace|"
                      r"WorkerProc initialization failed|Engine loop is not running|Background loop has errored")

_UNKNOWN = ("No known failure explains this log; this is the last error line it shows. Read the traceback and "
            "the lines above it for the cause.")


def _raised_in_message_queue(lines: list[LogLine], i: int) -> bool:
    """Whether the exception on line ``i`` was raised in vLLM's shared-memory message queue (a frame of
    ``shm_broadcast.py`` among the few lines above it)."""
    return any("shm_broadcast.py" in line.text for line in lines[max(0, i - 6):i])


def _only_wrappers(lines: list[LogLine]) -> bool:
    """Whether every exception line of the log only points elsewhere (:data:`WRAPPER`)."""
    return all(WRAPPER.search(line.text) for line in lines if line.text and EXCEPTION.search(line.message))


def _last_error(lines: list[LogLine]) -> int | None:
    """The last exception line (preferring ones that are not mere wrappers), else the last ERROR-level
    line, as an index of ``lines``."""
    exceptions = [i for i, line in enumerate(lines) if line.text and EXCEPTION.search(line.message)]
    if exceptions:
        causes = [i for i in exceptions if not WRAPPER.search(lines[i].text)]
        return (causes or exceptions)[-1]
    errors = [i for i, line in enumerate(lines) if _ERROR_LEVEL.search(line.text)]
    return errors[-1] if errors else None


def diagnose_failure(
    text: str,
    source: str = "server.log",
    *,
    patterns: tuple[FailurePattern, ...] = FAILURE_PATTERNS,
    ready: bool = False,
) -> dict[str, str] | None:
    """The log line that explains why a vLLM server failed, or ``None`` when it shows no error.

    Returns ``{"line", "source": "<source>:<lineno>", "pattern", "diagnosis"}``. The known
    ``patterns`` are tried in order and the first line matching the first pattern that matches
    anywhere wins, so a specific cause beats a generic error printed later. Without a known
    pattern: ``pattern="unknown"`` with the last Python exception line, else the last ERROR-level
    line. ``ready``: the server had answered /health before it failed (an out-of-memory error is
    then a runtime one, see :func:`oom_phase`).
    """
    lines = log_lines(text)
    for pattern in patterns:
        found = pattern.find(lines, ready)
        if found is not None:
            i, line = found
            return {"line": line, "source": f"{source}:{i + 1}", "pattern": pattern.name,
                    "diagnosis": pattern.diagnosis}
    i = _last_error(lines)
    if i is None:
        return None
    return {"line": lines[i].text, "source": f"{source}:{i + 1}", "pattern": "unknown", "diagnosis": _UNKNOWN}
