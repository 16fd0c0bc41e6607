"""The engine's own warnings: start-up lines of vLLM (and of NCCL under it) that the seeds acted on.

A server that starts can still start slower than it should: no tuned fused-MoE kernel for
this GPU, a quantization kernel forced where a faster one was available, tensor-parallel
all-reduce without vLLM's custom kernel (GPU peer-to-peer access missing, or another reason), a compile
cache that could not be loaded, NCCL moving collectives over TCP sockets. vLLM
says so in its log and carries on; :func:`engine_warnings` collects those lines so the
configuration record (and the report) carry them with their source line and what the seeds did
about them.

NCCL prints its own lines only under ``NCCL_DEBUG=INFO``; without it ``nccl_socket_transport``
cannot be seen. Each pattern is searched anywhere in an ANSI-stripped line (see
:mod:`llmtrial.logs.lines`), so vLLM's changing prefixes do not matter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmtrial.core.configuration_model import EngineWarning
from llmtrial.logs.lines import find_lines

__all__ = ["WARNINGS", "WarningPattern", "engine_warnings"]


@dataclass(frozen=True)
class WarningPattern:
    """One warning the engine prints: ``regex`` finds it; ``says`` (a one-line summary) and
    ``advice`` (what the seed did about it) are formatted with the match's named groups, after
    ``details`` adds any derived ones."""

    name: str
    regex: re.Pattern[str]
    says: str
    advice: str
    details: Callable[[re.Match[str]], dict[str, str]] | None = None

    def describe(self, m: re.Match[str]) -> tuple[str, str]:
        """The summary and advice for one match."""
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if self.details is not None:
            groups.update(self.details(m))
        return self.says.format(**groups), self.advice.format(**groups)


def _moe_config_file(m: re.Match[str]) -> dict[str, str]:
    """The tuned-config file name vLLM looked for (``E=..,N=..,device_name=...json``), from the
    path or list of paths it printed (a Python list before 0.2x, ``", "``-joined after)."""
    last = m["paths"].split(", ")[-1].strip("[]'\" ")
    return {"file": re.split(r"[/\\]", last)[-1]}


_P2P_ADVICE = ("The GPUs cannot read each other's memory (check `nvidia-smi topo -p2p r`), so every tensor-parallel "
               "all-reduce detours through host RAM: measure the split before trusting it, as the seed did.")
_NCCL_ADVICE = ("Tensor-parallel all-reduces fall back to NCCL, slower for decode's small messages: expect less from "
                "more GPUs on this topology than on NVLink-connected ones.")


def _allreduce_advice(m: re.Match[str]) -> dict[str, str]:
    """What to do: the seed's where the GPUs lack peer-to-peer access, NCCL's fallback otherwise."""
    return {"advice": _P2P_ADVICE if "P2P" in m["reason"] else _NCCL_ADVICE}


#: The warnings known, most specific first: a line counts for the first one that matches.
WARNINGS: tuple[WarningPattern, ...] = (
    WarningPattern(
        "untuned_moe_config",
        # vllm/model_executor/layers/fused_moe/fused_moe.py (get_moe_configs, 0.32.0: line 1163)
        re.compile(r"Using default MoE config\. Performance might be sub-optimal! Config file not found at (?P<paths>.+)$"),
        "vLLM has no tuned fused-MoE kernel config for this GPU and expert shape ({file})",
        "The MoE layers run a default kernel config, leaving an unmeasured amount of speed on the table "
        "(the seed recorded it as such); tune one with vLLM's benchmarks/kernels/benchmark_moe.py --tune and "
        "point VLLM_TUNED_CONFIG_FOLDER at it, or report the figures as untuned.",
        details=_moe_config_file,
    ),
    WarningPattern(
        "slower_quant_kernel",
        # vllm/model_executor/layers/quantization/awq_marlin.py and gptq_marlin.py
        # (override_quantization_method, vLLM 0.5 to 0.1x; 0.32 chooses the Marlin kernel itself)
        re.compile(r"Detected that the model can run with (?P<fast>\w+), however you specified "
                   r"quantization=(?P<slow>\w+) explicitly, so forcing (?P=slow)\. "
                   r"Use quantization=(?P=fast) for faster inference"),
        "vLLM warned {slow} could run as {fast}",
        "Serve with quantization={fast} (or leave quantization unset so vLLM picks it): the seed measured "
        "awq_marlin 10.4 times faster than awq at batch 1 with identical output.",
    ),
    WarningPattern(
        "custom_allreduce_disabled",
        # vllm/distributed/device_communicators/custom_all_reduce.py (0.32.0: lines 215, 235, 271, 286; the P2P
        # reason is seed 001's); the INFO line "because of missing custom allreduce library" (a build without
        # it, e.g. CPU) is left out
        re.compile(r"Custom (?:allreduce is|collectives are) disabled "
                   r"(?P<reason>(?:because|due to) (?!of missing custom allreduce library)[^.]*)"),
        "vLLM disabled its custom all-reduce ({reason})",
        "{advice}",
        details=_allreduce_advice,
    ),
    WarningPattern(
        "compile_cache_load_failure",
        # vllm/compilation/decorators.py (0.32.0: line 333): the AOT-compiled model in vLLM's compile cache
        # could not be loaded, so the start-up compiles it again (and saves it again)
        re.compile(r"Compiling model again due to a load failure from (?P<path>\S+), reason: (?P<why>.+)$"),
        "vLLM could not load the compiled model from its compile cache and compiled it again ({why})",
        "Every start-up pays the compile again, cache or not (its cost is the start-up's compile phase): the "
        "cache is written but not read back by this build. Serve eager (enforce_eager) where compile time is "
        "not what is measured, or count the compile in each start-up, as the report's phases do.",
    ),
    WarningPattern(
        "nccl_socket_transport",
        # NCCL's own INFO line under NCCL_DEBUG=INFO: src/init.cc INFO(NCCL_INIT, "Using network %s", ...)
        re.compile(r"NCCL INFO Using network Socket\b"),
        "NCCL moves collectives over TCP sockets (no InfiniBand or RoCE)",
        "Across nodes the collectives are bound by that NIC: pin NCCL_SOCKET_IFNAME to the fastest "
        "interface on every node (the seed used its 200G path and set NCCL_IB_DISABLE=1); within one node "
        "it does not matter.",
    ),
)

_ANY = re.compile("|".join(f"(?:{w.regex.pattern})" for w in WARNINGS))


def _entry(warning: WarningPattern, m: re.Match[str], found: dict[str, Any]) -> EngineWarning:
    says, advice = warning.describe(m)
    return EngineWarning(name=warning.name, line=found["line"], source=found["source"], process=found["process"],
                         count=1, summary=says, advice=advice, kind="measured")


def engine_warnings(text: str, source: str = "server.log") -> list[EngineWarning]:
    """The known warnings in a server log, in the order first seen, one entry per name.

    Each entry: ``name``, ``line`` (ANSI-stripped), ``source`` (``"<source>:<lineno>"``, 1-based),
    ``process`` (the vLLM process that logged it, or None), ``count`` (how many lines said it:
    every tensor-parallel rank prints its own), ``summary``, ``advice`` and ``kind`` (``measured``),
    all from the first line that said it.
    """
    out: dict[str, EngineWarning] = {}
    for found in find_lines(text, _ANY, source):
        for warning in WARNINGS:
            m = warning.regex.search(found["line"])
            if m is None:
                continue
            if warning.name in out:
                out[warning.name].count += 1
            else:
                out[warning.name] = _entry(warning, m, found)
            break
    return list(out.values())
