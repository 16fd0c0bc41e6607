"""Cleanup: give the host back, from the trial's ledger alone.

Idempotent: it can run after a finished trial, after a failed job, or on demand after a
crash or ``kill -9``. Today it stops any trial server still alive (by process group,
then confirms its port closed) and checks that no trial port listens. Later stages add
their own ledger entries (staged weights, quieted services, patches) and the undo for
each here. What cannot be undone without force is recorded as a residue.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable

import psutil

from llmtrial.ledger import Ledger
from llmtrial.server import group_members, port_open, stop_group

log = logging.getLogger(__name__)

LEDGER_NAME = "ledger.jsonl"


def _listener_pids(port: int) -> list[int]:
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted({c.pid for c in conns if c.laddr and c.laddr.port == port
                   and c.status == psutil.CONN_LISTEN and c.pid})


def run_cleanup(results_dir: Path, *, ports: Iterable[int] = (), host: str = "127.0.0.1",
                stop_timeout: float = 30.0) -> dict[str, Any]:
    """Undo what the ledger in ``results_dir`` records; return the cleanup record."""
    ledger = Ledger(Path(results_dir) / LEDGER_NAME)
    started = time.time()
    entries = ledger.entries()
    ledger.append("cleanup_start")
    servers: list[dict[str, Any]] = []
    residues: list[dict[str, Any]] = []
    trial_ports = set(ports)
    for entry in reversed(entries):
        if entry.get("action") != "server_started":
            continue
        pgid, port = int(entry["pgid"]), int(entry["port"])
        trial_ports.add(port)
        alive = [p.pid for p in group_members(pgid, not_before=entry.get("launched_at"))]
        item: dict[str, Any] = {"label": entry.get("label"), "pgid": pgid, "port": port, "alive_pids": alive}
        if alive:
            log.warning("server %s (pgid %d) still alive: stopping it", entry.get("label"), pgid)
            item["action"] = "stopped"
            item["stop"] = stop_group(pgid, host=entry.get("host", host), port=port, timeout=stop_timeout,
                                      not_before=entry.get("launched_at"))
            if item["stop"]["survivors"]:
                residues.append({"kind": "process", "what": f"server {entry.get('label')} pgid {pgid}",
                                 "tried": item["stop"]["signals"], "seen": f"pids {item['stop']['survivors']} still alive"})
        else:
            item["action"] = "none (already stopped)"
        servers.append(item)
    port_checks = []
    for port in sorted(trial_ports):
        listening = port_open(host, port)
        check: dict[str, Any] = {"port": port, "listening": listening}
        if listening:
            check["pids"] = _listener_pids(port)
            residues.append({"kind": "port", "what": f"{host}:{port}", "tried": "checked after stopping trial servers",
                             "seen": f"still listening (pids {check['pids'] or 'unknown'})"})
        port_checks.append(check)
    record = {
        "started": started,
        "finished": time.time(),
        "ledger": str(ledger.path),
        "ledger_entries": len(entries),
        "servers": servers,
        "ports": port_checks,
        "residues": residues,
        "restored": not residues,
    }
    ledger.append("cleanup_done", restored=record["restored"], residues=len(residues))
    return record
