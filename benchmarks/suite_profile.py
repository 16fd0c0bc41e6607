"""Where a run's CPU goes: run a command (by default the suite, as ``make test`` runs it) and account the CPU
time of every process on this machine by what the process is.

    python benchmarks/suite_profile.py [--interval S] [--json FILE] [-- COMMAND ...]

With no COMMAND, the command is ``pytest -n 2`` over the whole suite from this checkout's venv, as ``make test``
runs it. While it runs, every process's CPU time (user + system, ``/proc/<pid>/stat``) is read every S seconds
(default 0.5) and charged to its kind: vLLM's API server, its engine core and its workers (the processes vLLM
spawns name themselves ``VLLM::EngineCore`` and ``VLLM::Worker`` once started; what a process spent before it
named itself is charged to the name it takes), the benchmark client (``llmtrial.serve.vllm_bench`` and ``vllm
bench serve``), snakemake, snakemake's job scripts (by script), pytest's own processes (the tests that run in
them), Chromium, other Python programs (by what they run), and the rest (by name). Prints the wall time, the CPU
seconds in all and as a share of the machine's cores, each kind's CPU seconds and share, the vLLM servers launched
(their API servers and headless ranks seen start, with when), and the machine's use of its cores minute by minute; ``--json`` keeps
the same figures in a file. Exits with the command's exit code.

It accounts the whole machine, not only the command's descendants (a trial's second host is a process of sshd's,
not of pytest's): run it with nothing else on the machine. What a process spent after its last read (all of it, for
one that ended before any read) is charged from the kernel's process accounting (``acct(2)``, as root); without
it that CPU is missed. The kernel keeps one accounting file for the whole machine: a profile run inside another
(the suite's own test of this script, under a profiled ``make test``) takes it for its run and gives it back to the
outer one's file after (named to the command in ``LLMTRIAL_PROFILE_ACCT``), so the outer one misses only what ended
during the inner run. The figures say how much of the machine's own count (``/proc/stat``) the processes charged
account for.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))  # the node programs it reads /proc with are stdlib only: any python3 runs it

from llmtrial.onnode.process_group import boot_time  # noqa: E402
from llmtrial.onnode.telemetry_sampler import cpu as machine_ticks  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    """One read of a process: when it started (clock ticks since boot, its identity with the pid), its CPU
    ticks so far, its name (``comm``) and its command line."""

    start: int
    ticks: int
    comm: str
    cmdline: list[str]


def read_process(pid: int) -> Sample | None:
    """``pid`` as /proc shows it now; None once it has ended (or is a kernel thread with no command line)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return Sample(start=int(fields[19]), ticks=int(fields[11]) + int(fields[12]), comm=comm,
                  cmdline=[a for a in cmdline if a])


def _python_kind(argv: list[str]) -> tuple[str, str]:
    """A Python process's kind and label, from its arguments after the interpreter."""
    text = " ".join(argv)
    if "multiprocessing.spawn" in text:
        return "multiprocessing child", "before it names itself"
    if "vllm.entrypoints" in text or "headless_serve" in text:
        return "vLLM server", "headless rank" if "headless_serve" in text else "API server"
    if "vllm_bench" in text or ("bench" in argv and "serve" in argv):
        return "benchmark client", "vllm bench"
    if "exec(eval(sys.stdin.readline()))" in text or (argv[:2] == ["-m", "pytest"]):
        return "pytest", "pytest"
    script = next((a for a in argv if ".snakemake/scripts/" in a), None)
    if script is not None:  # tmpXXXXXXXX.<name>.py: the job's script, by its name
        return "snakemake job script", script.rsplit("/", 1)[-1].split(".", 1)[-1]
    if argv[:1] == ["-m"] and len(argv) > 1:
        return "other Python", f"-m {argv[1]}"
    if argv[:1] == ["-c"] and len(argv) > 1:
        return "other Python", "-c " + argv[1].strip().split("\n", 1)[0].split(";", 1)[0][:60]
    return "other Python", (argv[0].rsplit("/", 1)[-1] if argv else "python")


def kind_of(comm: str, cmdline: list[str]) -> tuple[str, str]:
    """What a process is (the kind its CPU is charged to) and a label within that kind."""
    if comm.startswith("VLLM::EngineCor"):  # the kernel keeps 15 characters of VLLM::EngineCore
        return "vLLM engine core", "engine core"
    if comm.startswith(("VLLM::Worker", "VllmWorker")):
        return "vLLM worker", "worker"
    if "chrom" in comm:
        return "Chromium", comm
    if cmdline and cmdline[0].startswith("[pytest-xdist"):  # a worker's title, as pytest-xdist sets it
        return "pytest", "pytest"
    exe = cmdline[0].rsplit("/", 1)[-1] if cmdline else ""
    if exe == "snakemake" or (exe.startswith("python") and (cmdline[1:2] and cmdline[1].endswith("/snakemake")
                                                            or cmdline[1:3] == ["-m", "snakemake"])):
        return "snakemake", "snakemake"
    if exe.startswith("python"):
        return _python_kind(cmdline[1:])
    return "other", comm


