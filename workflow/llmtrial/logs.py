"""Read a vLLM server's log: startup facts and the reason a server failed.

vLLM's log format changes between releases: the prefix in front of a message may be
``(EngineCore pid=558) INFO 08-21 18:21:55 [kv_cache_utils.py:2235] ``,
``(Worker_TP0 pid=770) INFO ...``, ``INFO 06-19 23:05:01 [...] `` or nothing at all,
lines may carry ANSI colour codes, and some messages were merged or reworded. So every
pattern here is searched *anywhere* in an ANSI-stripped line, and each one accepts the
wordings seen so far.

* :func:`parse_startup` turns the startup log into facts (see :func:`llmtrial.records.fact`)
  whose ``source`` is ``"<file>:<line>"`` (1-based), so a reader can open the very line.
* :func:`diagnose_failure` finds the line that explains why a server died, and says
  what to change. Its known patterns live in :data:`FAILURE_PATTERNS`, in priority
  order, so other code can extend the tuple. An out-of-memory error is told apart by
  when it happened (:func:`oom_phase`): while loading the weights, or after.
* :func:`tail` gives the last lines of a log for a report.

Line numbers count ``\\n``-separated lines, as ``sed -n Np`` and editors do. Within a
line, carriage returns (progress bars redrawing themselves) are resolved the way a
terminal shows them: the last non-empty ``\\r``-separated segment is the line's text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmtrial.records import fact

__all__ = [
    "AVAIL_KV",
    "CPU_KV_SPACE",
    "MODEL_INIT",
    "FAILURE_PATTERNS",
    "FailurePattern",
    "INIT_ENGINE",
    "KV_TOKENS",
    "LOAD_WTS",
    "MAX_CONC",
    "MAX_MODEL_LEN",
    "MEMORY_PROFILE",
    "MODEL_LOAD",
    "VLLM_VERSION",
    "diagnose_failure",
    "find_lines",
    "oom_phase",
    "parse_startup",
    "read_log",
    "strip_ansi",
    "tail",
]

# --------------------------------------------------------------------------- text

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves (ESC [ ... final byte)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: ESC ] ... BEL or ESC \
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
)

#: The logger prefix vLLM puts before a message, in any of the forms seen so far:
#: an optional ``(ProcName pid=N[, ip=...])``, an optional level, an optional
#: ``MM-DD HH:MM:SS`` time and an optional ``[file.py:line]``.
_PREFIX = re.compile(
    r"^(?:\([^)]*\)\s+)?"
    r"(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?:\d\d-\d\d\s+\d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?"
    r"(?:\[[^\]]*\]\s*)?)?"
)


def read_log(path: str | os.PathLike[str]) -> str:
    """A log file's text with its line breaks as written.

    ``Path.read_text`` turns the ``\r`` of progress bars into line breaks, which would
    shift line numbers away from what ``sed -n Np`` shows; this keeps them.
    """
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        return fh.read()


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colours, cursor movement) from ``text``."""
    return _ANSI.sub("", text)


def _clean(raw: str, keep_indent: bool = False) -> str:
    """One raw log line as a terminal shows it: ANSI removed, ``\\r`` resolved, stripped
    (trailing whitespace only, with ``keep_indent``)."""
    segments = [s for s in strip_ansi(raw).split("\r") if s.strip()]
    if not segments:
        return ""
    return segments[-1].rstrip() if keep_indent else segments[-1].strip()


def _lines(text: str) -> list[str]:
    """All lines of ``text``, cleaned; index ``i`` is line number ``i + 1``."""
    return [_clean(raw) for raw in text.split("\n")]


#: The process a line came from: ``(EngineCore pid=558)``, ``(Worker_TP0 pid=770)``.
_PROCESS = re.compile(r"^\((?P<process>[^\s()]+) pid=(?P<pid>\d+)")


def find_lines(text: str, regex: re.Pattern[str], source: str = "server.log") -> list[dict[str, Any]]:
    """Every line where ``regex`` matches: the cleaned line, ``"<source>:<lineno>"`` and the
    vLLM process that logged it (``process`` and ``pid`` from the prefix, or None)."""
    out = []
    for lineno, line in enumerate(_lines(text), start=1):
        if line and regex.search(line):
            m = _PROCESS.match(line)
            out.append({"line": line, "source": f"{source}:{lineno}", "process": m["process"] if m else None,
                        "pid": int(m["pid"]) if m else None})
    return out


def _message(line: str) -> str:
    """A cleaned line without its logger prefix (process, level, time, ``[file:line]``)."""
    m = _PREFIX.match(line)
    return line[m.end():].lstrip() if m else line


