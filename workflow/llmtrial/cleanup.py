"""Cleanup: give the host back, from the trial's ledger alone.

Idempotent: it runs after a finished trial, from ``onerror`` when a job fails, after a
successful partial run, and on demand after a crash or ``kill -9``. In reverse order of
what the trial did: stop any trial server still alive (by process group, then confirm
its port closed), check that no trial port listens, revert each vLLM patch (restore the
backups, check the files against RECORD; llmtrial.patching), then restart and health-check
each service the trial quieted, and (the trial's own cleanup and on demand, not after a
failed job) apply the staged weights' policy: keep, archive or delete (llmtrial.weights). What
cannot be undone without force is recorded as a residue.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable

import psutil

from llmtrial.ledger import Ledger
from llmtrial.patching import CHANGES as PATCH_CHANGES
from llmtrial.patching import patches_table, revert_patches
from llmtrial.records import write_record
from llmtrial.server import group_members, port_open, stop_group
from llmtrial.services import Service, quiet, restore
from llmtrial.telemetry import NvmlSource
from llmtrial.weights import apply_policy

log = logging.getLogger(__name__)

LEDGER_NAME = "ledger.jsonl"
#: Ledger actions that change the host and need an undo.
CHANGES = ("job_started", "server_started", "service_quiet", *PATCH_CHANGES)


class HostNotRestored(RuntimeError):
    """Cleanup left residues: the workflow must not report success."""


def unfinished(entries: list[dict[str, Any]]) -> bool:
    """True when the ledger holds changes made after its last completed cleanup."""
    return any(e.get("action") in CHANGES for e in _since_last_cleanup(entries))


def _since_last_cleanup(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = max((i for i, e in enumerate(entries) if e.get("action") == "cleanup_done"), default=-1)
    return entries[last + 1:]


def ensure_quiet(results_dir: Path, services: dict[str, Any], *, ports: Iterable[int] = (),
                 host: str = "127.0.0.1") -> dict[str, Any] | None:
    """Before a configuration job launches its server: quiet the host unless this run
    already has. A configuration rerun on its own after a cleanup gave the host back quiets
    it again; one that finds a job of an earlier run that never finished (a crash) has the
    host restored first. Returns the quiet record, or None when nothing was needed."""
    recent = _since_last_cleanup(Ledger(Path(results_dir) / LEDGER_NAME).entries())
    finished = {e.get("pid") for e in recent if e.get("action") == "job_finished"}
    crashed = [e for e in recent if e.get("action") == "job_started" and e.get("pid") not in finished]
    quieted = any(e.get("action") == "service_quiet" for e in recent)
    if (quieted or not services) and not crashed:
        return None
    log.info("quieting the host first (%s)", "an earlier job never finished" if crashed else "a rerun after cleanup")
    return quiet_host(results_dir, services, ports=ports, host=host)


def services_table(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per quieted service: state before, stopped at, restarted at, health, from the ledger."""
    rows: dict[str, dict[str, Any]] = {}
    for e in entries:
        action = e.get("action")
        if action == "service_quiet":
            name = e["service"]["name"]
            rows[name] = {"name": name, "kind": e["service"]["kind"], "was_running": e["was_running"],
                          "stopped_at": e["t"] if e["was_running"] else None, "down": None,
                          "restarted_at": None, "healthy": None}
        elif action == "service_stopped" and e["name"] in rows:
            rows[e["name"]]["down"] = e["down"]
        elif action == "service_restored" and e["name"] in rows:
            rows[e["name"]].update(restarted_at=e["t"], healthy=True, healthy_after_s=e.get("healthy_after_s"))
    return list(rows.values())


def gpu_snapshot(nvml: Any | None = None) -> dict[str, Any] | None:
    """GPU memory in use and the compute processes on each GPU, or None without NVML."""
    source = NvmlSource(nvml)
    if not source.available:
        return None
    try:
        sample = source.sample()
    finally:
        source.close()
    used = sum(v for k, v in sample.items() if k.endswith(".mem_used_bytes"))
    procs = {k.split(".")[0]: v for k, v in sample.items() if k.endswith(".processes")}
    return {"mem_used_bytes": used, "compute_processes": procs}


def quiet_host(results_dir: Path, services: dict[str, Any], *, ports: Iterable[int] = (), host: str = "127.0.0.1",
               nvml: Any | None = None) -> dict[str, Any]:
    """The quiet stage: restore first if an earlier run of this trial left the host changed,
    then stop every configured service that runs (ledger first), and on a GPU host record
    the GPU memory and compute processes before and after, and the memory freed."""
    ledger = Ledger(Path(results_dir) / LEDGER_NAME)
    record: dict[str, Any] = {"restored_first": None}
    if unfinished(ledger.entries()):
        log.warning("an earlier run of this trial left the host changed (ledger %s): restoring it first", ledger.path)
        record["restored_first"] = run_cleanup(results_dir, ports=ports, host=host)
        if not record["restored_first"]["restored"]:
            raise HostNotRestored("an earlier run of this trial left residues that cleanup could not undo: "
                                  f"{record['restored_first']['residues']}; fix them, then run `snakemake cleanup`")
    before = gpu_snapshot(nvml)
    record.update(quiet([Service.from_config(name, entry) for name, entry in services.items()], ledger))
    after = gpu_snapshot(nvml)
    record["gpu"] = None if before is None or after is None else {
        "before": before, "after": after, "memory_freed_bytes": before["mem_used_bytes"] - after["mem_used_bytes"]}
    return record


