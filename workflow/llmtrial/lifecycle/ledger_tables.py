"""What the trial's ledger says was changed and given back, one row per change: each quieted
service, each patched file or plugin folder, each server, group and job. The cleanup record
carries these tables (:func:`llmtrial.lifecycle.cleanup.run_cleanup`); they are read from the ledger
alone, so any run's cleanup tells every run's changes apart.
"""

from __future__ import annotations

from llmtrial.core.cleanup_model import JobRow, PatchRow, ServerRow, ServiceRow
from llmtrial.core.ledger import CHANGES, Action, Entry, replay
from llmtrial.patch.patching import patch_key

__all__ = ["services_table", "patches_table", "job_rows", "server_rows", "group_rows"]


def services_table(entries: list[Entry]) -> list[ServiceRow]:
    """Per quiet of a service (any run): state before, stopped at, restarted at, health, the
    run that quieted it and the run that restarted it, from the ledger."""
    rows: dict[str, ServiceRow] = {}
    undone = replay(entries).undone
    for e in entries:
        action = e.action
        if action == Action.SERVICE_QUIET:
            rows[e.id] = row = ServiceRow(name=e.service["name"], kind=e.service["kind"], run=e.run, quiet=e.id,
                                          was_running=e.was_running, state_seen=e.state_seen,
                                          stopped_at=e.t if e.was_running else None, down=None,
                                          restarted_at=None, healthy=None, restored_by_run=None)
            back = undone.get(e.id)
            if back is not None:
                row.restarted_at, row.healthy, row.healthy_after_s = back.t, True, back.healthy_after_s
                row.restored_by_run = back.run
        elif action == Action.SERVICE_STOPPED:
            quiet_id = e.quiet or next((i for i in reversed(rows) if rows[i].name == e.name), None)
            if quiet_id in rows:
                rows[quiet_id].down = e.down
    return list(rows.values())


def _patch_row(e: Entry) -> PatchRow:
    """The row of one file or plugin folder a patch changed, as its change entry says."""
    row = PatchRow(patches=e.patches, mode="file" if e.action == Action.PATCH_FILE else "plugin", target=patch_key(e),
                   node=e.node, run=e.run, change=e.id, applied_at=None, reverted_at=None, reverted_by_run=None,
                   revert_outcome=None, matches_record=None)
    if e.action == Action.PATCH_FILE:
        row.path, row.backup, row.record_hash, row.before_hash, row.after_hash = (
            e.path, e.backup, e.record_hash, e.before_hash, e.after_hash)
    elif e.action == Action.PATCH_PLUGIN:
        row.entry_points = e.entry_points
    else:
        row.copy_of = e.source
    return row


def patches_table(entries: list[Entry]) -> list[PatchRow]:
    """Each file or plugin folder a patch changed (any run), from the ledger, with its node (a
    plugin folder carried to another node is a row of that node, ``copy_of`` the folder
    here): hashes, applied (for a copy: verified on its node) and reverted times, whether the
    file matched RECORD after the revert, the run that changed it and the run that reverted
    it. A revert is matched to the change it names."""
    rows: dict[str, PatchRow] = {}
    undone = replay(entries).undone
    for e in entries:
        action = e.action
        if action in (Action.PATCH_FILE, Action.PATCH_PLUGIN, Action.PATCH_PLUGIN_COPY):
            rows[e.id] = row = _patch_row(e)
            back = undone.get(e.id)
            if back is not None:
                row.reverted_at, row.reverted_by_run, row.revert_outcome = back.t, back.run, back.outcome
                row.matches_record = True if back.action == Action.PATCH_REVERTED else None
        elif action == Action.PATCH_PLUGIN_COPIED and e.copy_id in rows:
            rows[e.copy_id].applied_at = e.t
        elif action == Action.PATCH_APPLIED:
            for row in rows.values():
                if row.applied_at is None and row.run == e.run and "copy_of" not in row.model_fields_set and (
                        row.target == e.dir or row.path in (e.files or [])):
                    row.applied_at = e.t
        elif action == Action.PATCH_REVERT_FAILED:
            for row in rows.values():
                if row.target == e.file and row.node == e.node and row.reverted_at is None:
                    row.revert_outcome, row.matches_record = e.outcome, False
    return list(rows.values())


def _changes(entries: list[Entry], kind: str, only: Action | None = None) -> list[tuple[Entry, Entry | None]]:
    """Each change of ``kind`` (any run; with ``only``, of that action) and the entry that undid it (None while
    outstanding)."""
    undone = replay(entries).undone
    return [(e, undone.get(e.id)) for e in entries if CHANGES[kind].is_change(e) and (only is None or e.action == only)]


def _outcome(back: Entry | None) -> str:
    """What undid a change, as a row says it."""
    return (back.outcome or f"none (ended by its own {back.action})") if back else "not undone"


def job_rows(entries: list[Entry]) -> list[JobRow]:
    """One row per configuration job (any run): its label and pid, its run, and the run and outcome of
    the entry that ended it."""
    return [JobRow(label=e.label, pid=e.pid, run=e.run, change=e.id, alive_pids=[],
                   undone_by_run=back.run if back else None, action=_outcome(back))
            for e, back in _changes(entries, "jobs")]


def server_rows(entries: list[Entry]) -> list[ServerRow]:
    """One row per server started (any run): its label, process group and port, its run, and the run and
    outcome of the entry that stopped it."""
    return [ServerRow(label=e.label, pgid=e.pgid, port=e.port, run=e.run, change=e.id, alive_pids=[],
                      undone_by_run=back.run if back else None, action=_outcome(back))
            for e, back in _changes(entries, "servers", Action.SERVER_STARTED)]


def group_rows(entries: list[Entry]) -> list[ServerRow]:
    """One row per process group launched on a node (any run): its label and node, its run, and the run
    and outcome of the entry that stopped it."""
    return [ServerRow(label=e.label, node=e.node, run=e.run, change=e.id, alive_pids=[],
                      undone_by_run=back.run if back else None, action=_outcome(back))
            for e, back in _changes(entries, "servers", Action.GROUP_LAUNCH)]
