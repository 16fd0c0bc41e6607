"""The probe program: copies timed with the serving environment's torch, printed as one JSON line.

It runs as ``python -c <this file's source> <settings as JSON>`` with the serving
environment's Python (:func:`llmtrial.host.probes.probe_argv`), so it imports nothing but the
standard library, torch and, where installed, nvidia-ml-py (``pynvml``, to read a GPU's PCIe
link while a copy keeps it busy). The settings: ``{"probes": {name: {"enabled", "bytes",
"repeats"}}, "devices": [NVML index of each CUDA device, in CUDA's order]}`` (each probe's a :class:`Setting`); the parent
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
from dataclasses import asdict, dataclass
from typing import Any

GPU_PROBES = ("host_to_device", "device_to_host", "device_memory", "device_to_device")
#: The fields every entry prints; the others only where the probe has them.
ALWAYS = ("name", "status", "kind", "method", "devices", "bytes", "repeats", "gbps", "seconds_median", "reason")


@dataclass
class Probe:
    """One probe's entry, printed as the preflight record's ``probes.results`` holds it."""

    name: str
    status: str
    method: str | None
    devices: list[int]
    bytes: int | None = None
    repeats: int | None = None
    gbps: float | None = None
    seconds_median: float | None = None
    reason: str | None = None
    kind: str = "measured"
    memory: str | None = None
    peer: bool | None = None
    can_device_access_peer: bool | None = None
    pcie_gen_under_load: int | None = None
    pcie_width_under_load: int | None = None
    pcie_under_load_error: str | None = None

    def as_json(self) -> dict[str, str | int | float | bool | list[int] | None]:
        """The entry as printed: every field of :data:`ALWAYS`, the others where set."""
        return {key: value for key, value in asdict(self).items() if key in ALWAYS or value is not None}


@dataclass(frozen=True)
class Setting:
    """One probe's settings as the parent sends them (the trial file's ``probes.<name>``; it sends every
    probe's)."""

    enabled: bool = True
    bytes: int = 0
    repeats: int = 1


def entry(name: str, method: str, devices: list[int], nbytes: int, repeats: int, seconds: list[float],
          moved: int | None = None) -> Probe:
    """A measured probe: ``moved`` bytes (``nbytes`` by default) over the median of ``seconds``."""
    median = statistics.median(seconds)
    gbps = (moved if moved is not None else nbytes) / median / 1e9 if median > 0 else None
    return Probe(name, "measured", method, devices, nbytes, repeats, gbps, median)


def skipped(name: str, reason: str, devices: list[int] | None = None) -> Probe:
    return Probe(name, "skipped", None, devices or [], reason=reason)


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


def host_memory(torch: Any, nbytes: int, repeats: int) -> Probe:
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), lambda: None, repeats)
    return entry("host_memory", f"torch copy_ of a {nbytes} B uint8 tensor into another in host memory "
                 f"({torch.get_num_threads()} threads), bytes read + written over the median of {repeats} "
                 "perf_counter timings after one warm-up", [], nbytes, repeats, seconds, moved=2 * nbytes)


def _repeat(fn: Callable[[], Any], n: int) -> None:
    for _ in range(n):
        fn()


def link_under_load(probe: Probe, nvml: Any, index: int, busy: Callable[[], None]) -> None:
    """Fill in ``probe`` the PCIe generation and width NVML reports while ``busy`` has copies in flight."""
    if nvml is None:
        return
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        busy()
        probe.pcie_gen_under_load = nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
        probe.pcie_width_under_load = nvml.nvmlDeviceGetCurrPcieLinkWidth(h)
    except Exception as exc:  # a field NVML will not give
        probe.pcie_under_load_error = f"{type(exc).__name__}: {exc}"


def host_device(torch: Any, nvml: Any, cuda: int, nvml_index: int, name: str, nbytes: int,
                repeats: int) -> list[Probe]:
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
        what = f"{memory} host memory to GPU" if up else f"GPU to {memory} host memory"
        probe = entry(name, f"torch copy_ (non_blocking) of {nbytes} B from {what}, median of {repeats} "
                      "cuda.synchronize timings after a warm-up", [nvml_index], nbytes, repeats, seconds)
        probe.memory = memory
        if pinned and up:  # read the link while four copies keep it busy: an idle GPU may drop its generation
            link_under_load(probe, nvml, nvml_index, functools.partial(_repeat, copy, 4))
            sync()
        out.append(probe)
    return out


def device_memory(torch: Any, cuda: int, nvml_index: int, nbytes: int, repeats: int) -> Probe:
    dev = torch.device("cuda", cuda)
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), lambda: torch.cuda.synchronize(dev), repeats)
    return entry("device_memory", f"torch copy_ of {nbytes} B within GPU memory, bytes read + written over the median "
                 f"of {repeats} cuda.synchronize timings after a warm-up", [nvml_index], nbytes, repeats, s,
                 moved=2 * nbytes)


def device_pair(torch: Any, a: int, b: int, names: list[int], nbytes: int, repeats: int) -> list[Probe]:
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
                   + tail, devices, nbytes, repeats, timed(lambda: dst.copy_(src), sync, repeats))
    off = entry("device_to_device", "torch copy_ GPU to pinned host memory then to the other GPU (peer access off) "
                + tail, devices, nbytes, repeats, timed(staged, sync, repeats))
    direct.peer, off.peer = True, False
    direct.can_device_access_peer = off.can_device_access_peer = peer
    return [direct, off]


def attempt(name: str, devices: list[int], run: Callable[..., Probe | list[Probe]], *args: Any) -> list[Probe]:
    """A probe's entries (``run(*args)``); a probe that raises (out of memory on a busy GPU) is
    failed, with the error."""
    try:
        got = run(*args)
    except Exception as exc:
        failed = skipped(name, f"{type(exc).__name__}: {exc}".splitlines()[0], devices)
        failed.status = "failed"
        return [failed]
    return got if isinstance(got, list) else [got]


def gpu_probes(torch: Any, settings: dict[str, Setting], names: list[int]) -> list[Probe]:
    """Every enabled GPU probe (``settings``, by name) on every selected GPU (and pair): ``names`` are
    the NVML indexes of CUDA's devices."""
    try:
        import pynvml as nvml  # type: ignore[import-not-found]

        nvml.nvmlInit()
    except Exception:
        nvml = None
    out: list[Probe] = []
    on = {name: settings[name].enabled for name in GPU_PROBES}
    size = {name: (settings[name].bytes, settings[name].repeats) for name in GPU_PROBES if on[name]}
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
    given = json.loads(argv[0])
    settings = {name: Setting(**one) for name, one in given["probes"].items()}
    devices = [int(i) for i in given["devices"]]
    import torch

    cuda = bool(torch.cuda.is_available())
    results: list[Probe] = []
    hm = settings["host_memory"]
    if hm.enabled:
        results += attempt("host_memory", [], host_memory, torch, hm.bytes, hm.repeats)
    if cuda and devices:
        results += gpu_probes(torch, settings, devices)
    print(json.dumps({"torch": torch.__version__, "cuda_available": cuda,
                      "cuda_devices": torch.cuda.device_count() if cuda else 0,
                      "results": [p.as_json() for p in results]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
