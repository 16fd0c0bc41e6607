"""A test double of a GPU host's stack, for the workflow run end to end on a machine with no GPU.

``LLMTRIAL_GPU_DOUBLE=<this file>`` makes llmtrial use it (:mod:`llmtrial.host.gpus`): the module
stands in for nvidia-ml-py's ``pynvml``; :func:`cuda_health` for CUDA in the health check's
fresh process; ``python gpu_double.py dmesg`` for the kernel log. What it reports comes from
the JSON file named by ``GPU_DOUBLE_SCENARIO`` (read at every call, so a test can change the
host between two runs):

    {"gpus": [{"uuid": "GPU-...", "name": "NVIDIA H200", "memory_gib": 141, "pci": "00000000:17:00.0",
               "pcie": [4, 5, 16, 16]}],           # current gen, max gen, current width, max width
     "processes": {"0": [{"pid": 4194303, "name": "tritonserver", "memory_gib": 8}]},
     "allocation": "ok" | "failed",
     "dmesg": ["[  12.5] NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus."]}
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

SCENARIO_ENV = "GPU_DOUBLE_SCENARIO"
GiB = 2**30

NVML_P2P_CAPS_INDEX_READ = 0
NVML_P2P_STATUS_OK = 0
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1


class NVMLError(Exception):
    pass


def scenario() -> dict:
    with open(os.environ[SCENARIO_ENV], encoding="utf-8") as fh:
        return json.load(fh)


def _gpu(h: int) -> dict:
    return scenario()["gpus"][h]


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(scenario()["gpus"])


def nvmlDeviceGetHandleByIndex(i: int) -> int:
    if i >= nvmlDeviceGetCount():
        raise NVMLError("Invalid Argument")
    return i


def nvmlDeviceGetName(h: int) -> str:
    return _gpu(h).get("name", "NVIDIA H200")


def nvmlDeviceGetUUID(h: int) -> str:
    return _gpu(h)["uuid"]


def nvmlDeviceGetMemoryInfo(h: int) -> SimpleNamespace:
    used = sum(p.get("memory_gib", 0) for p in scenario().get("processes", {}).get(str(h), [])) * GiB
    return SimpleNamespace(total=int(_gpu(h).get("memory_gib", 141) * GiB), used=int(used))


def nvmlDeviceGetCudaComputeCapability(h: int) -> tuple[int, int]:
    return (9, 0)


def _pcie(h: int) -> list[int]:
    return _gpu(h).get("pcie", [5, 5, 16, 16])


def nvmlDeviceGetCurrPcieLinkGeneration(h: int) -> int:
    return _pcie(h)[0]


def nvmlDeviceGetMaxPcieLinkGeneration(h: int) -> int:
    return _pcie(h)[1]


def nvmlDeviceGetCurrPcieLinkWidth(h: int) -> int:
    return _pcie(h)[2]


def nvmlDeviceGetMaxPcieLinkWidth(h: int) -> int:
    return _pcie(h)[3]


def nvmlDeviceGetPciInfo(h: int) -> SimpleNamespace:
    return SimpleNamespace(busId=_gpu(h).get("pci", f"00000000:{0x17 + h:02X}:00.0"))


def nvmlDeviceGetP2PStatus(a: int, b: int, index: int) -> int:
    return NVML_P2P_STATUS_OK


def nvmlSystemGetDriverVersion() -> str:
    return "575.51.03"


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    return 12090


def nvmlDeviceGetComputeRunningProcesses(h: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=int(p.get("memory_gib", 0) * GiB))
            for p in scenario().get("processes", {}).get(str(h), [])]


def nvmlSystemGetProcessName(pid: int) -> str:
    for procs in scenario().get("processes", {}).values():
        for p in procs:
            if p["pid"] == pid:
                return p.get("command", p["name"])
    raise NVMLError("Not Found")


def nvmlDeviceGetUtilizationRates(h: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=40, memory=20)


def nvmlDeviceGetPowerUsage(h: int) -> int:
    return 250_000


def nvmlDeviceGetEnforcedPowerLimit(h: int) -> int:
    return 700_000


def nvmlDeviceGetTotalEnergyConsumption(h: int) -> int:
    return 1_000_000


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
    return 55


def nvmlDeviceGetClockInfo(h: int, clock: int) -> int:
    return 1980 if clock == NVML_CLOCK_SM else 2619


def nvmlDeviceGetCurrentClocksEventReasons(h: int) -> int:
    return 0


def nvmlDeviceGetPcieThroughput(h: int, counter: int) -> int:
    return 1000


def cuda_health(nbytes: int) -> dict:
    """The health check's fresh process, on the GPU CUDA_VISIBLE_DEVICES shows it."""
    shown = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if scenario().get("allocation", "ok") == "ok":
        return {"status": "ok", "evidence": f"double: allocated, filled and freed {nbytes} bytes on {shown}"}
    return {"status": "failed", "evidence": f"double: RuntimeError: CUDA error: an illegal memory access was "
                                            f"encountered (allocating {nbytes} bytes on {shown})"}


def dmesg() -> list[str]:
    return ["[    0.000000] Linux version 6.1.0 (double)", *scenario().get("dmesg", [])]


if __name__ == "__main__" and sys.argv[1:] == ["dmesg"]:
    print("\n".join(dmesg()))
