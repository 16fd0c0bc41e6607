"""The probe program: copies timed with the serving environment's torch, printed as one JSON line.

It runs as ``python -c <this file's source> <settings as JSON>`` with the serving
environment's Python (:func:`llmtrial.host.probes.probe_argv`), so it imports nothing but the
standard library, torch and, where installed, nvidia-ml-py (``pynvml``, to read a GPU's PCIe
link while a copy keeps it busy). The settings: ``{"probes": {name: {"enabled", "bytes",
"repeats"}}, "devices": [NVML index of each CUDA device, in CUDA's order]}``; the parent
sets ``CUDA_VISIBLE_DEVICES`` to the selected GPUs and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
so CUDA device ``i`` is NVML's ``devices[i]``.

Every probe warms up once, then times ``repeats`` copies and keeps the median; a GB/s is
1e9 bytes per second. A copy within one memory (``host_memory``, ``device_memory``) counts
the bytes read and the bytes written, the traffic a decode step's weight reads compete with.
The all-reduce is not here: :func:`llmtrial.host.probes.run_probes` runs
:mod:`llmtrial.host.collective`'s ranks for it.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

GPU_PROBES = ("host_to_device", "device_to_host", "device_memory", "device_to_device")


def entry(name: str, method: str, devices: list[int], nbytes: int, repeats: int, seconds: list[float],
          moved: int | None = None, **extra: Any) -> dict[str, Any]:
    """A measured probe: ``moved`` bytes (``nbytes`` by default) over the median of ``seconds``."""
    median = statistics.median(seconds)
    gbps = (moved if moved is not None else nbytes) / median / 1e9 if median > 0 else None
    return {"name": name, "status": "measured", "kind": "measured", "method": method, "devices": devices,
            "bytes": nbytes, "repeats": repeats, "gbps": gbps, "seconds_median": median, "reason": None, **extra}


def skipped(name: str, reason: str, devices: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": "skipped", "kind": "measured", "method": None, "devices": devices or [],
            "bytes": None, "repeats": None, "gbps": None, "seconds_median": None, "reason": reason, **extra}


def timed(copy: Callable[[], None], sync: Callable[[], None], repeats: int) -> list[float]:
    """One warm-up copy, then ``repeats`` timed ones, each ended by ``sync``."""
    copy()
    sync()
    out = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        copy()
        sync()
        out.append(time.perf_counter() - t)
    return out


def host_memory(torch: Any, nbytes: int, repeats: int) -> dict[str, Any]:
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), lambda: None, repeats)
    return entry("host_memory", f"torch copy_ of a {nbytes} B uint8 tensor into another in host memory "
                 f"({torch.get_num_threads()} threads), bytes read + written over the median of {repeats} "
                 "perf_counter timings after one warm-up", [], nbytes, repeats, seconds, moved=2 * nbytes)


def _repeat(fn: Callable[[], Any], n: int) -> None:
    for _ in range(n):
        fn()


def link_under_load(nvml: Any, index: int, busy: Callable[[], None]) -> dict[str, Any]:
    """The PCIe generation and width NVML reports while ``busy`` has copies in flight."""
    if nvml is None:
        return {}
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        busy()
        return {"pcie_gen_under_load": nvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                "pcie_width_under_load": nvml.nvmlDeviceGetCurrPcieLinkWidth(h)}
    except Exception as exc:  # a field NVML will not give
        return {"pcie_under_load_error": f"{type(exc).__name__}: {exc}"}


def host_device(torch: Any, nvml: Any, cuda: int, nvml_index: int, name: str, nbytes: int,
                repeats: int) -> list[dict[str, Any]]:
    """``host_to_device`` or ``device_to_host`` on one GPU, from pinned and from pageable host memory."""
    dev = torch.device("cuda", cuda)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
    up = name == "host_to_device"
    out = []
    for pinned in (True, False):
        host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
        memory = "pinned" if pinned else "pageable"
        copy = functools.partial(gpu.copy_ if up else host.copy_, host if up else gpu, non_blocking=True)
        seconds = timed(copy, sync, repeats)
        extra = {}
        if pinned and up:  # read the link while four copies keep it busy: an idle GPU may drop its generation
            extra = link_under_load(nvml, nvml_index, functools.partial(_repeat, copy, 4))
            sync()
        what = f"{memory} host memory to GPU" if up else f"GPU to {memory} host memory"
        out.append(entry(name, f"torch copy_ (non_blocking) of {nbytes} B from {what}, median of {repeats} "
                         "cuda.synchronize timings after a warm-up", [nvml_index], nbytes, repeats, seconds,
                         memory=memory, **extra))
    return out


def device_memory(torch: Any, cuda: int, nvml_index: int, nbytes: int, repeats: int) -> dict[str, Any]:
    dev = torch.device("cuda", cuda)
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), lambda: torch.cuda.synchronize(dev), repeats)
    return entry("device_memory", f"torch copy_ of {nbytes} B within GPU memory, bytes read + written over the median "
                 f"of {repeats} cuda.synchronize timings after a warm-up", [nvml_index], nbytes, repeats, s,
                 moved=2 * nbytes)


def device_pair(torch: Any, a: int, b: int, names: list[int], nbytes: int, repeats: int) -> list[dict[str, Any]]:
    """GPU a to GPU b: a direct copy (peer to peer where the GPUs allow it), and one staged
    through pinned host memory (peer access off)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=torch.device("cuda", a))
    dst = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", b))
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    peer = bool(torch.cuda.can_device_access_peer(a, b))

    def sync() -> None:
        torch.cuda.synchronize(a)
        torch.cuda.synchronize(b)

    def staged() -> None:
        host.copy_(src)
        dst.copy_(host)

    devices = [names[a], names[b]]
    tail = f"of {nbytes} B, median of {repeats} timings (both GPUs synchronized) after a warm-up"
    direct = entry("device_to_device", f"torch copy_ GPU to GPU directly ({'peer to peer' if peer else 'the driver stages it: no peer access'}) "
                   + tail, devices, nbytes, repeats, timed(lambda: dst.copy_(src), sync, repeats),
                   peer=True, can_device_access_peer=peer)
    off = entry("device_to_device", "torch copy_ GPU to pinned host memory then to the other GPU (peer access off) "
                + tail, devices, nbytes, repeats, timed(staged, sync, repeats), peer=False,
                can_device_access_peer=peer)
    return [direct, off]


