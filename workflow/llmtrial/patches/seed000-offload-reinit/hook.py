"""Runtime form of the seed000-offload-reinit patch, for a site-packages that is not writable
(seed 000's node B).

vLLM calls :func:`register` through its ``vllm.general_plugins`` entry point in every
process it starts: the API server, the engine core and each worker (and each Ray worker,
through ``WorkerWrapperBase.init_worker``). It must be re-entrant, cheap and free of
imports beyond the standard library: it prints that the hook is installed in this process
(to stderr, which the server log holds: the API server loads plugins while it parses its
arguments, before vLLM's logging is set up), then wraps
``GPUModelRunner.may_reinitialize_input_batch`` as soon as ``vllm.v1.worker.gpu_model_runner``
is imported (at once when it already is), so the API server never imports worker code it
does not use.

The wrapper does what patch.diff does, only when the flag is set: the method's one read of
``self.offload_config.uva.cpu_offload_gb`` is its assertion, so the call runs with that value
at 0 (the assertion cannot fire) and gets it back afterwards, whatever happens; when the call
re-created the input batch, it logs the evidence line with the pid.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

NAME = "seed000-offload-reinit"
FLAG = "LLMTRIAL_RELAX_OFFLOAD_REINIT"
TARGET = "vllm.v1.worker.gpu_model_runner"


def _wrap(module: types.ModuleType) -> None:
    cls = module.GPUModelRunner
    original = cls.may_reinitialize_input_batch
    if getattr(original, "llmtrial_patch", None) == NAME:
        return  # already wrapped in this process

    def may_reinitialize_input_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        uva = self.offload_config.uva
        offload_gb = uva.cpu_offload_gb
        if os.environ.get(FLAG) != "1" or offload_gb == 0:
            return original(self, *args, **kwargs)
        batch = getattr(self, "input_batch", None)
        uva.cpu_offload_gb = 0
        try:
            result = original(self, *args, **kwargs)
        finally:
            uva.cpu_offload_gb = offload_gb
        if getattr(self, "input_batch", None) is not batch:
            module.logger.warning(
                "llmtrial patch %s active: CPU weight offload assertion relaxed to re-initialize the input batch "
                "(cpu_offload_gb %s) in pid %d", NAME, offload_gb, os.getpid())
        return result

    may_reinitialize_input_batch.llmtrial_patch = NAME  # type: ignore[attr-defined]
    may_reinitialize_input_batch.__wrapped__ = original  # type: ignore[attr-defined]
    cls.may_reinitialize_input_batch = may_reinitialize_input_batch


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
