"""Cleanup: give the host back, from the trial's ledger alone.

Idempotent: it runs after a finished trial, from ``onerror`` when a job fails, after a
successful partial run, and on demand after a crash or ``kill -9``. In reverse order of
what the trial did: stop any trial server still alive (by process group, then confirm
its port closed), stop each process group the trial started on any node (on that node,
rebuilt from the ledger; llmtrial.host.process_groups), check that no trial port listens, revert each
vLLM patch (restore the backups, check the files against RECORD; llmtrial.patch.patching), then restart and health-check
each service the trial quieted, and (the trial's own cleanup and on demand, not after a
failed job) apply the staged weights' policy: keep, archive or delete (llmtrial.weights.policy). What
cannot be undone without force is recorded as a residue.

Undo is matched change by change (each undo entry names the change it undoes), so every
change still open from any run is undone, and nothing already undone is touched again.
The record separates what this run changed from what earlier runs left behind.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

from llmtrial.core.cleanup_model import (
    CleanupRecord,
    HostAfter,
    JobRow,
    LeftBehind,
    PatchRow,
    PortState,
    ServerRow,
    ServiceRow,
    Undo,
    WeightsOutcome,
)
from llmtrial.core.hostlock import read_holder, tell, this_host
from llmtrial.core.hostlock import release as release_lock
from llmtrial.core.ledger import Action, Entry, Ledger, replay
from llmtrial.core.paths import TrialPaths
from llmtrial.core.record_base import HeldGpu, LockRow, Residue
from llmtrial.core.records import as_written, load_record, write_record
from llmtrial.host.gpus import recheck_failed
from llmtrial.host.process_groups import group_members, port_open, stop_group, stop_recorded_groups
from llmtrial.host.scratch import remove_scratch
from llmtrial.host.services import Restored, check_running, restore
from llmtrial.host.slurm_hosts import JOB_ENV, in_batch_step, job_state
from llmtrial.lifecycle.ledger_tables import group_rows, job_rows, patches_table, server_rows, services_table
from llmtrial.lifecycle.on_node import cleanup_there, hosts_to_reach
from llmtrial.patch.patching import Reverted, group_patches, revert_patches
from llmtrial.weights.policy import PolicyApplied, apply_policy

log = logging.getLogger(__name__)

#: A row of the cleanup record's tables: a quiet of a service, a patched file, a job, a server or group.
Row = TypeVar("Row", ServiceRow, PatchRow, JobRow, ServerRow)
#: A row of a change cleanup undoes itself: a job, a server or group.
UndoRow = TypeVar("UndoRow", bound=Undo)


class HostNotRestored(RuntimeError):
    """Cleanup left residues: the workflow must not report success."""


def outstanding(entries: list[Entry]) -> dict[str, list[Entry]]:
    """Every change the ledger records that no later entry undid, by kind, from any run
    (:func:`llmtrial.core.ledger.replay`): configuration jobs, servers, process groups on any
    node, services stopped, patched files and plugin folders (here, and their copies on
    other nodes), staged weights whose policy was not applied yet, and takings of the host's lock."""
    state = replay(entries)
    patches = group_patches(state.outstanding["patches"])
    serving = state.open("servers")
    return {"jobs": state.open("jobs"), "servers": [e for e in serving if e.action == Action.SERVER_STARTED],
            "groups": [e for e in serving if e.action == Action.GROUP_LAUNCH], "services": state.open("services"),
            "patches": [o.entry for group in patches.values() for o in group.values()],
            "weights": state.open("weights"), "gpus": state.open("gpus"), "locks": state.open("locks")}


def unfinished(entries: list[Entry]) -> bool:
    """True when the ledger holds a change to the host that no entry undid (the staged
    weights aside: a failed run keeps them for its rerun; and the host's lock, which the
    running trial holds from its first change to its cleanup)."""
    return replay(entries).any_open(besides=("weights", "locks"))


def release_host_locks(ledger: Ledger, *, release: bool) -> list[LockRow]:
    """Every taking of the host's lock still open in the ledger, each released (``release``: the
    host was given back) or, when not, kept; a taking that a later run of the trial took over is
    closed either way (llmtrial.core.hostlock)."""
    rows = []
    for e in replay(ledger.entries()).open("locks"):
        path, holder = Path(e.path), e.holder
        held = read_holder(path)
        if not release and not (held is not None and held.results == holder.results and held.run != e.run):
            rows.append(LockRow(path=str(path), run=e.run, outcome="kept"))
            continue
        outcome = release_lock(path, holder.results, e.run)
        ledger.append(Action.HOST_UNLOCKED, path=str(path), undoes=e.id, outcome=outcome)
        rows.append(LockRow(path=str(path), run=e.run, outcome=outcome))
    return rows


