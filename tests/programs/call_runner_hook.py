"""Loads a patch's hook from a plugin folder as vLLM loads a general plugin (the entry point of the
``vllm.general_plugins`` group named ENTRY_POINT, its ``register()`` called twice: vLLM may call it more
than once), imports the stand-in ``vllm.v1.worker.gpu_model_runner`` of STAND_IN_ROOT (before or after
``register()``), and calls ``GPUModelRunner.may_reinitialize_input_batch`` on a hybrid model's KV cache
groups with CPU_OFFLOAD_GB of CPU weight offload. Prints what happened as one JSON line; the hook's line
and the module's log go to stderr.

    python tests/programs/call_runner_hook.py PLUGIN_DIR ENTRY_POINT STAND_IN_ROOT CPU_OFFLOAD_GB before|after
"""

import importlib
import importlib.metadata
import json
import logging
import os
import sys


def main(plugin_dir: str, entry_point: str, root: str, offload_gb: float, imported: str) -> dict:
    sys.path[:0] = [plugin_dir, root]  # the plugin folder first on the path, as the trial job's PYTHONPATH puts it
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    [ep] = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins") if ep.name == entry_point]
    if imported == "before":
        importlib.import_module("vllm.v1.worker.gpu_model_runner")
    register = ep.load()
    register()
    register()
    module = importlib.import_module("vllm.v1.worker.gpu_model_runner")
    method = module.GPUModelRunner.may_reinitialize_input_batch
    runner = module.fill_runner(module.GPUModelRunner(), cpu_offload_gb=offload_gb)
    before = runner.input_batch
    out = {"pid": os.getpid(), "module_file": module.__file__, "hook_file": sys.modules[ep.module].__file__,
           "wrapped_by": getattr(method, "llmtrial_patch", None),
           "wrapped_once": getattr(getattr(method, "__wrapped__", None), "llmtrial_patch", None) is None,
           "raised": None}
    try:
        runner.may_reinitialize_input_batch(module.hybrid_kv_cache_config(), [module.GROUP_BLOCK_SIZE] * 2)
    except AssertionError as exc:
        out["raised"] = str(exc)
    out["reinitialised"] = runner.input_batch is not before
    out["block_sizes"] = runner.input_batch.kwargs["block_sizes"]
    out["logitsprocs"] = runner.input_batch.logitsprocs
    out["cpu_offload_gb_after"] = runner.offload_config.uva.cpu_offload_gb
    return out


if __name__ == "__main__":
    plugin_dir, entry_point, root, offload_gb, imported = sys.argv[1:]
    print(json.dumps(main(plugin_dir, entry_point, root, float(offload_gb), imported)), flush=True)
