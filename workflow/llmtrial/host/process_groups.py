"""Process groups on any node: started in their own session, found, and stopped there.

A worker of a multi-node configuration (a headless vLLM rank, a Ray daemon) runs on another
host, so it is started, listed and stopped by one small program of the standard library run
with the node's own Python (:meth:`llmtrial.host.nodes.Node.program`: argv, the program after
``-c``, its inputs as JSON on stdin). On a local node the same program runs here.

- :func:`spawn_group` starts an argv in a new session (its pid is its process group id), its
  output appended to a log on the node, and returns at once: the group outlives the ssh
  session that started it. The program reports the pid, the group and the process's start
  time read from ``/proc`` on the node's own clock.
- :func:`group_alive` lists the live members of a group created at or after ``not_before``
  (the leader's start time), so a recycled group id of an older process is never touched.
- :func:`stop_remote_group` sends SIGTERM to those members, waits, then SIGKILL, and reports
  survivors, as :func:`stop_group` does here. Nothing is killed by name.

Each group may carry a ``token`` (an environment variable its processes inherit): a process
that carries it belongs to the group even if it left the session, and a group whose start
was never confirmed (the trial killed during the ssh call) can still be found.

:func:`start_group` writes ``group_launch`` (with the node's ``reach``) to the ledger before
the start and ``group_started`` after; :func:`stop_recorded_groups` is what cleanup does with
every launch still outstanding: rebuild the node from the ledger, stop the group there and
write ``group_stopped`` naming the node. A node that cannot be reached is a residue naming
it, and the launch stays outstanding for the next cleanup.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psutil

from llmtrial.core.ledger import Action, Entry, Ledger
from llmtrial.core.record_base import Residue
from llmtrial.host.nodes import Node, NodeError
from llmtrial.host.scratch import NODE_TMP, scratch_for
from llmtrial.onnode import process_group

__all__ = ["GROUP_ENV", "port_open", "group_members", "stop_group", "spawn_group", "group_alive", "stop_remote_group", "start_group", "finish_group",
           "stop_recorded_groups"]

log = logging.getLogger(__name__)

#: The environment variable that carries a group's token into every process of it.
GROUP_ENV = "LLMTRIAL_GROUP"
#: Seconds a stop waits after SIGKILL (as :func:`stop_group`).
KILL_GRACE_S = 10.0
#: Seconds for the program that starts or lists a group to answer.
ANSWER_TIMEOUT_S = 60.0


def _call(node: Node, op: str, answer_within: float, **inputs: Any) -> dict[str, Any]:
    return node.program(process_group, {"op": op, "env_name": GROUP_ENV, **inputs}, answer_within)


def spawn_group(node: Node, argv: Sequence[str], *, log_path: str | os.PathLike[str],
                env: Mapping[str, str] | None = None, token: str | None = None, scratch: str | None = None,
                timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
    """Start ``argv`` on ``node`` in its own session, output appended to ``log_path`` (a
    path on the node), with ``env`` added to the node's environment (and ``token`` as
    :data:`GROUP_ENV`), the folder ``scratch`` (a path on the node) made for it first; return at once
    ``{"pid", "pgid", "create_time", "node"}``, the start time on the node's clock. Raises
    :class:`NodeError` naming the node when it cannot start."""
    argv = [str(a) for a in argv]
    if not argv:
        raise ValueError("empty command")
    answer = _call(node, "spawn", timeout, argv=argv, log_path=str(log_path), env=dict(env or {}), token=token,
                   scratch=scratch or "")
    if answer.get("error"):
        raise NodeError(f"{node.label()}: cannot start {argv[0]}: {answer['error']}")
    return {"pid": answer["pid"], "pgid": answer["pgid"], "create_time": answer["create_time"], "node": node.name}


def group_alive(node: Node, pgid: int | None, not_before: float | None, *, token: str | None = None,
                timeout: float = ANSWER_TIMEOUT_S) -> list[int]:
    """The live (not zombie) members of group ``pgid`` on ``node`` created at or after
    ``not_before`` (within a second), and any process carrying ``token``."""
    return list(_call(node, "alive", timeout, pgid=pgid, not_before=not_before, token=token)["pids"])


def stop_remote_group(node: Node, pgid: int | None, *, not_before: float | None, timeout: float,
                      token: str | None = None, scratch: str | None = None) -> dict[str, Any]:
    """SIGTERM the members of group ``pgid`` on ``node`` (those :func:`group_alive` lists),
    wait up to ``timeout`` seconds, SIGKILL what is left, and remove its folder ``scratch`` once none
    is; return ``alive_pids`` (before), ``signals`` sent, ``stop_seconds`` and ``survivors``, as seen
    on the node."""
    return _call(node, "stop", timeout + KILL_GRACE_S + ANSWER_TIMEOUT_S, pgid=pgid, not_before=not_before,
                 token=token, term_grace=timeout, kill_grace=KILL_GRACE_S, scratch=scratch or "")


def start_group(ledger: Ledger, node: Node, argv: Sequence[str], *, label: str, log_path: str | os.PathLike[str],
                env: Mapping[str, str] | None = None, scratch: bool = False,
                timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
    """Start a group on ``node`` through the ledger: ``group_launch`` (node, reach, argv,
    environment keys, log, token, and with ``scratch`` the folder on the node that is its temporary
    folder, :mod:`llmtrial.host.scratch`) is written before the start, ``group_started`` (pid,
    pgid, start time) after. Returns :func:`spawn_group`'s answer with ``label``, ``launch``
    (the change's id), ``token`` and ``scratch``. When the start fails the launch stays outstanding:
    cleanup looks for its token on the node."""
    env = dict(env or {})
    token = secrets.token_hex(8)
    folder, scratch_vars = scratch_for(env, environ={}, base=NODE_TMP) if scratch else (None, {})
    launch = ledger.append(Action.GROUP_LAUNCH, node=node.name, label=label, reach=node.describe(),
                           argv=[str(a) for a in argv], env_keys=sorted(env), log_path=str(log_path), token=token,
                           **({"scratch": str(folder)} if folder else {}))
    started = spawn_group(node, argv, log_path=log_path, env={**scratch_vars, **env},
                          token=token, scratch=folder and str(folder), timeout=timeout)
    ledger.append(Action.GROUP_STARTED, node=node.name, label=label, launch=launch.id, pid=started["pid"],
                  pgid=started["pgid"], create_time=started["create_time"])
    log.info("started %s on %s: pid %s", label, node.label(), started["pid"])
    return {**started, "label": label, "launch": launch.id, "token": token, "scratch": launch.scratch}


def finish_group(ledger: Ledger, node: Node, group: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:
    """Stop a group :func:`start_group` started, and write ``group_stopped`` undoing its
    launch unless a member survived (cleanup then tries again)."""
    result = stop_remote_group(node, group["pgid"], not_before=group["create_time"], timeout=timeout,
                               token=group.get("token"), scratch=group.get("scratch"))
    if not result["survivors"]:
        ledger.append(Action.GROUP_STOPPED, node=node.name, label=group["label"], pgid=group["pgid"],
                      undoes=group["launch"], outcome="stopped" if result["alive_pids"] else "none (already gone)")
    return result


def _stop_one(launch: Entry, mark: Entry | None, ledger: Ledger, timeout: float,
              residues: list[Residue]) -> dict[str, Any]:
    name, label = launch.node, launch.label
    pgid, since = (mark.pgid, mark.create_time) if mark else (None, None)
    item: dict[str, Any] = {"label": label, "node": name, "pgid": pgid, "pid": mark and mark.pid,
                            "run": launch.run, "change": launch.id, "alive_pids": []}
    what = f"group {label} (pgid {pgid if pgid is not None else 'never confirmed'}) on node {name}"
    try:
        node = Node.from_reach(name, launch.reach)
        result = stop_remote_group(node, pgid, not_before=since, timeout=timeout, token=launch.token,
                                   scratch=launch.scratch)
    except (NodeError, ValueError, KeyError, TypeError) as err:
        item.update(action="not reached", error=str(err))
        residues.append(Residue(kind="process", what=what, node=name, tried=f"stop it on node {name} from the ledger",
                                seen=str(err)))
        return item
    item.update(alive_pids=result["alive_pids"], stop=result,
                action="would not stop" if result["survivors"] else
                "stopped" if result["alive_pids"] else "none (already gone)")
    if result["survivors"]:
        residues.append(Residue(kind="process", what=what, node=name, tried=", ".join(result["signals"]),
                                seen=f"pids {result['survivors']} still alive"))
    else:
        ledger.append(Action.GROUP_STOPPED, node=name, label=label, pgid=pgid, undoes=launch.id,
                      outcome=item["action"])
    return item


def stop_recorded_groups(launches: list[Entry], ledger: Ledger, timeout: float,
                         residues: list[Residue]) -> list[dict[str, Any]]:
    """Stop, newest first, each group whose ``group_launch`` is still outstanding, on the
    node its entry names (rebuilt from its ``reach``); each ``group_stopped`` names the node
    and the launch it undoes. What cannot be reached or stopped is a residue naming the node."""
    marks = {e.launch: e for e in ledger.entries() if e.action == Action.GROUP_STARTED}
    out = []
    for launch in reversed(launches):
        log.info("stopping group %s on node %s from the ledger", launch.label, launch.node)
        out.append(_stop_one(launch, marks.get(launch.id), ledger, timeout, residues))
    return out


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def group_members(pgid: int, not_before: float | None = None) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``.

    With ``not_before`` (a Unix time), only processes created at or after it count, so a
    recycled group id of an unrelated, older process is never touched.
    """
    members = []
    for proc in psutil.process_iter(["pid", "status", "create_time"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
        if not_before is not None and proc.info["create_time"] + 1.0 < not_before:
            continue
        members.append(proc)
    return members


def stop_group(pgid: int, *, host: str, port: int, timeout: float, not_before: float | None = None,
               leader: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
    """SIGTERM the group, wait, SIGKILL what is left, then confirm the port is closed.

    Returns what was done and seen; ``survivors`` lists pids still alive afterwards.
    """
    t0 = time.monotonic()
    sent: list[str] = []

    def reap() -> None:
        if leader is not None:
            leader.poll()

    for sig, grace in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        reap()
        members = group_members(pgid, not_before)
        if not members:
            break
        sent.append(sig.name)
        for proc in members:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            reap()
            if not group_members(pgid, not_before):
                break
            time.sleep(0.2)
    reap()
    survivors = [p.pid for p in group_members(pgid, not_before)]
    closed_deadline = time.monotonic() + 10.0
    while port_open(host, port) and time.monotonic() < closed_deadline:
        time.sleep(0.2)
    return {
        "signals": sent,
        "stop_seconds": round(time.monotonic() - t0, 3),
        "survivors": survivors,
        "port_closed": not port_open(host, port),
    }
