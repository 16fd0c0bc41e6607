"""On a node: start, list or stop a process group (Python 3.8 or later; the standard library, Linux
/proc). Reads {"op": "spawn" | "alive" | "stop", "env_name", ...} on stdin and prints one JSON object.

A group's members are the processes of its process group that started no earlier than ``not_before``
(a pid reused by another group is not one), and every process carrying the group's token in the
environment variable ``env_name`` (those that left the process group). A group may have a folder of its own
(``scratch``, its temporary files' and sockets'): made just before the start, removed when the start fails or
when a stop leaves no member alive."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

#: A process group member may have started this long before ``not_before`` (clock ticks round).
START_SLACK_S = 1.0
#: How often a stop looks whether the group is gone.
POLL_S = 0.2


@dataclass(frozen=True)
class Given:
    """What the program is asked: the operation, the variable that carries a group's token, and that
    operation's inputs."""

    op: str
    env_name: str
    pgid: int | None = None
    not_before: float | None = None
    token: str | None = None
    argv: list = field(default_factory=list)
    log_path: str = ""
    env: dict = field(default_factory=dict)
    term_grace: float = 0.0
    kill_grace: float = 0.0
    scratch: str = ""


def boot_time() -> float:
    with open("/proc/stat") as f:
        return float(next(line.split()[1] for line in f if line.startswith("btime ")))


def stat(pid: int, boot: float) -> tuple[str, int, float] | None:
    """(state, pgid, start as Unix time) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return rest[0].decode(), int(rest[2]), boot + int(rest[19]) / os.sysconf("SC_CLK_TCK")


def carries(pid: int, env_name: str, token: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{env_name}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def members(given: Given) -> list[int]:
    """The live members of the group ``given`` names (``pgid``, ``not_before``, ``token``)."""
    pgid, not_before, token = given.pgid, given.not_before, given.token
    boot, out = boot_time(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        st = stat(int(name), boot)
        if st is None or st[0] in ("Z", "X"):
            continue
        in_group = pgid is not None and st[1] == pgid and (not_before is None or st[2] + START_SLACK_S >= not_before)
        if in_group or (token and carries(int(name), given.env_name, token)):
            out.append(int(name))
    return sorted(out)


def spawn(given: Given) -> dict:
    """Start ``argv`` in a new session (its own process group), its output appended to ``log_path``."""
    env = dict(os.environ, **given.env)
    if given.token:
        env[given.env_name] = given.token
    folder = os.path.dirname(given.log_path)
    try:
        if folder:
            os.makedirs(folder, exist_ok=True)
        if given.scratch:
            os.mkdir(given.scratch, 0o700)  # the group's own: one that exists is an error, never shared
        with open(given.log_path, "ab") as log:
            proc = subprocess.Popen(given.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
    except (OSError, ValueError) as e:
        if given.scratch and not isinstance(e, FileExistsError):
            shutil.rmtree(given.scratch, ignore_errors=True)
        return {"error": f"{type(e).__name__}: {e}"}
    st = stat(proc.pid, boot_time())
    return {"pid": proc.pid, "pgid": st[1] if st else proc.pid, "create_time": st[2] if st else None}


def stop(given: Given) -> dict:
    """SIGTERM to every member, ``term_grace`` seconds, then SIGKILL to those left, ``kill_grace`` seconds; the
    group's folder removed once none is left."""
    t0, sent = time.monotonic(), []
    alive = members(given)
    for sig, grace in ((signal.SIGTERM, given.term_grace), (signal.SIGKILL, given.kill_grace)):
        left = members(given)
        if not left:
            break
        sent.append(sig.name)
        for pid in left:
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and members(given):
            time.sleep(POLL_S)
    survivors = members(given)
    if given.scratch and not survivors:  # a survivor may still use it: it stays with the open change
        shutil.rmtree(given.scratch, ignore_errors=True)
    return {"alive_pids": alive, "signals": sent, "stop_seconds": round(time.monotonic() - t0, 3),
            "survivors": survivors}


def answer(given: Given) -> dict:
    if given.op == "spawn":
        return spawn(given)
    if given.op == "alive":
        return {"pids": members(given)}
    return stop(given)


def main() -> None:
    print(json.dumps(answer(Given(**json.load(sys.stdin)))), flush=True)
    os._exit(0)  # leave the started group alone: no wait for it at exit


if __name__ == "__main__":
    main()
