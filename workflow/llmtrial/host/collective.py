"""A short collective across a configuration's ranks before any server starts.

The same idea as vLLM's distributed troubleshooting script: every node joins one
``torch.distributed`` process group (gloo on CPUs, NCCL on GPUs) and all-reduces a tensor a
few times. Its time and bandwidth are recorded, and a broken link (a node that never joins, a
wrong master address, a missing interface, mismatched torch builds) fails within a stated
number of seconds with a diagnosis, instead of surfacing as a half-hour collective timeout
inside a vLLM server.

* One rank: ``python -m llmtrial.host.collective --rank R --world-size N --master-addr A
  --master-port P --backend gloo|nccl [--interface IFACE] [--size-mib 16] [--iters 5]
  [--timeout-s 30] --out result.json`` (:func:`rank_argv` builds that argv). It writes one
  JSON result and exits 0 on success, 1 on failure, always within ``--timeout-s`` of its
  start, also when a peer never shows up.
* :func:`run_local_group` starts ranks on this host (each in its own session, with its own
  log), waits with a deadline, kills what is left at the deadline, and returns
  :func:`summarize`'s record.
* :func:`summarize` turns per-rank results collected anywhere (one rank per host over ssh,
  say) into one record with a diagnosis.

Bandwidth is counted as nccl-tests counts it for all_reduce: ``algbw = bytes / time`` and
``busbw = algbw * 2 * (n - 1) / n``, where ``n`` is the number of ranks. The group's time is
the slowest rank's median, so the figures are what the group as a whole achieved.

Torch is imported only inside a rank process, never by the library functions that start
ranks or read their results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

try:
    from llmtrial.core.fileio import atomic_write_text
    from llmtrial.core.units import MiB
except ImportError:  # a rank run as ``python -c`` on a node without llmtrial: it prints its result (--out -)
    atomic_write_text = None  # type: ignore[assignment]
    MiB = 2**20  # as llmtrial.core.units states it

__all__ = [
    "BACKENDS",
    "busbw_factor",
    "diagnose_rank",
    "main",
    "rank_argv",
    "run_local_group",
    "run_rank",
    "summarize",
]

BACKENDS = ("gloo", "nccl")

#: Seconds a rank keeps for itself before its deadline: to probe the master, write its result
#: and exit.
_MARGIN_S = 1.5
#: Seconds the parent waits past the ranks' own deadline before killing them: interpreter
#: start-up happens before a rank's clock starts.
_GRACE_S = 5.0

# The messages torch and gloo give (torch 2.13, checked by running them on this host).
#: rank 0's TCPStore when not every rank connected: "Timed out after 6 seconds waiting for
#: clients. 1/2 clients joined."
_STORE_WAIT = re.compile(r"Timed out after (?P<s>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<n>\d+) clients joined")
#: another rank's TCPStore client: "The client socket has timed out after 5000ms while trying to
#: connect to (127.0.0.1, 29612)." or "TCP client failed to connect/validate to host ...".
_CLIENT_CONNECT = re.compile(
    r"client socket has (?:timed out after \S+ while trying to connect|failed to connect)"
    r"|TCP client failed to connect|(?i:connection refused)"
)
#: gloo's device when the interface has no address: "Unable to find address for: nosuch0".
_NO_ADDRESS = re.compile(r"Unable to find address for:? (?P<iface>\S+)")
#: gloo's transport when a peer stops answering: "Timed out waiting 5000ms for recv operation
#: to complete"; NCCL's watchdog: "Watchdog caught collective operation timeout".
_OP_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for (?:recv|send) operation|Watchdog caught collective operation timeout"
    r"|(?i:operation timed out)"
)


def busbw_factor(n: int) -> float:
    """nccl-tests' bus-bandwidth factor for all_reduce on ``n`` ranks: ``2 * (n - 1) / n``."""
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def _ifname_var(backend: str) -> str:
    return "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"


def _interfaces() -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(name for _, name in socket.if_nameindex())
    return []


def _probe(addr: str, port: int, timeout_s: float = 0.5) -> str:
    """What a plain TCP connect to ``addr:port`` meets: ``"open"``, ``"refused"``,
    ``"timeout"`` or ``"error: ..."``."""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return f"error: {e}"


