"""The process that runs vLLM's serving benchmark for the passes: one a configuration, or one a trial.

:class:`BenchWorker` runs each pass through a long-lived ``python -m llmtrial.serve.vllm_bench --worker``
so that importing vLLM's benchmark (about 7-12 s on a CPU core) is paid once, not once a pass. Given a
:class:`SharedWorker`, the worker is the trial's: the first configuration starts it (a process group
written to the ledger first, ``<trial>/benchmark worker``, so cleanup stops it from the ledger alone), the
next ones connect to it on its abstract Unix socket and pay no import. A pass that times out, or a job
stopped in the middle of a pass, kills the worker: the next configuration starts a fresh one. It ends by
itself once the run's snakemake has ended (under SLURM, where that snakemake runs on the login node: once
the configuration's job has ended, so each job has its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.hostlock import PID_ENV, PID_HOST_ENV, this_host
from llmtrial.core.ledger import Ledger, current_run
from llmtrial.host.nodes import Node, local_node
from llmtrial.host.process_groups import start_group
from llmtrial.serve import vllm_bench

__all__ = ["BenchWorker", "PassRun", "SharedWorker"]

#: How long a configuration waits for the shared worker it started to listen (seconds).
LISTEN_WITHIN_S = 60.0


@dataclass(frozen=True)
class PassRun:
    """How one benchmark pass ran: its start and end (Unix seconds), its exit code (None when it timed out) and
    whether it ran past its timeout."""

    start: float
    end: float
    returncode: int | None
    timed_out: bool


@dataclass(frozen=True)
class SharedWorker:
    """Where a trial's shared benchmark worker listens and how it is started: the abstract socket ``name``
    (one per results folder and run), the ledger and node its start is written for, its ``label``, the
    ``owner`` pid whose end ends it, and its log."""

    name: str
    ledger: Ledger
    node: Node
    label: str
    owner: int
    log_path: Path

    @classmethod
    def of_trial(cls, ledger: Ledger, root: Path, trial: str) -> SharedWorker:
        """The shared worker of the trial whose results folder is ``root``, in this run: owned by the run's
        snakemake where it runs on this host, else (a SLURM job's) by this job."""
        run_pid = os.environ.get(PID_ENV)
        here = os.environ.get(PID_HOST_ENV, this_host()) == this_host()
        key = hashlib.sha256(f"{Path(root).resolve()}\0{current_run()}".encode()).hexdigest()[:24]
        return cls(name=f"llmtrial-bench-{key}", ledger=ledger, node=local_node(ledger.node),
                   label=f"{trial}/benchmark worker", owner=int(run_pid) if run_pid and here else os.getpid(),
                   log_path=Path(root) / "logs" / "benchmark-worker.log")


def _connect(name: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(vllm_bench.address(name))
    except OSError:  # nobody listens: no worker yet, or it ended
        conn.close()
        return None
    return conn


class BenchWorker:
    """vLLM's serving benchmark in one long-lived process (``python -m llmtrial.serve.vllm_bench
    --worker``), so the passes of a configuration (or, ``shared``, of a trial) import it once instead of once
    a pass.

    :meth:`run` takes a pass's standalone argv (:func:`llmtrial.serve.bench.bench_argv`) and returns what a
    standalone run would have: the worker runs the same code with the same flags and writes the same result
    file, the pass's output going to the pass's own log. The worker starts on the first pass (or on
    :meth:`start`): a child in its own session with its stderr (anything printed outside a pass) appended to
    ``log_path``, or, ``shared``, the trial's (:class:`SharedWorker`), connected to, or started when none
    listens. A pass that times out kills the worker's process group and a worker that died is reaped; either
    way the next pass starts (or connects to) a fresh one. ``starts`` counts the workers started,
    ``import_s`` sums the seconds they took to import vLLM's benchmark (None before any was ready), ``pids``
    lists every worker that ran a pass here.
    """

    def __init__(self, *, log_path: Path, python: str = sys.executable, close_timeout: float = 10.0,
                 shared: SharedWorker | None = None) -> None:
        self.log_path = Path(log_path)
        self.python = python
        self.close_timeout = close_timeout
        self.shared = shared
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: socket.socket | None = None
        self.starts = 0
        self.import_s: float | None = None
        self.pids: list[int] = []
        self._peer: int | None = None  # a shared worker's pid, from its socket
        self._started_it = False  # this connection's worker was started here: its import counts here
        self._ready = False
        self._busy = False  # a pass sent and its reply not yet read
        self._buf = b""

    def start(self, deadline: float | None = None) -> None:
        """Start a worker unless one is running (shared: connect to the trial's, starting it when none
        listens); it imports while the caller goes on (the first :meth:`run` waits for it). A configuration's
        job starts it as its server launches: vLLM's start-up runs one process at a time (API server, engine
        core, then its workers), each importing on one core, and the worker's import then takes a core that
        start-up leaves idle."""
        if self.proc is not None or self.conn is not None:
            return
        self._ready, self._busy, self._buf = False, False, b""
        if self.shared is not None:
            try:
                self._connect_shared(time.monotonic() + LISTEN_WITHIN_S if deadline is None else deadline)
            except TimeoutError:
                if deadline is not None:
                    raise  # the pass's own timeout
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # the worker dies with this process (vllm_bench.die_with_parent): the thread that starts it must
            # live as long as the worker is wanted, as the job's main thread does
            self.proc = subprocess.Popen([self.python, "-m", vllm_bench.MODULE, vllm_bench.WORKER_FLAG],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True,
                                         env={**os.environ, vllm_bench.PARENT_ENV: str(os.getpid())})
        self.starts += 1

    def _connect_shared(self, deadline: float) -> None:
        """Connect to the trial's worker, starting it (through the ledger) when none listens; raises
        TimeoutError when none listens by ``deadline`` (monotonic)."""
        spec = self.shared
        assert spec is not None
        conn = _connect(spec.name)
        self._started_it = conn is None
        if conn is None:
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            start_group(spec.ledger, spec.node, [self.python, "-m", vllm_bench.MODULE, vllm_bench.WORKER_FLAG,
                                                 vllm_bench.LISTEN_FLAG, spec.name],
                        label=spec.label, log_path=spec.log_path, env={vllm_bench.OWNER_ENV: str(spec.owner)})
            self.starts += 1
            while (conn := _connect(spec.name)) is None:  # it binds its socket before it imports
                if time.monotonic() >= deadline:
                    raise TimeoutError
                time.sleep(0.05)
        self.conn, self._peer = conn, vllm_bench.peer(conn)[0]

    def run(self, argv: list[str], *, log_path: Path, timeout: float) -> PassRun:
        """One pass: when it started and ended (Unix seconds), its exit code and whether it timed out.
        The timeout covers the whole pass, including the start of a worker it needed."""
        if argv[1:3] != ["-m", vllm_bench.MODULE]:
            raise ValueError(f"not a benchmark pass argv: {argv[:3]}")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.time()
        try:
            rc: int | None = self._pass(argv[3:], log_path, time.monotonic() + timeout)
            timed_out = False
        except TimeoutError:
            pid = self.pid
            self._stop(grace=0.0, kill=True)
            _note(log_path, f"benchmark pass timed out after {timeout:g} s: its worker (process group {pid}) was killed")
            rc, timed_out = None, True
        return PassRun(start=start, end=time.time(), returncode=rc, timed_out=timed_out)

    @property
    def pid(self) -> int | None:
        """The worker's pid (its process group's id too) while this job holds it, else None."""
        return self.proc.pid if self.proc is not None else self._peer

    def _pass(self, flags: list[str], log_path: Path, deadline: float) -> int | None:
        self.start(deadline)
        if not self._ready:
            message = self._read(deadline)
            if message is None:
                return self._died(log_path)
            if self.shared is None or self._started_it:
                self.import_s = (self.import_s or 0.0) + float(message["import_s"])
            if message.get("pid") is not None and message["pid"] not in self.pids:
                self.pids.append(int(message["pid"]))
            self._ready = True
        try:
            self._send(vllm_bench.request(flags, log_path, client=os.getpid() if self.shared else None))
        except OSError:  # a broken pipe or a reset connection: the worker is gone
            return self._died(log_path)
        self._busy = True
        message = self._read(deadline)
        self._busy = False
        return self._died(log_path) if message is None else int(message["returncode"])

    def _send(self, data: bytes) -> None:
        if self.conn is not None:
            self.conn.sendall(data)
            return
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The worker's next message; None at the end of its output (it exited).
        Raises TimeoutError when none is complete by ``deadline`` (monotonic)."""
        if self.conn is not None:
            fd = self.conn.fileno()
        else:
            assert self.proc is not None and self.proc.stdout is not None
            fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise TimeoutError
                try:
                    chunk = os.read(fd, 65536)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return vllm_bench.decode(line)

    def _died(self, log_path: Path) -> int | None:
        if self.conn is not None:
            pid = self._peer
            self._stop(grace=0.0, kill=True)
            _note(log_path, f"benchmark worker {pid} ended (its own output: {self.shared and self.shared.log_path})")
            return None
        code = self._stop(grace=self.close_timeout)
        _note(log_path, f"benchmark worker exited with code {code} (its own output: {self.log_path})")
        return code

    def _stop(self, grace: float, kill: bool = True) -> int | None:
        """End this job's use of the worker. A child: its stdin closed, ``grace`` seconds to exit, then its
        process group killed (while its exited leader is not yet reaped, so the group id is still its own) and
        the leader reaped; its exit code. A shared worker: its group killed first when ``kill`` (while the
        connection is open, so its pid is still its own), then the connection closed; None."""
        conn, self.conn = self.conn, None
        if conn is not None:
            if kill and self._peer is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._peer, signal.SIGKILL)
            conn.close()
            self._peer = None
            return None
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        deadline = time.monotonic() + grace
        while not _exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        proc.stdout.close()
        return code

    def close(self) -> None:
        """Stop using the worker. An idle one: a child gets EOF on its stdin and up to ``close_timeout`` s to
        exit, then its group is killed; a shared one is left listening for the next configuration. One in the
        middle of a pass (the job stopped early: SIGTERM, a failed start-up) has nothing to finish, and its group
        is killed at once, as a child still importing is; a shared one still importing is left to the next."""
        idle = self._ready and not self._busy
        self._stop(grace=self.close_timeout if idle else 0.0, kill=self._busy)

    def __enter__(self) -> BenchWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _note(log_path: Path, text: str) -> None:
    """A line of the workflow's own in a pass's log."""
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"llmtrial: {text}\n")