# ------------------------------------------------------------------ startup facts

_NUM = r"\d+(?:\.\d+)?"

MODEL_LOAD = re.compile(
    rf"Model loading took (?P<gib>-?{_NUM}) GiB(?: memory)? and (?P<sec>{_NUM}) seconds"
)
AVAIL_KV = re.compile(rf"Available KV cache memory: (?P<gib>-?{_NUM}) GiB")
KV_TOKENS = re.compile(r"\b(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens")
MAX_CONC = re.compile(rf"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>{_NUM})x")
INIT_ENGINE = re.compile(
    rf"init engine \(profile, create kv cache, warmup model\) took (?P<sec>{_NUM}) (?:s|seconds)\b"
)
LOAD_WTS = re.compile(rf"Loading weights took (?P<sec>{_NUM}) seconds")
MAX_MODEL_LEN = re.compile(r"Using max model len (?P<len>[\d,]+)")
#: "vLLM API server version X" (older) or the banner's "... version X" (0.2x and later).
VLLM_VERSION = re.compile(r"(?:vLLM API server version|\u2588\s+version) (?P<version>\d[\w.+\-]*\w)")
#: CPU build: the KV space it was told to use, per worker ("Explicitly set (1.0/8.21) GiB ...").
CPU_KV_SPACE = re.compile(rf"Explicitly set \((?P<gib>{_NUM})/(?P<total>{_NUM})\) GiB for KV cache")
#: GPU workers of recent vLLM: the memory profile, term by term ("Free memory on device (94.05/95.01
#: GiB) on startup. Desired GPU memory utilization is (0.9, 85.51 GiB). Actual usage is 56.89 GiB for
#: consumed memory (weights + non-torch), 0.76 GiB for peak activation, and 0.32 GiB for CUDAGraph
#: memory. ... Current kv cache memory in use is 27.85 GiB.").
MEMORY_PROFILE = re.compile(
    rf"Free memory on device \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on startup\. "
    rf"Desired GPU memory utilization is \((?P<util>{_NUM}), (?P<requested>{_NUM}) GiB\)\. "
    rf"Actual usage is (?P<consumed>{_NUM}) GiB for consumed memory \(weights \+ non-torch\), "
    rf"(?P<activation>{_NUM}) GiB for peak activation, and (?P<graphs>{_NUM}) GiB for CUDAGraph memory\."
    rf"(?:.*Current kv cache memory in use is (?P<kv>-?{_NUM}) GiB)?"
)
#: CPU build and newer loaders: building the model before its weights are read.
MODEL_INIT = re.compile(rf"Initializing model took (?P<sec>{_NUM}) seconds")


def _int(s: str) -> int:
    return int(s.replace(",", ""))


#: For each pattern: the facts it yields as ``(key, group, converter, unit)``.
_STARTUP: tuple[tuple[re.Pattern[str], tuple[tuple[str, str, Callable[[str], Any], str | None], ...]], ...] = (
    (MODEL_LOAD, (("model_load_gib", "gib", float, "GiB"), ("model_load_seconds", "sec", float, "s"))),
    (LOAD_WTS, (("loading_weights_seconds", "sec", float, "s"),)),
    (AVAIL_KV, (("available_kv_gib", "gib", float, "GiB"),)),
    (CPU_KV_SPACE, (("available_kv_gib", "gib", float, "GiB"),)),
    (MODEL_INIT, (("model_init_seconds", "sec", float, "s"),)),
    (KV_TOKENS, (("kv_cache_tokens", "tokens", _int, "tokens"), ("kv_pool", "pool", str, None))),
    (
        MAX_CONC,
        (
            ("max_concurrency", "x", float, "x"),
            ("max_concurrency_tokens_per_request", "len", _int, "tokens"),
        ),
    ),
    (INIT_ENGINE, (("engine_init_seconds", "sec", float, "s"),)),
    (
        MEMORY_PROFILE,
        (
            ("gpu_free_on_startup_gib", "free", float, "GiB"),
            ("gpu_total_gib", "total", float, "GiB"),
            ("gpu_requested_gib", "requested", float, "GiB"),
            ("consumed_gib", "consumed", float, "GiB"),
            ("peak_activation_gib", "activation", float, "GiB"),
            ("cuda_graph_gib", "graphs", float, "GiB"),
            ("kv_cache_in_use_gib", "kv", float, "GiB"),
        ),
    ),
    (MAX_MODEL_LEN, (("max_model_len", "len", _int, "tokens"),)),
    (VLLM_VERSION, (("vllm_version", "version", str, None),)),
)


