"""In a fresh process shown one GPU: initialise CUDA, allocate, fill and free a buffer of ``argv[1]``
bytes, synchronise; print one JSON object (status ``ok``, ``failed`` or ``skipped`` without CUDA,
the evidence, the seconds it took). The standard library and torch only; where
``LLMTRIAL_GPU_DOUBLE`` names a file, that double's ``cuda_health`` answers instead (tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time


def with_torch(nbytes: int) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"status": "skipped", "evidence": f"torch {torch.__version__}: torch.cuda.is_available() is False"}
    torch.cuda.init()
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    torch.cuda.empty_cache()
    return {"status": "ok", "evidence": f"allocated, filled and freed {nbytes} bytes on {torch.cuda.get_device_name(0)}"}


def with_double(path: str, nbytes: int) -> dict:
    spec = importlib.util.spec_from_file_location("gpu_double", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cuda_health(nbytes)


def check(nbytes: int) -> dict:
    t0 = time.perf_counter()
    double = os.environ.get("LLMTRIAL_GPU_DOUBLE")
    try:
        out = with_double(double, nbytes) if double else with_torch(nbytes)
    except Exception as exc:  # whatever CUDA raises is the evidence
        out = {"status": "failed", "evidence": f"{type(exc).__name__}: {exc}"}
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> None:
    print(json.dumps(check(int(sys.argv[1]))))


if __name__ == "__main__":
    main()
