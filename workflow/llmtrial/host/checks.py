"""One preflight check's shape, and the checks of a host's serving environment.

Shared by the host's preflight (:mod:`llmtrial.lifecycle.preflight`), the cross-node preflight
(:mod:`llmtrial.host.crossnode`) and the launch checks of a plan (:mod:`llmtrial.plan.launch_checks`):
the allocator setting, ``/dev/shm``, the open-file limit and the NCCL/GLOO interfaces. It
sits apart from both preflights so that they and the planner never import each other.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from typing import Any

import psutil

from llmtrial.core.record_base import Check
from llmtrial.core.units import GiB

__all__ = ["MIN_SHM_BYTES", "MIN_OPEN_FILES", "check", "check_allocator", "check_shm", "check_open_files",
           "check_nccl_interfaces", "effective_alloc_conf"]

#: The smallest ``/dev/shm`` a host of a trial should have.
MIN_SHM_BYTES = 1 * GiB


def check(name: str, status: str, detail: str, **data: Any) -> Check:
    """One check's outcome: ``ok``, ``warn``, ``fail`` or ``skip``, with what was seen."""
    return Check(name=name, status=status, detail=detail, **data)


#: Allocator settings in the order PyTorch reads them.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


#: vLLM asks for at least this many open files and warns when it cannot raise the limit.
MIN_OPEN_FILES = 65535


def effective_alloc_conf(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(variable, value) of the allocator configuration PyTorch will use, or (None, None)."""
    for name in ALLOC_CONF_VARS:
        if env.get(name):
            return name, env[name]
    return None, None


def check_allocator(envs: Mapping[str, Mapping[str, str]]) -> Check:
    """``expandable_segments:True`` for any server: warn (seed 002's scrubber wedge; sleep mode)."""
    hits = {}
    for who, env in envs.items():
        var, value = effective_alloc_conf(env)
        if value and "expandable_segments:true" in value.replace(" ", "").lower():
            hits[who] = f"{var}={value}"
    if hits:
        return check("allocator", "warn",
                     "expandable_segments:True is set for " + ", ".join(f"{k} ({v})" for k, v in hits.items())
                     + ": it hands pages back to the driver on every free, which wedged GPUs during MoE expert "
                       "repacking in the field and is incompatible with vLLM's sleep mode; unset it unless measured.",
                     effective=hits)
    return check("allocator", "ok", "no server sets expandable_segments:True")


def check_shm(min_bytes: int = MIN_SHM_BYTES) -> Check:
    try:
        st = os.statvfs("/dev/shm")
    except OSError as exc:
        return check("dev_shm", "warn", f"/dev/shm cannot be read ({exc}); tensor and pipeline parallel workers use it")
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    status = "ok" if size >= min_bytes else "warn"
    return check("dev_shm", status, f"/dev/shm is {size / GiB:.2f} GiB ({free / GiB:.2f} GiB free)"
                 + ("" if status == "ok" else f"; below {min_bytes / GiB:.0f} GiB, run containers with --ipc=host or a larger --shm-size"),
                 size_bytes=size, free_bytes=free)


def check_open_files(minimum: int = MIN_OPEN_FILES) -> Check:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    status = "ok" if soft >= minimum or soft == resource.RLIM_INFINITY else "warn"
    return check("open_files", status, f"open-file limit {soft} (hard {hard})"
                 + ("" if status == "ok" else f"; vLLM asks for {minimum} and fails with 'Too many open files' under load"),
                 soft=soft, hard=hard)


def check_nccl_interfaces(envs: Mapping[str, Mapping[str, str]]) -> Check:
    """NCCL/GLOO interface variables, where set, must name interfaces this host has."""
    interfaces = set(psutil.net_if_addrs())
    named: dict[str, str] = {}
    for env in envs.values():
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            if env.get(var):
                named[var] = env[var]
    if not named:
        return check("nccl_interfaces", "skip", "no NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME set (single-node trial)")
    missing = {}
    for var, value in named.items():
        names = [n.lstrip("=^") for n in value.split(",") if n]
        if not any(any(i.startswith(n) for i in interfaces) for n in names):
            missing[var] = value
    if missing:
        return check("nccl_interfaces", "fail", "no interface matches " + ", ".join(f"{k}={v}" for k, v in missing.items())
                     + f"; this host has {', '.join(sorted(interfaces))}")
    return check("nccl_interfaces", "ok", ", ".join(f"{k}={v}" for k, v in named.items()) + " match this host's interfaces")
