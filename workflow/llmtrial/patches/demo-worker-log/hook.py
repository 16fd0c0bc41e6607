"""Runtime form of the demo-worker-log patch, for a site-packages that is not writable.

vLLM calls :func:`register` through its ``vllm.general_plugins`` entry point in every
process it starts: the API server, the engine core and each worker (and each Ray worker,
through ``WorkerWrapperBase.init_worker``). It must be re-entrant, cheap and free of
imports beyond the standard library: it prints that the hook is installed in this process
(to stderr, which the server log holds: the API server loads plugins while it parses its
arguments, before vLLM's logging is set up), then wraps ``CPUWorker.init_device`` as soon as ``vllm.v1.worker.cpu_worker`` is imported
(at once when it already is), so the API server never imports worker code it does not use.
The wrapper does what patch.diff does, only when the flag is set.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

NAME = "demo-worker-log"
FLAG = "LLMTRIAL_DEMO_WORKER_LOG"
TARGET = "vllm.v1.worker.cpu_worker"


def _wrap(module: types.ModuleType) -> None:
    cls = module.CPUWorker
    original = cls.init_device
    if getattr(original, "llmtrial_patch", None) == NAME:
        return  # already wrapped in this process

    def init_device(self: Any) -> Any:
        if os.environ.get(FLAG) == "1":
            module.logger.info(
                "llmtrial patch %s active: CPU worker rank %d initialising its device in pid %d",
                NAME, self.rank, os.getpid())
        return original(self)

    init_device.llmtrial_patch = NAME  # type: ignore[attr-defined]
    init_device.__wrapped__ = original  # type: ignore[attr-defined]
    cls.init_device = init_device


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