def diagnose_rank(phase: str, error: str, *, rank: int, world_size: int, master_addr: str, port: int,
                    backend: str, interface: str | None, timeout_s: float) -> str:
    """What one rank's failure means, in a sentence an operator can act on."""
    where = f"{master_addr}:{port}"
    if "while importing torch" in error:
        return (f"Importing torch took the whole {timeout_s:g} s; the host is slow or busy, so give the check a "
                "longer timeout.")
    m = _NO_ADDRESS.search(error)
    if m or "no such interface" in error:
        name = m["iface"] if m else interface
        return (f"{_ifname_var(backend)}={name}: no such interface (or it has no address) on this host; "
                f"interfaces here: {', '.join(_interfaces()) or 'unknown'}.")
    if "Duplicate GPU detected" in error:
        return ("Two ranks use the same GPU, which NCCL refuses; give each rank its own GPU (LOCAL_RANK or "
                "CUDA_VISIBLE_DEVICES).")
    m = _STORE_WAIT.search(error)
    if m:
        joined, n = int(m["joined"]), int(m["n"])
        return (f"A peer never joined: only {joined} of {n} ranks reached the rendezvous at {where} within "
                f"{m['s']} s; start the missing ranks, or check that they can reach {where} (address, port, firewall).")
    if phase == "init" and rank != 0 and (_CLIENT_CONNECT.search(error) or "deadline" in error):
        seen = _probe(master_addr, port)
        if seen == "refused":
            return (f"Connection refused at {where}: nothing listens there; rank 0 did not start, or the master "
                    "address or port is wrong.")
        if seen == "timeout":
            return f"{where} does not answer (no route, or a firewall drops the packets); check the master address."
        if seen == "open":
            return (f"{where} accepts connections but the rendezvous did not complete within {timeout_s:g} s; "
                    "a peer never joined, or another program holds that port.")
        return f"Cannot reach {where} ({seen}); check the master address."
    if phase == "init" and ("deadline" in error or re.search(r"(?i)timed out", error)):
        return f"The process group did not form within {timeout_s:g} s at {where}; a peer never joined."
    if phase == "all_reduce" and (_OP_TIMEOUT.search(error) or "deadline" in error):
        return (f"The all_reduce timed out: a peer stopped answering after the rendezvous; check the link between "
                f"the nodes and {_ifname_var(backend)} on each.")
    lines = error.splitlines() or ["no message"]
    last = next((line for line in reversed(lines) if line.strip() and line is not lines[0]), None)
    detail = f"{lines[0]} ({last.strip()})" if last else lines[0]
    return f"The {phase} phase failed on rank {rank}: {detail}"


# ------------------------------------------------------------------------- one rank


def free_port(start: int = 29500, stop: int = 30000, *, shuffle: bool = False) -> int:
    """A TCP port in [start, stop) free on every address when asked: a master port for the
    rendezvous (29500 is torch's own default). ``shuffle`` tries them in random order, so that
    runs side by side rarely pick the same one."""
    ports = list(range(start, stop))
    if shuffle:
        random.shuffle(ports)
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{stop - 1}")


def run_rank(rank: int, world_size: int, *, backend: str, master_addr: str, master_port: int,
             interface: str | None = None, size_mib: float = 16, iters: int = 5, timeout_s: float = 30,
             out: str | os.PathLike[str] | None = None, started: float | None = None) -> dict[str, Any]:
    """Join the group as ``rank``, all-reduce, and return (and write to ``out``) the result.

    Everything ends within ``timeout_s`` of ``started`` (a ``time.monotonic()`` value; now by
    default): the process group's own timeout is what is left after importing torch, and a
    watchdog writes a failure result and ends the process at the deadline if torch is still
    waiting then (a client retrying its connection can outlast the timeout it was given).
    """
    one = _Rank(rank, world_size, backend=backend, master_addr=master_addr, master_port=master_port,
                interface=interface, timeout_s=timeout_s, out=out,
                started=time.monotonic() if started is None else started)
    timer = threading.Timer(max(0.0, one.deadline - _MARGIN_S - time.monotonic()), one.watchdog)
    timer.daemon = True
    timer.start()
    try:
        return one.run(size_mib, iters)
    finally:
        timer.cancel()


@dataclass
class _Failed(Exception):
    """A rank's run failed in ``phase`` with ``error``."""

    phase: str
    error: str