def parse_startup(text: str, source: str = "server.log") -> dict[str, dict[str, Any]]:
    """Facts read from a vLLM server's startup log, keyed by name (only those found).

    Each value is ``fact(value, "<source>:<lineno>", unit=...)`` plus ``"line"`` (the
    ANSI-stripped log line it came from). When a fact appears on several lines (each
    tensor-parallel worker prints its own ``Model loading took ...``), the first one is
    the value and ``"per_rank"`` lists every value in log order.

    Keys: ``model_load_gib``, ``model_load_seconds``, ``loading_weights_seconds``,
    ``available_kv_gib``, ``kv_cache_tokens``, ``kv_pool`` (``"GPU"``, ``"CPU"``,
    ``"GPU + host"``, ...), ``max_concurrency``, ``max_concurrency_tokens_per_request``,
    ``engine_init_seconds``, ``max_model_len``, ``vllm_version``; on the CPU build also
    ``model_init_seconds`` and ``available_kv_gib`` from the KV space it was given. From a
    GPU worker's memory profile line: ``gpu_free_on_startup_gib``, ``gpu_total_gib``,
    ``gpu_requested_gib``, ``consumed_gib`` (weights + non-torch), ``peak_activation_gib``,
    ``cuda_graph_gib``, ``kv_cache_in_use_gib``, and ``non_torch_gib`` (consumed less the
    ``Model loading took`` figure, with ``derived`` saying so).
    """
    facts: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(_lines(text), start=1):
        if not line:
            continue
        for regex, fields in _STARTUP:
            m = regex.search(line)
            if m is None:
                continue
            for key, group, convert, unit in fields:
                if m.group(group) is None:
                    continue
                value = convert(m.group(group))
                if key not in facts:
                    facts[key] = {**fact(value, f"{source}:{lineno}", unit=unit), "line": line}
                else:
                    first = facts[key]
                    first.setdefault("per_rank", [first["value"]]).append(value)
    consumed, loaded = facts.get("consumed_gib"), facts.get("model_load_gib")
    if consumed and loaded:  # non-torch memory: what the memory profile counts beyond the weights
        facts["non_torch_gib"] = {**fact(round(consumed["value"] - loaded["value"], 2), consumed["source"], unit="GiB"),
                                  "line": consumed["line"], "derived": f"consumed_gib - model_load_gib ({loaded['source']})"}
    return facts


# ------------------------------------------------------------------ failure causes


@dataclass(frozen=True)
class FailurePattern:
    """A known way for a vLLM server to fail.

    ``regex`` is searched in each ANSI-stripped line; the first line that matches is
    the explanation. With ``join_next`` the line is also tried joined to the next one,
    for messages that wrap (the match must start on the first line). With ``accept``, a
    matching line counts only where ``accept(lines, index, ready)`` is true (``ready``:
    the server had answered /health before it failed).
    """

    name: str
    regex: re.Pattern[str]
    diagnosis: str
    join_next: bool = False
    accept: Callable[[list[str], int, bool], bool] | None = None

    def find(self, lines: list[str], ready: bool = False) -> tuple[int, str] | None:
        """The 0-based index and text of the first line matching (and accepted), or ``None``."""
        for i, line in enumerate(lines):
            if not line:
                continue
            text = self._match(lines, i)
            if text is not None and (self.accept is None or self.accept(lines, i, ready)):
                return i, text
        return None

    def _match(self, lines: list[str], i: int) -> str | None:
        """Line ``i`` when it matches, or it joined to the next when that matches from line ``i``."""
        line = lines[i]
        if self.regex.search(line):
            return line
        if self.join_next and i + 1 < len(lines) and lines[i + 1]:
            joined = f"{line} {lines[i + 1]}"
            m = self.regex.search(joined)
            if m is not None and m.start() < len(line):
                return joined
        return None


