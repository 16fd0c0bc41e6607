"""The host lock: one trial at a time changes a host.

Two trials on one host undo each other's work: the second records a service the first quieted as
"left stopped (was not running)", and the first one's cleanup starts it again while the second
still serves. So the first change a trial makes to a host takes the host's lock (a JSON file, by
default ``/run/lock/llmtrial-host.json``; ``host_lock.path`` in the trial file, or
``LLMTRIAL_HOST_LOCK`` in the environment in place of it), and only a cleanup that gave the host
back releases it. The lock names its holder (the trial, its results folder, the run, the pid of
the run's snakemake and the node), so a second trial that wants the host waits for it, saying
who holds it, and refuses after ``host_lock.wait_s`` seconds.

The lock outlives its holder's process on purpose: after ``kill -9`` the host is still changed,
and it stays held until ``snakemake cleanup`` (or ``llmtrial cleanup``) of that trial gives it
back. A rerun of the same trial (the same results folder) takes the lock over: its cleanup
undoes what the earlier run left. Taking the lock is a change written to the trial's ledger
(``host_locked``) and releasing it the undo (``host_unlocked``), so cleanup releases it from the
ledger alone. Every read and write of the lock file happens under an ``flock`` on a guard file
beside it, which the kernel drops with its process: two trials never both take the lock.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict

#: The lock file's path in place of ``host_lock.path``, for the workflow to read (an operator's or a test's).
LOCK_ENV = "LLMTRIAL_HOST_LOCK"
#: The lock file a workflow run takes (the workflow sets it, its jobs inherit it; unset, nothing takes a lock).
RUN_LOCK_ENV = "LLMTRIAL_HOST_LOCK_FILE"
#: Seconds a change waits for the lock before it refuses (the workflow sets it from ``host_lock.wait_s``).
WAIT_ENV = "LLMTRIAL_HOST_LOCK_WAIT"
#: The pid of the snakemake process whose run holds the lock (the workflow sets it; jobs inherit it).
PID_ENV = "LLMTRIAL_RUN_PID"
#: The host the run's snakemake runs on, where its pid is (the workflow sets it; jobs inherit it: under
#: SLURM, the login node's name, while the job's changes are made on the node the allocation gave).
PID_HOST_ENV = "LLMTRIAL_RUN_HOST"
#: SLURM's name for the node a job (or a step of one) runs on; set by slurmd for every job.
SLURM_NODE_ENV = "SLURMD_NODENAME"
#: Seconds between the waiting trial's lines that say who holds the host.
SAY_EVERY_S = 30.0


def this_host() -> str:
    """The machine this process changes: inside a SLURM job the node's SLURM name (which ``srun
    --nodelist`` reaches again), else this machine's hostname."""
    return os.environ.get(SLURM_NODE_ENV) or socket.gethostname()


class Holder(BaseModel):
    """Who holds the host: the content of the lock file."""

    model_config = ConfigDict(extra="ignore")

    trial: str
    results: str
    run: str
    pid: int
    node: str
    hostname: str  # where the pid is: the run's snakemake
    since: float

    def alive(self) -> bool:
        """Whether the holder's snakemake still runs (on this host; another host's pid is not checked)."""
        return self.hostname != this_host() or psutil.pid_exists(self.pid)

    def describe(self) -> str:
        state = ("running" if self.alive() else "not running") if self.hostname == this_host() \
            else f"on host {self.hostname}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return (f"trial {self.trial} (results {self.results}, run {self.run}, pid {self.pid} {state}, "
                f"node {self.node}) since {when}")


class HostBusy(RuntimeError):
    """Another trial held the host for longer than this one would wait."""


def holder_for(results: Path, run: str, node: str) -> Holder:
    """This process's claim on the host, for the trial whose results folder is ``results``."""
    pid = int(os.environ.get(PID_ENV) or os.getpid())
    return Holder(trial=results.name, results=str(results), run=run, pid=pid, node=node,
                  hostname=os.environ.get(PID_HOST_ENV) or this_host(), since=time.time())


@contextmanager
def _guard(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.guard", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def read_holder(path: Path) -> Holder | None:
    """The lock's holder, or None when the host is free (a lock file that does not parse counts as
    held by nobody: it can only be a write torn by a crash, which the guard makes the last one)."""
    try:
        return Holder.model_validate_json(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def _write(path: Path, holder: Holder) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(holder.model_dump_json(), encoding="utf-8")
    os.replace(tmp, path)


def tell(line: str) -> None:
    """A line for the job's log and the terminal the workflow runs in (a job's stderr is its log)."""
    for stream in {id(s): s for s in (sys.stderr, sys.__stderr__) if s is not None}.values():
        print(line, file=stream, flush=True)


def busy_message(path: Path, held: Holder, wait_s: float) -> str:
    advice = ("" if held.alive() else
              f"; its snakemake is not running: give the host back with `snakemake cleanup` in that trial's "
              f"folder (or `llmtrial cleanup {held.results}`)")
    return f"the host lock {path} is held by {held.describe()}{advice}; waited {wait_s:.0f} s (host_lock.wait_s)"


def acquire(path: Path, me: Holder, *, wait_s: float, before: Callable[[Holder | None], None],
            poll_s: float = 1.0, say: Callable[[str], None] | None = None) -> bool:
    """Hold the host for ``me``: at once when it is free, held by ``me``'s run already, or held by
    an earlier run of the same results folder; else wait up to ``wait_s`` seconds, saying who holds
    it, then raise :class:`HostBusy`. ``before(earlier_holder)`` runs under the guard just before
    the lock is written (it writes the ledger entry). Returns False when ``me``'s run held it already."""
    say = say or tell
    deadline, said = time.monotonic() + wait_s, 0.0
    while True:
        with _guard(path):
            held = read_holder(path)
            if held is not None and held.results == me.results and held.run == me.run:
                return False
            if held is None or held.results == me.results:
                before(held)
                _write(path, me)
                return True
        now = time.monotonic()
        if now >= deadline:
            message = busy_message(path, held, wait_s)
            say(f"llmtrial: refusing to change the host: {message}")
            raise HostBusy(message)
        if now - said >= SAY_EVERY_S or not said:
            say(f"llmtrial: waiting for the host (up to {deadline - now:.0f} s more): the host lock {path} is held "
                f"by {held.describe()}")
            said = now
        time.sleep(min(poll_s, max(0.0, deadline - now)))


def release(path: Path, results: str, run: str) -> str:
    """Give the host back for ``run`` of the trial at ``results``: ``released``, ``taken over by run
    R`` (a later run of the same trial holds it now), ``held by <holder>`` (another trial's; left
    alone) or ``not held``."""
    with _guard(path):
        held = read_holder(path)
        if held is None:
            return "not held"
        if held.results != results:
            return f"held by {held.describe()}"
        if held.run != run:
            return f"taken over by run {held.run}"
        path.unlink()
        return "released"


def lock_settings() -> tuple[Path, float] | None:
    """The lock file and the wait this process was given (:data:`RUN_LOCK_ENV`, :data:`WAIT_ENV`); None
    outside a workflow run (the library used on its own takes no lock)."""
    path = os.environ.get(RUN_LOCK_ENV)
    if not path:
        return None
    return Path(path), float(os.environ.get(WAIT_ENV) or 0)
