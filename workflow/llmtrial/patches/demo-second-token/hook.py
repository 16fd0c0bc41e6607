"""Runtime form of the demo-second-token patch (mode plugin only).

vLLM calls :func:`register` in every process it starts. The hook wraps
``Sampler.greedy_sample`` as soon as ``vllm.v1.sample.sampler`` is imported (at once when it
already is): with the flag set, each step's token is the second most likely (the top two of the
logits, the second taken), and the first call in a process logs the line ``evidence`` matches.
With the flag unset the original runs unchanged.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

NAME = "demo-second-token"
FLAG = "LLMTRIAL_DEMO_SECOND_TOKEN"
TARGET = "vllm.v1.sample.sampler"
_logged: list[int] = []


def _wrap(module: types.ModuleType) -> None:
    cls = module.Sampler
    original = cls.greedy_sample
    if getattr(original, "llmtrial_patch", None) == NAME:
        return  # already wrapped in this process

    def greedy_sample(logits: Any) -> Any:
        if os.environ.get(FLAG) != "1":
            return original(logits)
        if not _logged:
            _logged.append(os.getpid())
            from vllm.logger import init_logger  # the sampler runs in a vLLM process: vLLM is loaded

            init_logger(TARGET).info("llmtrial patch %s active: greedy picks the second most likely token in pid %d",
                                     NAME, os.getpid())
        return logits.topk(2, dim=-1).indices[:, 1].contiguous().view(-1)

    greedy_sample.llmtrial_patch = NAME  # type: ignore[attr-defined]
    greedy_sample.__wrapped__ = original  # type: ignore[attr-defined]
    cls.greedy_sample = staticmethod(greedy_sample)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds TARGET with the other finders, then wraps it right after it executes."""

    llmtrial_patch = NAME

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None or spec.loader is None:
                continue

            def exec_and_wrap(module: types.ModuleType, exec_module: Any = spec.loader.exec_module) -> None:
                exec_module(module)
                _wrap(module)

            spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
            return spec
        return None


def register() -> None:
    """vLLM's general plugin entry point: install the hook in this process (idempotent)."""
    if TARGET in sys.modules:
        _wrap(sys.modules[TARGET])
    elif not any(getattr(f, "llmtrial_patch", None) == NAME for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())
    state = "set" if os.environ.get(FLAG) == "1" else "unset"
    print(f"llmtrial patch {NAME}: hook installed in pid {os.getpid()} (flag {FLAG} {state})", file=sys.stderr, flush=True)