def _any(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


#: Out of memory while the weights load asks for more GPUs; after them, for smaller batches or headroom.
_OOM = r"(?:CUDA|HIP) out of memory"
_OOM_LINE = re.compile(rf"Failed to load model - not enough GPU memory|{_OOM}")
#: A traceback frame: ``File "...", line N, in <function>``.
_FRAME = re.compile(r'File "[^"]+", line \d+, in (?P<func>[\w<>]+)')
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
#: vLLM functions that run once the weights are in: profiling and warm-up (v1 gpu_model_runner.py
#: and gpu_worker.py in 0.32.0, v0 worker.py), CUDA-graph capture, and each step while serving.
_RUNTIME_FRAMES = frozenset({"profile_run", "_dummy_run", "_dummy_sampler_run", "_dummy_pooler_run",
                             "determine_available_memory", "determine_num_available_blocks", "capture_model",
                             "compile_or_warm_up_model", "execute_model", "sample_tokens", "run_busy_loop"})
#: vLLM functions that load the weights (model loaders and the model runner's load_model).
_LOAD_FRAMES = frozenset({"load_model", "get_model", "load_weights", "process_weights_after_loading"})
#: Lines that say the weights are all in (v1 and v0 wordings) or that the server is serving.
_LOADED = _any(MODEL_LOAD.pattern, r"Loading model weights took", r"Application startup complete")


def _innermost_frame(lines: list[str], i: int) -> str | None:
    """The innermost load or runtime function in the traceback that ends at line ``i`` (read up to
    its ``Traceback`` line, at most 400 lines back), or None."""
    for line in reversed(lines[max(0, i - 400):i]):
        if _TRACEBACK.search(line):
            return None
        m = _FRAME.search(line)
        if m is not None and m["func"] in _RUNTIME_FRAMES | _LOAD_FRAMES:
            return m["func"]
    return None


def oom_phase(lines: list[str], i: int, ready: bool = False) -> str:
    """``"load"`` or ``"runtime"``: when the out-of-memory error on line ``i`` (0-based, of cleaned
    lines) happened. Runtime when the server had become ``ready``; else by the innermost vLLM frame
    of its traceback (``profile_run``, ``_dummy_run``, ``capture_model``, ``execute_model``: runtime;
    ``load_weights``, ``process_weights_after_loading``, ``load_model``: load); else runtime when
    the log said the weights were in (``Model loading took``) before it. vLLM's own "Failed to load
    model - not enough GPU memory" is load."""
    if "Failed to load model" in lines[i]:
        return "load"
    if ready:
        return "runtime"
    func = _innermost_frame(lines, i)
    if func is not None:
        return "runtime" if func in _RUNTIME_FRAMES else "load"
    return "runtime" if any(_LOADED.search(line) for line in lines[:i] if line) else "load"


def _first_oom_phase(lines: list[str], ready: bool) -> str | None:
    """The phase of the log's first out-of-memory line (what later ranks print follows from it)."""
    i = next((i for i, line in enumerate(lines) if line and _OOM_LINE.search(line)), None)
    return None if i is None else oom_phase(lines, i, ready)


#: Known failure patterns, most specific first; :func:`diagnose_failure` tries them in
#: this order and only then falls back to the last exception or ERROR line.
FAILURE_PATTERNS: tuple[FailurePattern, ...] = (
    FailurePattern(
        "tp_divisibility",
        _any(r"must be divisible by\s+tensor\s+parallel\s+size"),
        "A model dimension (usually the attention-head count) is not divisible by the "
        "tensor parallel size; choose a tensor_parallel_size that divides it (e.g. 1, 2, 4 or 8).",
        join_next=True,
    ),
    FailurePattern(
        "runtime_oom",
        # torch's "CUDA out of memory. Tried to allocate ..." under profile_run, capture_model or execute_model,
        # or vLLM's "CUDA out of memory occurred when warming up sampler" (v1/worker/gpu_model_runner.py:5991)
        _any(_OOM),
        "The GPUs ran out of memory after the weights were in, for activations (profiling, CUDA-graph "
        "capture or a large prefill), not for the weights; lower max_num_batched_tokens or max_num_seqs, "
        "or lower gpu_memory_utilization to leave headroom outside vLLM's budget (enforce_eager saves the "
        "CUDA-graph memory too).",
        accept=lambda lines, _, ready: _first_oom_phase(lines, ready) == "runtime",
    ),
    FailurePattern(
        "weights_oom",
        # vLLM's load_model (v1/worker/gpu_model_runner.py, 0.32.0: line 5140) or torch's own error
        # raised while the weights load
        _OOM_LINE,
        "The GPUs ran out of memory while loading the model; use more GPUs (a larger "
        "tensor_parallel_size), a smaller or quantised model, or free the GPUs of other processes "
        "(gpu_memory_utilization does not limit what loading takes).",
        accept=lambda lines, _, ready: _first_oom_phase(lines, ready) == "load",
    ),
    FailurePattern(
        "no_kv_memory",
        _any(
            r"No available memory for the cache blocks",
            r"larger than the available KV cache memory",
            r"larger than the maximum number of tokens that can be stored in KV cache",
            r"Available KV cache memory: -\d",
        ),
        "No memory is left for the KV cache after loading the weights; raise "
        "gpu_memory_utilization, lower max_model_len, or add GPUs (tensor_parallel_size).",
    ),
    FailurePattern(
        "argparse",
        _any(r"(?:^|\s)(?![\w.]*(?:Error|Exception|Warning):)[\w.\-/]+(?: [\w.\-]+)?: error: "),
        "vLLM rejected a command-line argument; check the flag name and value against "
        "`vllm serve --help` for the installed vLLM version.",
    ),
    FailurePattern(
        "deepgemm",
        _any(r"Unknown SF transformation"),
        "DeepGEMM does not support the scaling-factor layout on this GPU; disable it "
        "(VLLM_USE_DEEP_GEMM=0) or use a vLLM build made for this GPU.",
    ),
    FailurePattern(
        "cpu_attention",
        _any(r"Unsupported CPU attention configuration"),
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
        "nccl_error",
        # torch's c10d raising what NCCL returned (DistBackendError: "NCCL error in: .../NCCLUtils.cpp:77,
        # remote process exited or there was a network error, NCCL version 2.26.2") and NCCL's result names
        _any(r"NCCL error in: \S+", r"\bnccl(?:System|Remote|Internal|UnhandledCuda|InvalidUsage)Error\b"),
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
        "rpc_timeout",
        # vllm/v1/executor/multiproc_executor.py (collective_rpc, 0.32.0: line 442): a worker did not
        # answer within VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
        _any(r"RPC call to \w+ timed out"),
        "The engine gave up waiting for a worker, which hung (stuck in a collective or a kernel); find the "
        "first error or watchdog line of each rank, and raise VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS only when "
        "a step is legitimately that slow.",
    ),
    FailurePattern(
        "shm_broadcast",
        _any(r"No available shared memory broadcast block found"),
        "Workers stopped answering over shared memory, so one rank hung or died; look for "
        "its error earlier in the log and check /dev/shm size.",
    ),
)

_EXCEPTION = re.compile(r"^\w+(?:\.\w+)*(?:Error|Exception): ")
_ERROR_LEVEL = re.compile(r"(?:^|\s)ERROR(?:\s|$)")
#: Exceptions that only point elsewhere; used only when no other exception line exists.
_WRAPPER = re.compile(r"See root cause above|Engine core initialization failed")

_GENERIC_EXCEPTION = (
    "The server stopped on this exception; read the traceback above it for the cause."
)
_GENERIC_ERROR = "The server logged this error before stopping; read the lines around it for the cause."


def _generic(lines: list[str]) -> tuple[int, str, str, str] | None:
    """The last exception line (preferring ones that are not mere wrappers), else the
    last ERROR-level line, as ``(index, line, pattern, diagnosis)``."""
    exceptions = [i for i, line in enumerate(lines) if line and _EXCEPTION.search(_message(line))]
    if exceptions:
        causes = [i for i in exceptions if not _WRAPPER.search(lines[i])]
        i = (causes or exceptions)[-1]
        return i, lines[i], "exception", _GENERIC_EXCEPTION
    errors = [i for i, line in enumerate(lines) if _ERROR_LEVEL.search(line)]
    if errors:
        return errors[-1], lines[errors[-1]], "error", _GENERIC_ERROR
    return None


def diagnose_failure(
    text: str,
    source: str = "server.log",
    *,
    patterns: tuple[FailurePattern, ...] = FAILURE_PATTERNS,
    ready: bool = False,
) -> dict[str, str] | None:
    """The log line that explains why a vLLM server failed, or ``None``.

    Returns ``{"line", "source": "<source>:<lineno>", "pattern", "diagnosis"}``. The
    known ``patterns`` are tried in order and the first line matching the first pattern
    that matches anywhere wins, so a specific cause beats a generic error printed later.
    Without a known pattern: the last Python exception line (``pattern="exception"``),
    else the last ERROR-level line (``pattern="error"``). ``ready``: the server had answered
    /health before it failed (an out-of-memory error is then a runtime one, see :func:`oom_phase`).
    """
    lines = _lines(text)
    for pattern in patterns:
        found = pattern.find(lines, ready)
        if found is not None:
            i, line = found
            return {
                "line": line,
                "source": f"{source}:{i + 1}",
                "pattern": pattern.name,
                "diagnosis": pattern.diagnosis,
            }
    generic = _generic(lines)
    if generic is None:
        return None
    i, line, name, diagnosis = generic
    return {"line": line, "source": f"{source}:{i + 1}", "pattern": name, "diagnosis": diagnosis}


def tail(text: str, n: int = 40) -> list[str]:
    """The last ``n`` non-empty lines of ``text``, ANSI-stripped (indentation kept)."""
    if n <= 0:
        return []
    lines = (_clean(raw, keep_indent=True) for raw in text.split("\n"))
    return [line for line in lines if line][-n:]

