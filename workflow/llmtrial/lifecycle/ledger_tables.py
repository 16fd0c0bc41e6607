"""What the trial's ledger says was changed and given back, one row per change: each quieted
service, each patched file or plugin folder, each server, group and job. The cleanup record
carries these tables (:func:`llmtrial.lifecycle.cleanup.run_cleanup`); they are read from the ledger
alone, so any run's cleanup tells every run's changes apart.
"""

from __future__ import annotations

from typing import Any

from llmtrial.core.ledger import CHANGES, Action, Entry, replay
from llmtrial.patch.patching import patch_key

__all__ = ["services_table", "patches_table", "undo_rows"]


def services_table(entries: list[Entry]) -> list[dict[str, Any]]:
    """Per quiet of a service (any run): state before, stopped at, restarted at, health, the
    run that quieted it and the run that restarted it, from the ledger."""
    rows: dict[str, dict[str, Any]] = {}
    undone = replay(entries).undone
    for e in entries:
        action = e.action
        if action == Action.SERVICE_QUIET:
            name = e.service["name"]
            rows[e.id] = {"name": name, "kind": e.service["kind"], "run": e.run, "quiet": e.id,
                          "was_running": e.was_running, "state_seen": e.state_seen,
                          "stopped_at": e.t if e.was_running else None, "down": None,
                          "restarted_at": None, "healthy": None, "restored_by_run": None}
            back = undone.get(e.id)
            if back is not None:
                rows[e.id].update(restarted_at=back.t, healthy=True, healthy_after_s=back.healthy_after_s,
                                  restored_by_run=back.run)
        elif action == Action.SERVICE_STOPPED:
            quiet_id = e.quiet or next((i for i in reversed(rows) if rows[i]["name"] == e.name), None)
            if quiet_id in rows:
                rows[quiet_id]["down"] = e.down
    return list(rows.values())


def patches_table(entries: list[Entry]) -> list[dict[str, Any]]:
    """Each file or plugin folder a patch changed (any run), from the ledger, with its node (a
    plugin folder carried to another node is a row of that node, ``copy_of`` the folder
    here): hashes, applied (for a copy: verified on its node) and reverted times, whether the
    file matched RECORD after the revert, the run that changed it and the run that reverted
    it. A revert is matched to the change it names."""
    rows: dict[str, dict[str, Any]] = {}
    undone = replay(entries).undone
    for e in entries:
        action = e.action
        if action in (Action.PATCH_FILE, Action.PATCH_PLUGIN, Action.PATCH_PLUGIN_COPY):
            row = {"patches": e.patches, "mode": "file" if action == Action.PATCH_FILE else "plugin",
                   "target": patch_key(e), "node": e.node, "run": e.run, "change": e.id, "applied_at": None,
                   "reverted_at": None, "reverted_by_run": None, "revert_outcome": None, "matches_record": None}
            if action == Action.PATCH_FILE:
                row.update(e.model_dump(include={"path", "backup", "record_hash", "before_hash", "after_hash"}))
            elif action == Action.PATCH_PLUGIN:
                row["entry_points"] = e.entry_points
            else:
                row["copy_of"] = e.source
            back = undone.get(e.id)
            if back is not None:
                row.update(reverted_at=back.t, reverted_by_run=back.run, revert_outcome=back.outcome,
                           matches_record=True if back.action == Action.PATCH_REVERTED else None)
            rows[e.id] = row
        elif action == Action.PATCH_PLUGIN_COPIED and e.copy_id in rows:
            rows[e.copy_id]["applied_at"] = e.t
        elif action == Action.PATCH_APPLIED:
            for row in rows.values():
                if row["applied_at"] is None and row["run"] == e.run and "copy_of" not in row and (
                        row["target"] == e.dir or row.get("path") in (e.files or [])):
                    row["applied_at"] = e.t
        elif action == Action.PATCH_REVERT_FAILED:
            for row in rows.values():
                if row["target"] == e.file and row["node"] == e.node and row["reverted_at"] is None:
                    row.update(revert_outcome=e.outcome, matches_record=False)
    return list(rows.values())


def undo_rows(entries: list[Entry], kind: str, fields: tuple[str, ...],
               only: Action | None = None) -> list[dict[str, Any]]:
    """One row per change of ``kind`` (any run; with ``only``, of that action): its
    ``fields``, its run, and the run and outcome of the entry that undid it (None while
    outstanding)."""
    undone = replay(entries).undone
    rows = []
    for e in entries:
        if CHANGES[kind].is_change(e) and (only is None or e.action == only):
            back = undone.get(e.id)
            rows.append({**{f: getattr(e, f) for f in fields}, "run": e.run, "change": e.id, "alive_pids": [],
                         "undone_by_run": back.run if back else None,
                         "action": (back.outcome or f"none (ended by its own {back.action})") if back else
                         "not undone"})
    return rows