#: BSD process accounting, version 3 (``struct acct_v3`` of linux/acct.h): the kernel writes one 64-byte record for
#: each process that ends, with its pid, its parent's, its start (seconds since the epoch), its CPU time in clock
#: ticks (as ``comp_t``: 13 bits of mantissa, 3 of base-8 exponent) and its name. That CPU time is the ticks at
#: which the process was found running, not the time /proc/<pid>/stat reports (scaled to what the scheduler
#: measured): with the cores busy it can fall short (23 ticks for a process /proc read at 38 here, two CPU hogs
#: beside it), so it adds to what the reads saw and never takes from it.
ACCT_V3 = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")


@dataclass(frozen=True)
class Ended:
    """A process that ended while accounting was on, as the kernel recorded it."""

    pid: int
    ppid: int
    began: int
    ticks: int
    comm: str


def comp_t(value: int) -> int:
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_accounting(data: bytes) -> list[Ended]:
    """The version-3 records of a process accounting file, in the order the processes ended."""
    ended = []
    for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        rec = ACCT_V3.unpack_from(data, offset)
        if rec[1] & 0x0F != 3:
            continue
        ended.append(Ended(pid=rec[6], ppid=rec[7], began=rec[8], ticks=comp_t(rec[10]) + comp_t(rec[11]),
                           comm=rec[18].split(b"\0", 1)[0].decode(errors="replace")))
    return ended


#: The accounting file of the profile a command runs under, in the command's environment.
ACCT_ENV = "LLMTRIAL_PROFILE_ACCT"