def restore_first(results_dir: Path, *, ports: Iterable[int] = (), host: str = "127.0.0.1") -> CleanupRecord | None:
    """Before the host is quieted: when any run of this trial left a change open (a crash),
    give the host back first. Returns that cleanup's record (None when nothing was open);
    raises :class:`HostNotRestored` when residues remain."""
    ledger = Ledger(TrialPaths(Path(results_dir)).ledger, only_host=this_host())
    if not unfinished(ledger.entries()):
        return None
    log.warning("an earlier run of this trial left the host changed (ledger %s): restoring it first", ledger.path)
    record = run_cleanup(results_dir, ports=ports, host=host, release_host=False)  # the running trial keeps it
    if not record.restored:
        raise HostNotRestored("an earlier run of this trial left residues that cleanup could not undo: "
                              f"{[as_written(r) for r in record.residues]}; fix them, then run `snakemake cleanup`")
    return record


def _listener_pids(port: int) -> list[int]:
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted({c.pid for c in conns if c.laddr and c.laddr.port == port
                   and c.status == psutil.CONN_LISTEN and c.pid})



def _split(rows: list[Row], run: str, undone_by: Callable[[Row], str | None]) -> tuple[list[Row], list[Row]]:
    """This run's rows, and the rows of earlier runs' changes this run undid (``undone_by``: the run
    that undid a row's change) or that are still outstanding (an earlier run's change already undone
    before is in neither)."""
    mine = [r for r in rows if r.run == run]
    left = [r for r in rows if r.run != run and undone_by(r) in (run, None)]
    return mine, left


def _with_done(rows: list[UndoRow], done: list[UndoRow]) -> list[UndoRow]:
    """``rows`` (from the ledger), each with the fields of what this cleanup ``done`` to its change."""
    by_change = {d.change: d for d in done}
    return [r.model_copy(update=by_change[r.change].model_dump(exclude_unset=True)) if r.change in by_change else r
            for r in rows]


def _undone_by(row: JobRow | ServerRow) -> str | None:
    return row.undone_by_run


def stop_orphaned_jobs(jobs: list[Entry], ledger: Ledger, timeout: float,
                       residues: list[Residue]) -> list[JobRow]:
    """End each configuration job the ledger still has open: one that outlived its workflow
    (after ``kill -9`` of snakemake) gets SIGTERM first, which makes it stop its own server,
    then SIGKILL; one already gone is marked so. Each ``job_stopped`` names its ``job_started``."""
    out = []
    for e in jobs:
        if e.pid == os.getpid():
            continue
        try:
            proc = psutil.Process(int(e.pid))
            alive = abs(proc.create_time() - float(e.create_time)) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, TypeError, ValueError):
            alive = False
        left: list[psutil.Process] = []
        if alive:
            log.warning("configuration job %s (pid %s) outlived its workflow: stopping it", e.label, e.pid)
            proc.terminate()
            gone, left = psutil.wait_procs([proc], timeout=timeout)
            if left:
                proc.kill()
                gone, left = psutil.wait_procs([proc], timeout=10)
        item = JobRow(label=e.label, pid=e.pid, run=e.run, change=e.id,
                      action="none (already gone)" if not alive else "stopped" if not left else "would not stop")
        if left:
            residues.append(Residue(kind="process", what=f"job {e.label} pid {e.pid}", tried="SIGTERM, SIGKILL",
                                    seen="still alive"))
        else:
            ledger.append(Action.JOB_STOPPED, label=e.label, pid=e.pid, undoes=e.id, outcome=item.action)
        out.append(item)
    return out


def stop_servers(servers: list[Entry], ledger: Ledger, host: str, timeout: float,
                 residues: list[Residue]) -> list[ServerRow]:
    """Stop, newest first, each server the ledger still has open (by process group, then
    confirm its port closed); each ``server_stopped`` names its ``server_started``."""
    out = []
    for entry in reversed(servers):
        pgid, port = int(entry.pgid), int(entry.port)
        alive = [p.pid for p in group_members(pgid, not_before=entry.launched_at)]
        item = ServerRow(label=entry.label, pgid=pgid, port=port, run=entry.run, change=entry.id, alive_pids=alive,
                         action="none (already stopped)")
        if alive:
            log.warning("server %s (pgid %d) still alive: stopping it", entry.label, pgid)
            item.action = "stopped"
            item.stop = stop = stop_group(pgid, host=entry.host or host, port=port, timeout=timeout,
                                          not_before=entry.launched_at)
            if stop["survivors"]:
                item.action = "would not stop"
                residues.append(Residue(kind="process", what=f"server {entry.label} pgid {pgid}",
                                        tried=", ".join(stop["signals"]), seen=f"pids {stop['survivors']} still alive"))
        if item.action != "would not stop":
            remove_scratch(entry.scratch)  # its temporary folder (llmtrial.host.scratch)
            ledger.append(Action.SERVER_STOPPED, label=entry.label, pgid=pgid, port=port, undoes=entry.id,
                          outcome=item.action)
        out.append(item)
    return out


