"""Start-up figures from a vLLM server's log, in the wordings of every engine generation.

Each figure is a fact (see :func:`llmtrial.core.records.fact`) whose ``source`` is ``"<file>:<line>"``
(1-based, the line where the logged message begins), whose ``unit`` is the unit as logged (GB
stays GB: vLLM's V0 divided bytes by 2**30 and printed "GB", which the fact's ``note`` says;
seconds are ``s`` however spelled) and whose ``line`` is the log line it was read from.

The wordings, by generation (the tests hold real lines of each):

* V0 (0.2-0.7): ``Loading model weights took 14.9888 GB``; ``# GPU blocks: 27798, # CPU blocks:
  2048`` (``# cuda blocks``, ``# xpu blocks``, the CPU backend's ``# CPU blocks``); 0.6's
  ``Memory profiling results: total_gpu_memory=79.15GiB ... kv_cache_size=54.96GiB
  gpu_memory_utilization=0.90``; 0.6.5-0.7's three-line ``Memory profiling takes 5.43 seconds`` /
  ``the current vLLM instance can use total_gpu_memory (79.10GiB) x gpu_memory_utilization (0.90) =
  71.19GiB`` / ``model weights take 14.99GiB; non_torch_memory takes 0.12GiB; PyTorch activation
  peak memory takes 1.23GiB; the rest of the memory reserved for KV Cache is 54.85GiB.``
* V1 (0.8 on): ``Model loading took 14.96 GiB [memory] and 5.3 seconds`` (``GB`` in early ones),
  ``Available KV cache memory: 54.5 GiB``, ``GPU KV cache size: 446,400 tokens``, ``Maximum
  concurrency for 32,768 tokens per request: 13.62x`` (on one line with the size since 0.28),
  0.8-0.9's ``Memory profiling takes ... Total non KV cache memory: ...``, and the memory profile
  ``Free memory on device (F/T GiB) on startup. Desired GPU memory utilization is (u, R GiB).
  Actual usage is ...`` term by term, wherever a terminal wrapped it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmtrial.core.records import fact
from llmtrial.logs.lines import LogLine, continued, log_lines, spaced

__all__ = ["STARTUP_LINES", "StartupLine", "logged_gib", "parse_startup"]

_NUM = r"-?\d+(?:\.\d+)?"
_GB_NOTE = "vLLM computes this figure as bytes / 2**30 (GiB) and labels it GB"


def _int(s: str) -> int:
    return int(s.replace(",", ""))


@dataclass(frozen=True)
class Figure:
    """One figure of a line: its key, the regex group holding it, how to read it, and its unit
    (fixed, or from the group ``unit_group`` as logged)."""

    key: str
    group: str
    convert: Callable[[str], Any] = float
    unit: str | None = None
    unit_group: str | None = None


@dataclass(frozen=True)
class StartupLine:
    """A logged message that carries figures. ``anchor`` finds it in a line; each of ``terms``
    (a regex and the figures its groups give) is searched in its message. With ``wraps``, the
    message is read together with the lines a terminal wrapped it onto, and the terms allow any
    spacing."""

    anchor: re.Pattern[str]
    terms: tuple[tuple[re.Pattern[str], tuple[Figure, ...]], ...]
    wraps: bool = False

    @classmethod
    def one(cls, pattern: str, *figures: Figure) -> StartupLine:
        """A message whose one regex is both its anchor and its only term."""
        regex = re.compile(pattern)
        return cls(regex, ((regex, figures),))

    @classmethod
    def wrapped(cls, anchor: str, *terms: tuple[str, tuple[Figure, ...]]) -> StartupLine:
        """A long message that a terminal may wrap: terms are searched with any spacing."""
        return cls(re.compile(spaced(anchor)), tuple((re.compile(spaced(t)), f) for t, f in terms), wraps=True)


def _gib(key: str, group: str = "v") -> Figure:
    return Figure(key, group, float, "GiB")


def _sec(key: str, group: str = "sec") -> Figure:
    return Figure(key, group, float, "s")


_MEMORY_UNIT = r"(?P<unit>GiB|GB)"

#: Every start-up message read, V1 wordings and V0 ones. Where several messages give the same key
#: (the KV memory of a V1 and a V0 engine), the first line in the log is the value.
STARTUP_LINES: tuple[StartupLine, ...] = (
    StartupLine.one(rf"Model loading took (?P<v>{_NUM}) {_MEMORY_UNIT}(?: memory)? and (?P<sec>{_NUM}) seconds",
                    Figure("model_load_gib", "v", float, unit_group="unit"), _sec("model_load_seconds")),
    StartupLine.one(rf"Loading model weights took (?P<v>{_NUM}) (?P<unit>GiB|GB|MB)\b",
                    Figure("model_load_gib", "v", float, unit_group="unit")),
    StartupLine.one(rf"Loading weights took (?P<sec>{_NUM}) seconds", _sec("loading_weights_seconds")),
    StartupLine.one(rf"Available KV cache memory: (?P<v>{_NUM}) GiB", _gib("available_kv_gib")),
    # CPU build: the KV space it was told to use, per worker ("Explicitly set (1.0/8.21) GiB ...")
    StartupLine.one(rf"Explicitly set \((?P<v>{_NUM})/{_NUM}\) GiB for KV cache", _gib("available_kv_gib")),
    StartupLine.one(rf"Initializing model took (?P<sec>{_NUM}) seconds", _sec("model_init_seconds")),
    StartupLine.one(r"\b(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens",
                    Figure("kv_cache_tokens", "tokens", _int, "tokens"), Figure("kv_pool", "pool", str)),
    StartupLine.one(rf"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>{_NUM})x",
                    Figure("max_concurrency", "x", float, "x"),
                    Figure("max_concurrency_tokens_per_request", "len", _int, "tokens")),
    StartupLine.one(r"(?:# ?|\b)(?:GPU|gpu|cuda|CUDA|xpu|XPU|npu|NPU|hpu|HPU|tpu|TPU|neuron) blocks: (?P<dev>\d+)"
                    r"(?:, # CPU blocks: (?P<cpu>\d+))?",
                    Figure("gpu_blocks", "dev", int, "blocks"), Figure("cpu_blocks", "cpu", int, "blocks")),
    StartupLine.one(r"(?<!, )# CPU blocks: (?P<cpu>\d+)", Figure("cpu_blocks", "cpu", int, "blocks")),
    StartupLine.one(rf"init engine \(profile, create kv cache, warmup model\) took (?P<sec>{_NUM}) (?:s|seconds)\b",
                    _sec("engine_init_seconds")),
    StartupLine.one(rf"Graph capturing finished in (?P<sec>{_NUM}) secs?(?:, took (?P<v>{_NUM}) GiB)?",
                    _sec("cuda_graph_capture_seconds"), _gib("cuda_graph_capture_gib")),
    # "takes" through 0.2x; "took" since (the XPU start-ups of intel-arc-pro-b70-inference-cookbook#4 and #14)
    StartupLine.one(rf"torch\.compile (?:takes?|took) (?P<sec>{_NUM}) s in total", _sec("torch_compile_seconds")),
    # the engine's arguments as vLLM prints them ("non-default args: {..., 'gpu_memory_utilization': 0.85, ...}",
    # vllm/entrypoints/utils.py) or as a launcher prints them (Namespace(...), EngineArgs(...))
    StartupLine.one(rf"(?:non-default args: \{{|args: Namespace\(|EngineArgs\().*?\bgpu_memory_utilization'?(?::\s*|=)"
                    rf"(?P<u>{_NUM})", Figure("gpu_memory_utilization", "u")),
    StartupLine.one(rf"Memory profiling takes (?P<sec>{_NUM}) seconds", _sec("memory_profiling_seconds")),
    StartupLine.one(r"Using max model len (?P<len>[\d,]+)", Figure("max_model_len", "len", _int, "tokens")),
    # "vLLM API server version X" (older), the banner's "... version X" (0.2x and later), the engine's own
    StartupLine.one(r"(?:vLLM API server version|\u2588\s+version|Initializing an? (?:V1 )?LLM engine \(v?)"
                    r" ?(?P<version>\d[\w.+\-]*\w)", Figure("vllm_version", "version", str)),
    # V0 0.6.x, one line
    StartupLine.wrapped(r"Memory profiling results:",
                        (rf"Memory profiling results: duration=(?P<sec>{_NUM}) seconds", (_sec("memory_profiling_seconds"),)),
                        (rf"total_gpu_memory=(?P<v>{_NUM})GiB", (_gib("gpu_total_gib"),)),
                        (rf"non_torch_memory=(?P<v>{_NUM})GiB", (_gib("non_torch_gib"),)),
                        (rf"kv_cache_size=(?P<v>{_NUM})GiB", (_gib("available_kv_gib"),)),
                        (rf"gpu_memory_utilization=(?P<u>{_NUM})", (Figure("gpu_memory_utilization", "u"),))),
    # V0 0.6.5-0.7: the second and third lines of one message
    StartupLine.wrapped(r"the current vLLM instance can use total_gpu_memory",
                        (rf"total_gpu_memory \((?P<t>{_NUM})GiB\) x gpu_memory_utilization \((?P<u>{_NUM})\) = "
                         rf"(?P<r>{_NUM})GiB", (_gib("gpu_total_gib", "t"), Figure("gpu_memory_utilization", "u"),
                                                _gib("gpu_requested_gib", "r")))),
    StartupLine.wrapped(r"model weights take",
                        (rf"model weights take (?P<v>{_NUM})GiB", (_gib("weights_gib"),)),
                        (rf"non_torch_memory takes (?P<v>{_NUM})GiB", (_gib("non_torch_gib"),)),
                        (rf"PyTorch activation peak memory takes (?P<v>{_NUM})GiB", (_gib("peak_activation_gib"),)),
                        (rf"the rest of the memory reserved for KV Cache is (?P<v>{_NUM})GiB",
                         (_gib("available_kv_gib"),))),
    # V1 0.8-0.9
    StartupLine.wrapped(r"Total non KV cache memory",
                        (rf"Total non KV cache memory: (?P<v>{_NUM}) ?GiB", (_gib("non_kv_cache_gib"),)),
                        (rf"torch peak memory increase: (?P<v>{_NUM}) ?GiB", (_gib("peak_activation_gib"),)),
                        (rf"non-torch forward increase memory: (?P<v>{_NUM}) ?GiB", (_gib("non_torch_gib"),)),
                        (rf"weights memory: (?P<v>{_NUM}) ?GiB", (_gib("weights_gib"),))),
    # V1 0.10 on: the memory profile term by term (not its refusal, "... is less than desired ...")
    StartupLine.wrapped(r"Free memory on device \((?![^)]*\) on startup is less)",
                        (rf"Free memory on device \((?P<f>{_NUM})/(?P<t>{_NUM}) GiB\)",
                         (_gib("gpu_free_on_startup_gib", "f"), _gib("gpu_total_gib", "t"))),
                        (rf"Desired GPU memory utilization is \((?P<u>{_NUM}), (?P<r>{_NUM}) GiB\)",
                         (Figure("gpu_memory_utilization", "u"), _gib("gpu_requested_gib", "r"))),
                        (rf"(?P<v>{_NUM}) GiB for consumed memory", (_gib("consumed_gib"),)),
                        (rf"(?P<v>{_NUM}) GiB for weight", (_gib("weights_gib"),)),
                        (rf"(?P<v>{_NUM}) GiB for non-torch memory", (_gib("non_torch_gib"),)),
                        (rf"(?P<v>{_NUM}) GiB for peak activation", (_gib("peak_activation_gib"),)),
                        (rf"(?P<v>{_NUM}) GiB for CUDAGraph memory", (_gib("cuda_graph_gib"),)),
                        (r"--kv-cache-memory=(?P<b>\d+)`? \([^)]*\) to fit",
                         (Figure("kv_cache_memory_to_fit_bytes", "b", int, "bytes"),)),
                        (r"--kv-cache-memory=(?P<b>\d+)`? \([^)]*\) to fully",
                         (Figure("kv_cache_memory_to_fill_bytes", "b", int, "bytes"),)),
                        (rf"Current kv cache memory in use is (?P<v>{_NUM}) GiB", (_gib("kv_cache_in_use_gib"),))),
)


def _found(line: LogLine, joined: str, spec: StartupLine) -> tuple[str, list[tuple[Figure, Any, str | None]]] | None:
    """The text ``spec`` is read from on ``line`` (``joined``: the line with what a terminal wrapped onto
    the next lines) and each figure found in it with its value and unit; None where ``spec``'s message
    does not begin on this line."""
    text = joined if spec.wraps else line.text
    m = spec.anchor.search(text)
    if m is None or m.start() >= len(line.text):
        return None
    out = []
    for regex, figures in spec.terms:
        t = regex.search(text)
        if t is None:
            continue
        for f in figures:
            if t.group(f.group) is not None:
                out.append((f, f.convert(t.group(f.group)), t.group(f.unit_group) if f.unit_group else f.unit))
    return text, out


def parse_startup(text: str, source: str = "server.log") -> dict[str, dict[str, Any]]:
    """Facts read from a vLLM server's startup log, keyed by name (only those found).

    Each value is ``fact(value, "<source>:<lineno>", unit=...)`` plus ``"line"`` (the
    ANSI-stripped log line it came from). When a fact appears on several lines (each
    tensor-parallel worker prints its own ``Model loading took ...``), the first one is
    the value and ``"per_rank"`` lists every value in log order.

    Keys (see :data:`STARTUP_LINES` for the wordings): ``vllm_version``, ``max_model_len``,
    ``model_load_gib`` (unit GiB or GB as logged), ``model_load_seconds``, ``loading_weights_seconds``,
    ``model_init_seconds``, ``available_kv_gib``, ``kv_cache_tokens``, ``kv_pool`` (``"GPU"``,
    ``"CPU"``, ``"XPU"``, ``"GPU + host"``, ...), ``gpu_blocks``, ``cpu_blocks``, ``max_concurrency``,
    ``max_concurrency_tokens_per_request``, ``engine_init_seconds``, ``cuda_graph_capture_seconds``,
    ``cuda_graph_capture_gib``, ``torch_compile_seconds``, ``memory_profiling_seconds``; from the
    memory profile lines: ``gpu_free_on_startup_gib``, ``gpu_total_gib``, ``gpu_memory_utilization``,
    ``gpu_requested_gib``, ``consumed_gib`` (weights + non-torch), ``weights_gib``, ``non_torch_gib``,
    ``peak_activation_gib``, ``cuda_graph_gib``, ``non_kv_cache_gib``, ``kv_cache_memory_to_fit_bytes``,
    ``kv_cache_memory_to_fill_bytes`` (vLLM's recommended ``--kv-cache-memory``), ``kv_cache_in_use_gib``.
    Where the log gives consumed memory but no non-torch figure, ``non_torch_gib`` is consumed less
    the ``Model loading took`` figure, with ``derived`` saying so.
    """
    facts: dict[str, dict[str, Any]] = {}
    lines = log_lines(text)
    for line in lines:
        if not line.text:
            continue
        joined = line.text[: len(line.text) - len(line.message)] + continued(lines, line.number - 1)
        for spec in STARTUP_LINES:
            found = _found(line, joined, spec)
            if found is None:
                continue
            read_from, figures = found
            for figure, value, unit in figures:
                if figure.key in facts:
                    first = facts[figure.key]
                    first.setdefault("per_rank", [first["value"]]).append(value)
                    continue
                facts[figure.key] = {**fact(value, f"{source}:{line.number}", unit=unit), "line": read_from}
                if unit == "GB":
                    facts[figure.key]["note"] = _GB_NOTE
    _derive_non_torch(facts)
    return facts


def _derive_non_torch(facts: dict[str, dict[str, Any]]) -> None:
    """Non-torch memory where the log gives consumed memory (weights + non-torch) but not the term itself."""
    consumed, loaded = facts.get("consumed_gib"), facts.get("model_load_gib")
    if consumed and loaded and "non_torch_gib" not in facts:
        facts["non_torch_gib"] = {**fact(round(consumed["value"] - loaded["value"], 2), consumed["source"], unit="GiB"),
                                  "line": consumed["line"], "derived": f"consumed_gib - model_load_gib ({loaded['source']})"}


def logged_gib(figure: dict[str, Any] | None) -> float | None:
    """A memory figure of :func:`parse_startup` in GiB, or None where its unit does not say how many
    (vLLM's "GB" is GiB, see the module's note; an "MB" figure of an older release is left alone)."""
    if figure is None or figure.get("unit") not in ("GiB", "GB"):
        return None
    return figure["value"]