def attempt(name: str, devices: list[int], run: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
    """A probe's entries (``run(*args)``); a probe that raises (out of memory on a busy GPU) is
    failed, with the error."""
    try:
        got = run(*args)
    except Exception as exc:
        failed = skipped(name, f"{type(exc).__name__}: {exc}".splitlines()[0], devices)
        return [{**failed, "status": "failed"}]
    return got if isinstance(got, list) else [got]


def gpu_probes(torch: Any, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Every enabled GPU probe on every selected GPU (and pair)."""
    probes, names = settings["probes"], list(settings["devices"])
    try:
        import pynvml as nvml  # type: ignore[import-not-found]

        nvml.nvmlInit()
    except Exception:
        nvml = None
    out: list[dict[str, Any]] = []
    on = {name: probes.get(name, {}).get("enabled", True) for name in GPU_PROBES}
    size = {name: (int(probes[name]["bytes"]), int(probes[name]["repeats"])) for name in GPU_PROBES if on[name]}
    for i, index in enumerate(names):
        for name in ("host_to_device", "device_to_host"):
            if on[name]:
                out += attempt(name, [index], host_device, torch, nvml, i, index, name, *size[name])
        if on["device_memory"]:
            out += attempt("device_memory", [index], device_memory, torch, i, index, *size["device_memory"])
    if on["device_to_device"]:
        for a in range(len(names)):
            for b in range(a + 1, len(names)):
                out += attempt("device_to_device", [names[a], names[b]], device_pair, torch, a, b, names,
                               *size["device_to_device"])
    if nvml is not None:
        nvml.nvmlShutdown()
    return out


def main(argv: list[str]) -> int:
    settings = json.loads(argv[0])
    probes = settings["probes"]
    import torch

    cuda = bool(torch.cuda.is_available())
    result: dict[str, Any] = {"torch": torch.__version__, "cuda_available": cuda,
                              "cuda_devices": torch.cuda.device_count() if cuda else 0, "results": []}
    if probes.get("host_memory", {}).get("enabled", True):
        hm = probes["host_memory"]
        result["results"] += attempt("host_memory", [], host_memory, torch, int(hm["bytes"]), int(hm["repeats"]))
    if cuda and settings["devices"]:
        result["results"] += gpu_probes(torch, settings)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