def check_ports(ports: Iterable[int], host: str, residues: list[Residue]) -> list[PortState]:
    """Whether each trial port still listens after the servers were stopped (a residue if so)."""
    checks = []
    for port in sorted(set(ports)):
        if not port_open(host, port):
            checks.append(PortState(port=port, listening=False))
            continue
        pids = _listener_pids(port)
        residues.append(Residue(kind="port", what=f"{host}:{port}", tried="checked after stopping trial servers",
                                seen=f"still listening (pids {pids or 'unknown'})"))
        checks.append(PortState(port=port, listening=True, pids=pids))
    return checks


@dataclass
class Undone:
    """What one cleanup did, step by step, in the order it undoes the stages."""

    jobs: list[JobRow]
    servers: list[ServerRow]
    groups: list[ServerRow]
    ports: list[PortState]
    patches: Reverted
    gpus_held: list[HeldGpu]
    services: Restored
    weights: PolicyApplied | None


def _undo_all(ledger: Ledger, *, ports: Iterable[int], host: str, stop_timeout: float, weights: bool,
              residues: list[Residue]) -> Undone:
    """Undo every outstanding change in reverse order of the stages; what each step did."""
    todo = outstanding(ledger.entries())
    jobs = stop_orphaned_jobs(todo["jobs"], ledger, stop_timeout, residues)
    servers = stop_servers(todo["servers"], ledger, host, stop_timeout, residues)
    groups = [ServerRow.model_validate(g) for g in stop_recorded_groups(todo["groups"], ledger, stop_timeout, residues)]
    port_checks = check_ports({*ports, *(int(e.port) for e in todo["servers"])}, host, residues)
    patched = revert_patches(ledger)
    residues.extend(patched.residues)
    held = recheck_failed(ledger, residues)
    back = restore(ledger.entries(), ledger, held=held)
    residues.extend(back.residues)
    staged = apply_policy(ledger.entries(), ledger) if weights else None
    if staged is not None:
        residues.extend(staged.residues)
    return Undone(jobs, servers, groups, port_checks, patched, held, back, staged)


def weights_outcome(staged: PolicyApplied | None, run: str) -> WeightsOutcome:
    """The cleanup record's ``weights``, always one shape: whether the staged weights' policy
    was applied (and why not), this run's folders, the bytes freed and the residues."""
    if staged is None:
        return WeightsOutcome(applied=False, reason="not applied: the trial did not finish (a rerun needs them)",
                              folders=[], freed_bytes=0, residues=[])
    return WeightsOutcome(applied=True, reason=None, folders=[w for w in staged.folders if w.run == run],
                          freed_bytes=staged.freed_bytes, residues=staged.residues)