def _listener_pids(port: int) -> list[int]:
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted({c.pid for c in conns if c.laddr and c.laddr.port == port
                   and c.status == psutil.CONN_LISTEN and c.pid})


def stop_orphaned_jobs(entries: list[dict[str, Any]], timeout: float, residues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stop configuration jobs still running without their workflow (after ``kill -9`` of
    snakemake): SIGTERM first, which makes a job stop its own server, then SIGKILL."""
    finished = {e.get("pid") for e in entries if e.get("action") == "job_finished"}
    out = []
    for e in entries:
        if e.get("action") != "job_started" or e.get("pid") in finished or e.get("pid") == os.getpid():
            continue
        try:
            proc = psutil.Process(int(e["pid"]))
            alive = abs(proc.create_time() - float(e["create_time"])) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, KeyError, ValueError):
            alive = False
        if not alive:
            continue
        log.warning("configuration job %s (pid %s) outlived its workflow: stopping it", e.get("label"), e["pid"])
        proc.terminate()
        gone, left = psutil.wait_procs([proc], timeout=timeout)
        if left:
            proc.kill()
            gone, left = psutil.wait_procs([proc], timeout=10)
        item = {"label": e.get("label"), "pid": e["pid"], "action": "stopped" if not left else "would not stop"}
        if left:
            residues.append({"kind": "process", "what": f"job {e.get('label')} pid {e['pid']}",
                             "tried": "SIGTERM, SIGKILL", "seen": "still alive"})
        out.append(item)
    return out


def run_cleanup(results_dir: Path, *, ports: Iterable[int] = (), host: str = "127.0.0.1",
                stop_timeout: float = 30.0, weights: bool = False) -> dict[str, Any]:
    """Undo what the ledger in ``results_dir`` records; return the cleanup record. With
    ``weights``, also apply each staged model's policy (keep, archive or delete): the trial's
    own cleanup and an on-demand cleanup do, a cleanup after a failed job does not, so that
    the rerun finds its weights."""
    ledger = Ledger(Path(results_dir) / LEDGER_NAME)
    started = time.time()
    entries = ledger.entries()
    ledger.append("cleanup_start")
    servers: list[dict[str, Any]] = []
    residues: list[dict[str, Any]] = []
    trial_ports = set(ports)
    jobs = stop_orphaned_jobs(entries, stop_timeout, residues)
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
    patched = revert_patches(ledger)
    residues.extend(patched["residues"])
    back = restore(entries, ledger)
    residues.extend(back["residues"])
    staged = apply_policy(entries, ledger) if weights else None
    if staged is not None:
        residues.extend(staged["residues"])
    record = {
        "started": started,
        "finished": time.time(),
        "ledger": str(ledger.path),
        "ledger_entries": len(entries),
        "jobs": jobs,
        "servers": servers,
        "ports": port_checks,
        "services_restored": back["services"],
        "services": services_table(ledger.entries()),
        "patches_reverted": patched["items"],
        "patches": patches_table(ledger.entries()),
        "residues": residues,
        "weights": staged if staged is not None else "not applied: the trial did not finish (a rerun needs them)",
        "restored": not residues,
    }
    ledger.append("cleanup_done", restored=record["restored"], residues=len(residues))
    return record


def cleanup_with_record(results_dir: Path, record_path: Path | None = None, *, ports: Iterable[int] = (),
                        host: str = "127.0.0.1", stop_timeout: float = 30.0, weights: bool = False) -> dict[str, Any]:
    """Run cleanup and write its record (default ``<results>/cleanup/on-demand.json``)."""
    record = run_cleanup(results_dir, ports=ports, host=host, stop_timeout=stop_timeout, weights=weights)
    write_record(record_path or Path(results_dir) / "cleanup" / "on-demand.json", record)
    return record


def restore_after_run(results_dir: Path, *, ports: Iterable[int] = (), host: str = "127.0.0.1") -> dict[str, Any] | None:
    """After a successful workflow run: give back what a partial run left changed (recorded
    as ``cleanup/on-success.json``), and raise HostNotRestored when the last cleanup could
    not restore the host, so the run's exit status says so. Returns the new record, if any."""
    results = Path(results_dir)
    entries = Ledger(results / LEDGER_NAME).entries()
    record = None
    if unfinished(entries):
        record = cleanup_with_record(results, results / "cleanup" / "on-success.json", ports=ports, host=host)
        entries = Ledger(results / LEDGER_NAME).entries()
    done = [e for e in entries if e.get("action") == "cleanup_done"]
    if done and not done[-1].get("restored", True):
        raise HostNotRestored(f"the host was not fully restored ({done[-1].get('residues')} residue(s)); see "
                              f"{results / 'cleanup'} and the report, fix them, then run `snakemake cleanup`")
    return record