class _Rank:
    """One rank's run: its result is written once, by the run or by the watchdog at the deadline."""

    def __init__(self, rank: int, world_size: int, *, backend: str, master_addr: str, master_port: int,
                 interface: str | None, timeout_s: float, out: str | os.PathLike[str] | None, started: float) -> None:
        self.rank, self.world_size, self.backend, self.interface = rank, world_size, backend, interface
        self.master_addr, self.master_port, self.timeout_s, self.out = master_addr, master_port, timeout_s, out
        self.started, self.deadline = started, started + timeout_s
        self.phase, self.step = "init", "starting"  # where the run is, for the watchdog's result
        self.base: dict[str, Any] = {
            "rank": rank, "world_size": world_size, "backend": backend, "interface": interface,
            "master_addr": master_addr, "master_port": master_port, "size_bytes": 0, "iters": 0,
            "hostname": socket.gethostname(), "python": platform.python_version(), "torch": None, "pid": os.getpid(),
        }
        self.lock = threading.Lock()
        self.written = threading.Event()

    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if self.written.is_set():
                return result
            self.written.set()
            if self.out == "-":  # a rank on another node: the result is its last line of output
                print(json.dumps(result), flush=True)
            elif self.out is not None:
                atomic_write_text(self.out, json.dumps(result, indent=2) + "\n")
            return result

    def fail(self, phase: str, error: str) -> dict[str, Any]:
        return self.finish({**self.base, "ok": False, "phase": phase, "error": error,
                            "elapsed_s": round(time.monotonic() - self.started, 3),
                            "diagnosis": diagnose_rank(phase, error, rank=self.rank, world_size=self.world_size,
                                                       master_addr=self.master_addr, port=self.master_port,
                                                       backend=self.backend, interface=self.interface,
                                                       timeout_s=self.timeout_s)})

    def watchdog(self) -> None:
        if self.written.is_set():  # the run finished first
            return
        self.fail(self.phase, f"deadline of {self.timeout_s:g} s reached while {self.step}")
        os._exit(1)

    def run(self, size_mib: float, iters: int) -> dict[str, Any]:
        self.base["iters"] = iters
        if self.backend not in BACKENDS:
            return self.fail("init", f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.interface:
            try:
                socket.if_nametoindex(self.interface)
            except OSError:
                return self.fail("init", f"{_ifname_var(self.backend)}={self.interface}: no such interface")
            os.environ[_ifname_var(self.backend)] = self.interface
        self.step = "importing torch"
        import torch
        import torch.distributed as dist

        self.base["torch"] = torch.__version__
        torch.set_num_threads(1)  # a link check, not a compute test; the host is shared
        try:
            device, init_s = self._join(torch, dist)
            times = self._all_reduce(torch, dist, device, size_mib, iters)
        except _Failed as failed:
            return self.fail(failed.phase, failed.error)
        median = statistics.median(times) if times else None
        # one rank moves nothing between ranks (NCCL returns at once): no bandwidth to speak of
        algbw = self.base["size_bytes"] / median if median and self.world_size > 1 else None
        done = {**self.base, "ok": True, "phase": "done", "init_s": round(init_s, 4), "times_s": times,
                "median_s": median, "algbw_bytes_per_s": algbw,
                "busbw_bytes_per_s": algbw * busbw_factor(self.world_size) if algbw else None,
                "elapsed_s": round(time.monotonic() - self.started, 3), "error": None, "diagnosis": None}
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        return self.finish(done)

    def _join(self, torch: Any, dist: Any) -> tuple[Any, float]:
        """The rendezvous: (device, seconds it took); :class:`_Failed` when it fails."""
        import datetime

        self.step = "waiting for the rendezvous"
        left = self.deadline - _MARGIN_S - time.monotonic()
        if left < 3:
            raise _Failed("init", f"deadline of {self.timeout_s:g} s reached while importing torch")
        if self.backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", self.rank % max(1, torch.cuda.device_count())))
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        else:
            device = torch.device("cpu")
        t0 = time.monotonic()
        # torch's own timeout a second before the watchdog's, so its message (how many ranks
        # joined) is the one recorded; the store reports about a second after its timeout.
        try:
            dist.init_process_group(self.backend, init_method=f"tcp://{self.master_addr}:{self.master_port}",
                                    rank=self.rank, world_size=self.world_size,
                                    timeout=datetime.timedelta(seconds=left - 2),
                                    **({"device_id": device} if device.type == "cuda" else {}))
        except Exception as e:  # torch raises DistStoreError, DistNetworkError, RuntimeError
            raise _Failed("init", f"{type(e).__name__}: {e}") from e
        return device, time.monotonic() - t0

    def _all_reduce(self, torch: Any, dist: Any, device: Any, size_mib: float, iters: int) -> list[float]:
        """A checked warm-up, then ``iters`` timed all_reduces (their seconds) and a barrier; :class:`_Failed`."""
        self.phase, self.step = "all_reduce", "in all_reduce"
        numel = max(1, int(size_mib * MiB) // 4)
        self.base["size_bytes"] = numel * 4

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        try:
            x = torch.full((numel,), float(self.rank + 1), dtype=torch.float32, device=device)
            dist.all_reduce(x)  # warm-up, and a check that the sum is right
            sync()
            want = self.world_size * (self.world_size + 1) / 2
            got = (float(x[0]), float(x[-1]))
            if got != (want, want):
                raise _Failed("all_reduce", f"wrong sum: got {got}, want {want}")
            times = []
            for _ in range(iters):
                t = time.perf_counter()
                dist.all_reduce(x)
                sync()
                times.append(time.perf_counter() - t)
            self.phase, self.step = "barrier", "in the final barrier"
            dist.barrier()
        except _Failed:
            raise
        except Exception as e:
            raise _Failed(self.phase, f"{type(e).__name__}: {e}") from e
        return times


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llmtrial.host.collective", description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--backend", choices=BACKENDS, default="gloo")
    p.add_argument("--interface", default=None, help="sets GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME")
    p.add_argument("--size-mib", type=float, default=16)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=30)
    p.add_argument("--out", required=True, help="the result file, or - for one JSON line on standard output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """One rank, from the command line; exit status 0 when the collective worked, else 1."""
    started = time.monotonic()
    a = _parser().parse_args(argv)
    result = run_rank(a.rank, a.world_size, backend=a.backend, master_addr=a.master_addr, master_port=a.master_port,
                      interface=a.interface, size_mib=a.size_mib, iters=a.iters, timeout_s=a.timeout_s, out=a.out,
                      started=started)
    if a.out != "-":
        print(json.dumps({k: result.get(k) for k in ("rank", "ok", "phase", "median_s", "diagnosis")}), flush=True)
    return 0 if result["ok"] else 1


def rank_argv(rank: int, world_size: int, *, backend: str, master_addr: str, port: int, out: str | os.PathLike[str],
              size_mib: float = 16, iters: int = 5, timeout_s: float = 30, interface: str | None = None,
              python: str = sys.executable, program: Sequence[str] | None = None) -> list[str]:
    """The argv of one rank (run it on the rank's host): ``python -m llmtrial.host.collective``, or
    ``program`` where given: :func:`llmtrial.host.nodes.program_argv` of this module, its own source
    as ``python -c``, for a host that has torch but not llmtrial (give ``out="-"``: the result is the
    rank's last line of output)."""
    program = list(program) if program is not None else [python, "-m", "llmtrial.host.collective"]
    argv = [*program, "--rank", str(rank), "--world-size", str(world_size),
            "--master-addr", master_addr, "--master-port", str(port), "--backend", backend,
            "--size-mib", f"{size_mib:g}", "--iters", str(iters), "--timeout-s", f"{timeout_s:g}", "--out", str(out)]
    if interface:
        argv += ["--interface", interface]
    return argv


# ------------------------------------------------------------------------- the group


@dataclass(frozen=True)
class RankView:
    """The fields of a rank's result the group's summary reads (a rank writes more; one may lack some)."""

    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    ok: bool = False
    phase: str | None = None
    error: str | None = None
    diagnosis: str | None = None
    median_s: float | None = None
    size_bytes: int | None = None
    torch: str | None = None
    python: str | None = None
    master_addr: str | None = None
    master_port: int | None = None


def _versions_differ(seen: Mapping[int | None, str | None]) -> dict[int | None, str] | None:
    """The versions by rank (ranks that name none left out) when two ranks name different ones."""
    named = {rank: v for rank, v in seen.items() if v}
    return named if len(set(named.values())) > 1 else None


def summarize(results: Sequence[dict[str, Any]], *, world_size: int | None = None) -> dict[str, Any]:
    """One record for the group from the per-rank results, wherever they ran.

    ``world_size`` defaults to what the results say. Ranks without a result are named as
    missing. The record: ``ok``, ``world_size``, ``backend``, ``ranks`` (sorted),
    ``reported`` and ``missing`` (rank numbers), ``median_s`` (the slowest rank's median),
    ``algbw_gbps`` and ``busbw_gbps`` (GB/s, 1e9 bytes), ``size_bytes``, ``wall_s`` (None here;
    :func:`run_local_group` fills it), ``phase`` and ``diagnosis`` (None when ok).

    The diagnosis tries, in order: torch (then Python) versions that differ between ranks,
    a missing interface, a master that refuses or drops connections, ranks that never
    joined, an all_reduce timeout, and else the first failing rank's own diagnosis.
    """
    read = [f.name for f in fields(RankView)]
    pairs = sorted(((RankView(**{k: r[k] for k in read if k in r}), dict(r)) for r in results),
                   key=lambda p: -1 if p[0].rank is None else p[0].rank)
    views, ranks = [v for v, _ in pairs], [r for _, r in pairs]
    n = world_size or max((int(v.world_size or 0) for v in views), default=0)
    reported = [v.rank for v in views if v.rank is not None]
    missing = [i for i in range(n) if i not in reported]
    backend = next((v.backend for v in views if v.backend), None)
    record: dict[str, Any] = {
        "ok": False, "world_size": n, "backend": backend, "ranks": ranks, "reported": reported, "missing": missing,
        "size_bytes": next((v.size_bytes for v in views if v.size_bytes), None),
        "wall_s": None, "median_s": None, "algbw_gbps": None, "busbw_gbps": None, "phase": None, "diagnosis": None,
    }
    medians = [v.median_s for v in views if v.ok and v.median_s]
    if medians:
        record["median_s"] = max(medians)
    if medians and record["size_bytes"] and n > 1:
        algbw = record["size_bytes"] / record["median_s"]
        record["algbw_gbps"] = algbw / 1e9
        record["busbw_gbps"] = algbw * busbw_factor(n) / 1e9
    found = _group_diagnosis(views, n=n, reported=reported, missing=missing)
    if found is not None:
        return {**record, "ok": False, "phase": found[0], "diagnosis": found[1]}
    return {**record, "ok": True, "phase": "done"}


def _group_diagnosis(ranks: list[RankView], *, n: int, reported: list[int],
                     missing: list[int]) -> tuple[str, str] | None:
    """(phase, diagnosis) of a group that failed, in :func:`summarize`'s order; None when it did not."""
    failed = [r for r in ranks if not r.ok]
    for name, differ in (("torch", _versions_differ({r.rank: r.torch for r in ranks})),
                         ("Python", _versions_differ({r.rank: r.python for r in ranks}))):
        if differ:
            listed = ", ".join(f"rank {k} {v}" for k, v in sorted(differ.items()))
            return "versions", (f"{name} versions differ between ranks ({listed}); install the same build "
                                "on every node before serving across them.")
    for r in failed:
        if "no such interface" in (r.diagnosis or ""):
            return "init", f"rank {r.rank}: {r.diagnosis}"
    for r in failed:
        d = r.diagnosis or ""
        if d.startswith(("Connection refused", f"{r.master_addr}:{r.master_port} does not answer", "Cannot reach")):
            return "init", f"rank {r.rank}: {d}"
    if not n:
        return "init", "No rank reported a result."
    store_wait = next((r for r in failed if _STORE_WAIT.search(r.error or "")), None)
    if missing or store_wait:
        absent = missing or [r.rank for r in failed if r.phase in ("init", "process") and r is not store_wait]
        what = f" (rank {store_wait.rank}: {_STORE_WAIT.search(store_wait.error or '')[0]})" if store_wait else ""
        return "init", (f"A peer never joined: rank(s) {', '.join(map(str, absent)) or 'unknown'} of {n} did "
                        f"not reach the rendezvous{what}; ranks that reported: "
                        f"{', '.join(map(str, reported)) or 'none'}. Start the missing ranks, or check that "
                        "they reach the master address and port.")
    for r in failed:
        if r.phase in ("all_reduce", "barrier"):
            return r.phase, f"rank {r.rank}: {r.diagnosis}"
    if failed:
        r = failed[0]
        return r.phase or "unknown", f"rank {r.rank}: {r.diagnosis or r.error}"
    return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s session (it was started as its own group leader) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _wait_for_ranks(procs: Mapping[int, subprocess.Popen[bytes]], deadline: float) -> int | None:
    """Wait until every rank has ended or ``deadline`` (a monotonic time) passes; the first rank
    that failed, when one did (a collective needs every rank: the others cannot succeed now)."""
    while time.monotonic() < deadline:
        codes = {rank: proc.poll() for rank, proc in procs.items()}
        if all(c is not None for c in codes.values()):
            return None
        failed_rank = next((rank for rank, c in codes.items() if c not in (None, 0)), None)
        if failed_rank is not None:
            return failed_rank
        time.sleep(0.1)
    return None


def _rank_result(rank: int, proc: subprocess.Popen[bytes], work: Path, log: Path, *, killed: bool,
                 stopped_by: int | None, world_size: int, backend: str) -> dict[str, Any]:
    """What rank ``rank`` wrote to ``rank<R>.json``, or, when it wrote nothing, how its process ended."""
    try:
        return json.loads((work / f"rank{rank}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    if not killed:
        how = f"exited with status {proc.returncode}"
    elif stopped_by is not None:
        how = f"was stopped after rank {stopped_by} failed"
    else:
        how = "was killed at the deadline"
    return {"rank": rank, "world_size": world_size, "backend": backend, "ok": False,
            "phase": "process", "error": f"rank {rank} {how} without writing a result",
            "diagnosis": f"Rank {rank}'s process {how} without writing a result; see {log}."}


def run_local_group(world_size: int, *, backend: str = "gloo", master_addr: str = "127.0.0.1", port: int,
                    size_mib: float = 16, iters: int = 5, timeout_s: float = 30,
                    interface: str | Sequence[str | None] | None = None, python: str = sys.executable,
                    workdir: str | os.PathLike[str], ranks: Sequence[int] | None = None,
                    prefix: Sequence[Sequence[str]] | None = None,
                    env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Start ranks on this host, wait for them within a deadline, and summarize.

    ``ranks`` are the ranks to start here (all by default); the others count as missing.
    ``interface`` is one name for every rank or one per rank. ``prefix`` is an argv put in
    front of each started rank's own (``["ip", "netns", "exec", "ns1"]`` runs it in a network
    namespace), one per entry of ``ranks``. Each rank writes ``rank<R>.json`` and
    ``rank<R>.log`` in ``workdir``; ranks still running ``timeout_s`` + a few seconds after
    they were started have their process group killed, and so have all the others as soon as
    one rank fails (a collective needs every rank). The summary adds ``wall_s``, the logs,
    ``killed`` (ranks whose process group was killed) and, for a rank that wrote nothing, a
    result saying how its process ended.
    """
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    chosen = list(range(world_size)) if ranks is None else list(ranks)
    names = [interface] * world_size if interface is None or isinstance(interface, str) else list(interface)
    env = dict(os.environ if env is None else env)
    library = str(Path(__file__).resolve().parents[2])  # the folder that holds the llmtrial package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (library, env.get("PYTHONPATH")) if p)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    stopped_by: int | None = None
    logs: dict[int, Path] = {}
    t0 = time.monotonic()
    try:
        for i, rank in enumerate(chosen):
            out, log = work / f"rank{rank}.json", work / f"rank{rank}.log"
            out.unlink(missing_ok=True)
            argv = [*(prefix[i] if prefix else ()),
                    *rank_argv(rank, world_size, backend=backend, master_addr=master_addr, port=port, out=out,
                               size_mib=size_mib, iters=iters, timeout_s=timeout_s, interface=names[rank],
                               python=python)]
            with open(log, "wb") as fh:
                procs[rank] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                               env=env, cwd=work, start_new_session=True)
            logs[rank] = log
        stopped_by = _wait_for_ranks(procs, t0 + timeout_s + _GRACE_S)
    finally:
        killed = [rank for rank, proc in procs.items() if proc.poll() is None]
        for rank in killed:
            _kill_group(procs[rank])
    wall = time.monotonic() - t0
    results = [_rank_result(rank, proc, work, logs[rank], killed=rank in killed, stopped_by=stopped_by,
                            world_size=world_size, backend=backend) for rank, proc in procs.items()]
    summary = summarize(results, world_size=world_size)
    summary["wall_s"] = round(wall, 3)
    summary["logs"] = {str(rank): str(path) for rank, path in logs.items()}
    summary["killed"] = killed
    return summary


if __name__ == "__main__":
    status = main()
    if status:  # a failed NCCL or gloo group can hang the interpreter's teardown; the result is written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