def run_cleanup(results_dir: Path, *, ports: Iterable[int] = (), host: str = "127.0.0.1",
                stop_timeout: float = 30.0, weights: bool = False, run: str | None = None,
                release_host: bool = True) -> CleanupRecord:
    """Undo every change the ledger in ``results_dir`` still has open, from this run or an
    earlier one; return the cleanup record. The record keeps what this run changed apart
    from what earlier runs left behind and this run undid, and says the host is restored
    only when nothing is a residue and every service stopped is running and healthy again,
    as read from the host now. With ``weights``, also apply each staged model's policy
    (keep, archive or delete): the trial's own cleanup and an on-demand cleanup do, a
    cleanup after a failed job does not, so that the rerun finds its weights. Once the host is given
    back, the host's lock is released (``release_host``; the restore before a quiet keeps it). Only
    the changes this host made are undone here (:func:`cleanup_with_record` sends the others' away)."""
    ledger = Ledger(TrialPaths(Path(results_dir)).ledger, run=run, only_host=this_host())
    started, n_entries = time.time(), len(ledger.entries())
    ledger.append(Action.CLEANUP_START)
    residues: list[Residue] = []
    did = _undo_all(ledger, ports=ports, host=host, stop_timeout=stop_timeout, weights=weights, residues=residues)
    after = ledger.entries()
    services, left_services = _split(services_table(after), ledger.run, lambda r: r.restored_by_run)
    patches, left_patches = _split(patches_table(after), ledger.run, lambda r: r.reverted_by_run)
    servers, left_servers = _split(_with_done(server_rows(after), did.servers), ledger.run, _undone_by)
    groups, left_groups = _split(_with_done(group_rows(after), did.groups), ledger.run, _undone_by)
    jobs, left_jobs = _split(_with_done(job_rows(after), did.jobs), ledger.run, _undone_by)
    host_check = check_running([r.quiet for r in [*services, *left_services] if r.was_running], after)
    for c in host_check:
        if not c.running_and_healthy and not any(r.what == c.name for r in residues):
            residues.append(Residue(kind="service", what=c.name, tried="read its state after cleanup", seen=c.seen or ""))
    restored = not residues and all(c.running_and_healthy for c in host_check)
    locks = release_host_locks(ledger, release=restored and release_host)
    staged = did.weights
    left_behind = LeftBehind(jobs=left_jobs, servers=left_servers, groups=left_groups, services=left_services,
                             patches=left_patches,
                             weights=[w for w in (staged.folders if staged else []) if w.run != ledger.run])
    record = CleanupRecord(
        run=ledger.run, started=started, finished=time.time(), ledger=str(ledger.path), ledger_entries=n_entries,
        jobs=jobs, servers=servers, groups=[as_written(g) for g in groups], ports=did.ports,
        services_restored=[s for s in did.services.services if s.run == ledger.run], services=services,
        patches_reverted=[p for p in did.patches.items if p.run == ledger.run], patches=patches,
        weights=weights_outcome(staged, ledger.run), left_behind=left_behind, host=HostAfter(services=host_check),
        gpus_held=did.gpus_held,
        residues=residues, restored=restored, host_lock=locks)
    ledger.append(Action.CLEANUP_DONE, restored=record.restored, residues=len(residues))
    return record


def cleanup_with_record(results_dir: Path, record_path: Path | None = None, *, ports: Iterable[int] = (),
                        host: str = "127.0.0.1", stop_timeout: float = 30.0, weights: bool = False,
                        submit: Sequence[str] = (), elsewhere_too: bool = True) -> CleanupRecord:
    """Run cleanup and write its record (default ``<results>/cleanup/on-demand.json``): on each other
    host with a change still open (a SLURM node; llmtrial.lifecycle.on_node, ``submit``: srun's further
    options), then here. When only other hosts had changes, the record is the last one's; a host
    that could not be reached is a residue of the record written here. Without ``weights`` (a cleanup
    that leaves the staged weights to the rerun), a host whose only open change is its weights is not
    reached; when another host already gave everything back (an allocation that cleaned its node
    before it ended), that cleanup's record is the answer and nothing runs here. Without
    ``elsewhere_too`` (the cleanup another host sent here) only this host's changes are undone: sent on
    again, each node's cleanup would send one back to the other while both had changes open, without end."""
    paths = TrialPaths(Path(results_dir))
    path = Path(record_path or paths.cleanup_on_demand)
    entries = Ledger(paths.ledger).entries()
    besides = () if weights else ("weights",)
    nodes = hosts_to_reach(entries, besides) if elsewhere_too else []
    if (elsewhere_too and not nodes and _given_back_elsewhere(entries, besides)
            and (done := last_cleanup(paths.root)) is not None):
        return done
    elsewhere, unreached = None, []
    for node in nodes:
        there = cleanup_there(node, Path(results_dir), path, ports=ports, host=host, stop_timeout=stop_timeout,
                              weights=weights, submit=submit)
        if isinstance(there, CleanupRecord):
            elsewhere = there
        else:
            unreached.append(there)
    here = Ledger(paths.ledger, only_host=this_host()).entries()
    if elsewhere is not None and not unreached and not replay(here).any_open():
        return elsewhere
    record = run_cleanup(results_dir, ports=ports, host=host, stop_timeout=stop_timeout, weights=weights)
    if unreached:
        record = record.model_copy(update={"residues": [*record.residues, *unreached], "restored": False})
    write_record(path, record, schema="cleanup")
    return record


def _given_back_elsewhere(entries: list[Entry], besides: Iterable[str]) -> bool:
    """True when the ledger's last cleanup ran on another host and nothing (of the kinds not in
    ``besides``) is open anywhere: that host gave the trial's changes back itself."""
    done = [e for e in entries if e.action == Action.CLEANUP_DONE]
    return bool(done) and done[-1].machine != this_host() and not replay(entries).any_open(besides=besides)