class ProcessAccounting:
    """The kernel's accounting of every process that ends (``acct(2)``; root only, one file for the whole
    machine) switched on into a file of its own for the ``with`` block, then given back to the file of the profile
    this one runs under (:data:`ACCT_ENV`), or switched off; :attr:`on` says whether it could be switched on."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkstemp(prefix="suite-profile-", suffix=".acct")[1])
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.on = False
        self.outer = os.environ.get(ACCT_ENV)

    def __enter__(self) -> ProcessAccounting:
        self.on = self.libc.acct(str(self.path).encode()) == 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on and not (self.outer and os.path.isfile(self.outer) and self.libc.acct(self.outer.encode()) == 0):
            self.libc.acct(None)

    def ended(self) -> list[Ended]:
        """What the kernel recorded (nothing, where accounting could not be switched on); the file is removed."""
        try:
            return read_accounting(self.path.read_bytes())
        finally:
            self.path.unlink(missing_ok=True)


@dataclass
class Seen:
    """A process as the profile knows it: its last read, its kind, the ticks charged to that kind so far, and the
    ticks it had spent before the profile began (0 for a process that began during it)."""

    last: Sample
    kind: tuple[str, str]
    counted: int
    before: int


@dataclass
class Account:
    """CPU ticks by kind and label, and the vLLM servers seen start."""

    began: float = field(default_factory=time.monotonic)
    labels: Counter = field(default_factory=Counter)
    servers: list[float] = field(default_factory=list)
    alive: dict[int, Seen] = field(default_factory=dict)
    gone: dict[int, list[Seen]] = field(default_factory=dict)

    @property
    def ticks(self) -> Counter:
        """CPU ticks by kind (the sum of its labels')."""
        by_kind: Counter = Counter()
        for (kind, _), ticks in self.labels.items():
            by_kind[kind] += ticks
        return by_kind

    def add(self, kind: tuple[str, str], ticks: int) -> None:
        self.labels[kind] += ticks

    def charge(self, pid: int, now: Sample, baseline: bool) -> None:
        """Charge what ``pid`` spent since its last read (all it spent, for a process new since the last read;
        nothing, on the baseline read of the processes that ran before the profile). A process that renamed
        itself has what it spent so far moved to the kind its new name makes it."""
        seen = self.alive.get(pid)
        if seen is not None and seen.last.start != now.start:  # the pid was reused
            self.gone.setdefault(pid, []).append(self.alive.pop(pid))
            seen = None
        if seen is None:
            kind = kind_of(now.comm, now.cmdline)
            self.alive[pid] = Seen(now, kind, 0 if baseline else now.ticks, now.ticks if baseline else 0)
            if not baseline:
                self.add(kind, now.ticks)
                if kind[0] == "vLLM server":
                    self.servers.append(time.monotonic() - self.began)
            return
        spent = now.ticks - seen.last.ticks
        if now.comm != seen.last.comm and (kind := kind_of(now.comm, now.cmdline)) != seen.kind:
            self.add(seen.kind, -seen.counted)  # renamed: all of it goes to the kind of the name it took
            spent, seen.counted, seen.kind = spent + seen.counted, 0, kind
        self.add(seen.kind, spent)
        seen.counted += spent
        seen.last = now

    def read_all(self, own: int, baseline: bool = False) -> None:
        pids = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == own:
                continue
            sample = read_process(int(entry))
            if sample is None or not sample.cmdline:
                continue
            pids.add(int(entry))
            self.charge(int(entry), sample, baseline)
        for pid in set(self.alive) - pids:
            self.gone.setdefault(pid, []).append(self.alive.pop(pid))

    def settle(self, ended: list[Ended], boot: float) -> None:
        """Charge what the kernel recorded of the processes that ended: the rest of a process seen (what it spent
        after its last read, where the kernel's sampled ticks exceed what the reads charged), and the whole of one
        that ended before any read, by its name and its parent's kind."""
        def match(pid: int, began: int) -> Seen | None:
            return next((s for s in [*self.gone.get(pid, []), self.alive.get(pid)]
                         if s is not None and abs(boot + s.last.start / TICK - began) <= 2), None)

        for rec in ended:
            seen = match(rec.pid, rec.began)
            if seen is not None:
                rest = max(0, rec.ticks - seen.before - seen.counted)
                self.add(seen.kind, rest)
                seen.counted += rest
                continue
            parent = self.alive.get(rec.ppid) or (self.gone.get(rec.ppid) or [None])[-1]
            below = parent.kind[0] if parent is not None else "a process not seen"
            self.add(("ended before a read", f"{rec.comm} (started by {below})"), rec.ticks)


def ended_within(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether ``proc`` ends within ``seconds`` (waited for, so the profile ends with its command)."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def profile(command: list[str], interval: float) -> tuple[int, Account, dict]:
    """Run ``command`` and read every process each ``interval`` seconds until it has ended, then charge what the
    kernel's accounting recorded of the processes that ended; the command's exit code, the account and the
    machine's figures (wall seconds, busy CPU seconds, busy share per minute, whether accounting was on)."""
    account = Account()
    own = os.getpid()
    account.read_all(own, baseline=True)
    busy0, total0 = machine_ticks()
    minute_mark, minutes = (busy0, total0), []
    started = time.monotonic()
    with ProcessAccounting() as accounting:
        proc = subprocess.Popen(command, env={**os.environ, ACCT_ENV: str(accounting.path)} if accounting.on else None)
        while not ended_within(proc, interval):
            account.read_all(own)
            if time.monotonic() - started >= 60 * (len(minutes) + 1):
                now = machine_ticks()
                minutes.append((now[0] - minute_mark[0]) / max(1, now[1] - minute_mark[1]))
                minute_mark = now
        account.read_all(own)
    account.settle(accounting.ended(), boot_time())
    busy1, total1 = machine_ticks()
    return proc.returncode, account, {"wall_s": time.monotonic() - started, "busy_cpu_s": (busy1 - busy0) / TICK,
                                      "busy_share": (busy1 - busy0) / max(1, total1 - total0),
                                      "busy_share_by_minute": minutes, "process_accounting": accounting.on}


def figures(account: Account, machine: dict) -> dict:
    """What the profile found, as plain data (the ``--json`` file and what :func:`report` prints)."""
    by_kind = account.ticks
    seen = sum(by_kind.values()) / TICK
    return {**machine, "cores": os.cpu_count(), "seen_cpu_s": seen,
            "kinds": {k: v / TICK for k, v in by_kind.most_common() if v > 0},
            "labels": [[k, label, v / TICK] for (k, label), v in account.labels.most_common() if v > 0],
            "vllm_servers_started_at_s": [round(t, 1) for t in account.servers]}


def report(found: dict) -> list[str]:
    wall, seen = found["wall_s"], found["seen_cpu_s"]
    lines = [f"wall {wall / 60:.1f} min; the machine busy {found['busy_cpu_s']:.0f} CPU-s "
             f"({100 * found['busy_share']:.0f} % of {found['cores']} cores); the processes seen account for "
             f"{seen:.0f} CPU-s of it" + ("" if found["process_accounting"] else
                                         " (no process accounting here: the processes that ended between two "
                                         "reads are missed)"),
             f"vLLM servers launched (API servers and headless ranks): {len(found['vllm_servers_started_at_s'])}", "", "CPU by kind of process:"]
    lines += [f"  {cpu:8.0f} CPU-s {100 * cpu / max(seen, 1e-9):5.1f} %  {kind}" for kind, cpu in found["kinds"].items()]
    lines += ["", "the largest within them:"]
    lines += [f"  {cpu:8.0f} CPU-s  {kind}: {label}" for kind, label, cpu in found["labels"][:25]]
    shares = " ".join(f"{100 * s:.0f}" for s in found["busy_share_by_minute"])
    return [*lines, "", f"the machine's cores in use, minute by minute (%): {shares}"]


def default_command() -> list[str]:
    python = REPO / ".venv" / "bin" / "python"
    return [str(python if python.exists() else sys.executable), "-m", "pytest", "-n", "2", "-p", "no:cacheprovider"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two reads of every process")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ... (default: the suite, -n 2)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    code, account, machine = profile(command or default_command(), args.interval)
    found = figures(account, machine)
    print("\n".join(report(found)))
    if args.json is not None:
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