def changes_open(entries: list[Entry]) -> bool:
    """True when a cleanup is due: a change to the host is open (:func:`unfinished`) or the host's
    lock is still taken (a partial run gives it back too)."""
    return unfinished(entries) or bool(replay(entries).open("locks"))


def give_back_before_allocation_ends(results_dir: Path, *, ports: Iterable[int] = (), host: str = "127.0.0.1",
                                     submit: Sequence[str] = ()) -> CleanupRecord | None:
    """Under SLURM, in the allocation's batch script as its snakemake exits (the host group done, failed
    or stopped early): undo what the trial still has open on this node while the allocation holds it
    (record ``cleanup/at-allocation-end.json``). Sent from the submitting side after the allocation
    ended, the cleanup would be a job of its own that queues for the node, behind the next trial's
    allocation, which waits for the host lock only this cleanup releases. Not when the job is no longer
    RUNNING (scancel, its time limit: SLURM is killing it; the cleanup is then `snakemake cleanup`'s).
    None when it did not run."""
    if not in_batch_step():
        return None
    paths = TrialPaths(Path(results_dir))
    if not paths.ledger.exists() or not changes_open(Ledger(paths.ledger, only_host=this_host()).entries()):
        return None
    job = os.environ[JOB_ENV]
    state = job_state(job)
    if state not in (None, "RUNNING"):
        tell(f"llmtrial cleanup: SLURM job {job} is {state}: the trial's changes on {this_host()} are left to "
             f"`snakemake cleanup`")
        return None
    tell(f"llmtrial cleanup: the allocation (SLURM job {job}) ends with the trial's changes open on {this_host()}: "
         f"giving them back there before it ends")
    return cleanup_with_record(paths.root, paths.cleanup_at_allocation_end, ports=ports, host=host, submit=submit)


def restore_after_run(results_dir: Path, *, ports: Iterable[int] = (), host: str = "127.0.0.1",
                      submit: Sequence[str] = ()) -> CleanupRecord | None:
    """After a successful workflow run: give back what a partial run left changed (recorded
    as ``cleanup/on-success.json``), and raise HostNotRestored when the last cleanup could
    not restore the host, so the run's exit status says so. Returns the new record, if any."""
    results = Path(results_dir)
    entries = Ledger(TrialPaths(results).ledger).entries()
    record = None
    if changes_open(entries):
        record = cleanup_with_record(results, TrialPaths(results).cleanup_on_success, ports=ports, host=host,
                                     submit=submit)
        entries = Ledger(TrialPaths(results).ledger).entries()
    done = [e for e in entries if e.action == Action.CLEANUP_DONE]
    if done and done[-1].restored is False:
        raise HostNotRestored(f"the host was not fully restored ({done[-1].residues} residue(s)); see "
                              f"{results / 'cleanup'} and the report, fix them, then run `snakemake cleanup`")
    return record


def last_cleanup(results_dir: Path) -> CleanupRecord | None:
    """The trial's latest cleanup record (its own, after an error, after a partial run, or on demand), or None."""
    paths = TrialPaths(Path(results_dir))
    records = [load_record(p, "cleanup") for p in (paths.cleanup, paths.cleanup_on_error, paths.cleanup_on_success,
                                                   paths.cleanup_on_demand, paths.cleanup_at_allocation_end)
               if p.exists()]
    return max(records, key=lambda r: r.finished, default=None)


def host_lines(results_dir: Path, record: CleanupRecord | None = None) -> list[str]:
    """What a run's last lines say of the host: ``host restored: yes`` with the services read
    healthy, or ``no`` with each residue of the last cleanup (``record``, else the latest on file),
    or ``no`` with the ledger's changes still open."""
    paths = TrialPaths(Path(results_dir))
    record = record or last_cleanup(paths.root)
    still_open = paths.ledger.exists() and unfinished(Ledger(paths.ledger).entries())
    if record is not None and not record.restored:
        return [f"host restored: NO, {len(record.residues)} residue(s); fix them, then run `snakemake cleanup`",
                *(f"  {r.kind} {r.what}{f' on {r.node}' if r.node else ''}: {r.seen} (tried: {r.tried})"
                  for r in record.residues)]
    if still_open:
        return [f"host restored: NO, changes still open in {paths.ledger}; run `snakemake cleanup`"]
    if record is None:
        return ["host restored: yes (nothing of this trial is left changed on the host)"]
    healthy = ", ".join(f"{c.name} running and healthy" for c in (record.host.services if record.host else []))
    return [f"host restored: yes ({healthy})" if healthy else "host restored: yes"]
