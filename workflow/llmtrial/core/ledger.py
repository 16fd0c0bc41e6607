"""The trial ledger: an append-only record of every change a trial makes to the host.

Each entry is written (flushed and fsynced) *before* the change it describes, with what
is needed to undo it, so cleanup can restore the host from the ledger alone after a
crash or ``kill -9``. One JSON object per line; a line torn by a crash is skipped.

Every entry carries ``run`` (the workflow invocation that wrote it: the workflow sets
``LLMTRIAL_RUN`` once per snakemake invocation, and its jobs inherit it) and its own
``id``. An entry that undoes a change names it: ``undoes`` holds the change's id (or a
list of ids), so undo is matched change by change, never by name across runs. Entries
of a ledger written before runs had ids read as one earlier run (``run`` ``earlier``);
their undo entries name no id and are matched by a key of the change (its service, file,
folder or process group) instead.

Every entry also names the ``node`` (host) it changed; this process's entries name the node
the workflow runs on (``LLMTRIAL_NODE``: the trial's own name for this host when it lists
nodes, else :data:`LOCAL_NODE`) unless told otherwise, and entries of a ledger written
before nodes read as :data:`LOCAL_NODE`. A change on a node that cleanup must reach (a process group
started there: ``group_launch``; weights staged there; a plugin folder copied there:
``patch_plugin_copy``) also carries ``reach``, the node as
:meth:`llmtrial.host.nodes.Node.describe` gives it, so cleanup can rebuild the node from the
ledger alone.

Every entry names, beside, the ``machine``: the host whose process wrote it
(:func:`llmtrial.core.hostlock.this_host`: inside a SLURM job, the node's SLURM name). On a cluster
the jobs that change a host run on the node an allocation gave, while ``snakemake cleanup`` runs
on the login node: cleanup undoes what was done on its own machine (:class:`Ledger` with
``only_host``) and sends the rest to the host that did it (llmtrial.lifecycle.on_node). Entries
written before hosts were named read as this machine's.

The vocabulary is here and only here: :class:`Action` lists every entry kind, :data:`ACTIONS`
declares each kind's payload (its required fields) and :data:`CHANGES` each kind of change
to the host with the actions that make it and the actions that undo it. :func:`replay`
reads a ledger once and returns every change still outstanding, by kind, and what undid
the others: every stage that undoes something asks it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmtrial.core.hostlock import Holder, acquire, holder_for, lock_settings, this_host
from llmtrial.core.record_base import error_lines
from llmtrial.core.trial_config import HealthCheckBlock

log = logging.getLogger(__name__)

#: The environment variable that names the current run; the workflow sets it once per invocation.
RUN_ENV = "LLMTRIAL_RUN"
#: The environment variable naming the node this process runs on (set by the workflow).
NODE_ENV = "LLMTRIAL_NODE"
#: The run of entries written before runs had ids.
EARLIER_RUN = "earlier"
#: The node (host) of entries this process writes unless told otherwise, and of entries written before nodes.
LOCAL_NODE = "local"


class Action(StrEnum):
    """Every kind of ledger entry. A change is written before it is made; an undo names the
    change it undoes (``undoes``); the rest are marks that say when a stage began or ended."""

    JOB_STARTED = "job_started"                      # change: a configuration job runs (cleanup stops it)
    JOB_FINISHED = "job_finished"                    # undo of job_started: the job ended by itself
    JOB_STOPPED = "job_stopped"                      # undo of job_started: cleanup stopped a job that outlived its run
    SERVER_LAUNCH = "server_launch"                  # mark: a server is about to start
    SERVER_STARTED = "server_started"                # change: a vLLM server runs in its own process group
    SERVER_STOPPED = "server_stopped"                # undo of server_started
    GROUP_LAUNCH = "group_launch"                    # change: a serving process group is about to start on a node
    GROUP_STARTED = "group_started"                  # mark: the group of a group_launch runs (pid, pgid, start time)
    GROUP_STOPPED = "group_stopped"                  # undo of group_launch: stopped or found gone, on its node
    SERVICE_QUIET = "service_quiet"                  # change (when was_running): a service is about to be stopped
    SERVICE_STOPPED = "service_stopped"              # mark: the stop of a service_quiet, and whether it went down
    SERVICE_RESTORED = "service_restored"            # undo of service_quiet: running and healthy again
    PATCH_FILE = "patch_file"                        # change: a vLLM file is about to be patched (backup kept)
    PATCH_PLUGIN = "patch_plugin"                    # change: a plugin folder is about to be written
    PATCH_APPLIED = "patch_applied"                  # mark: the patches are in place
    PATCH_REVERTED = "patch_reverted"                # undo of patch_file: restored, matches RECORD
    PATCH_REVERT_FAILED = "patch_revert_failed"      # mark: a revert left the file not matching RECORD (a residue)
    PATCH_PLUGIN_REMOVED = "patch_plugin_removed"    # undo of patch_plugin
    PATCH_PLUGIN_COPY = "patch_plugin_copy"          # change: a plugin folder is about to be copied to a node
    PATCH_PLUGIN_COPIED = "patch_plugin_copied"      # mark: the copy of a patch_plugin_copy verified on its node
    PATCH_PLUGIN_COPY_REMOVED = "patch_plugin_copy_removed"  # undo of patch_plugin_copy, on its node
    WEIGHTS_STAGED = "weights_staged"                # change: weights staged, their policy (keep/archive/delete) pending
    WEIGHTS_ARCHIVE_START = "weights_archive_start"  # mark: an archive copy is about to be made
    WEIGHTS_ARCHIVED = "weights_archived"            # mark: the archive copy is complete
    WEIGHTS_DELETE_START = "weights_delete_start"    # mark: a staged folder is about to be deleted
    WEIGHTS_DONE = "weights_done"                    # undo of weights_staged: the policy was applied
    WEIGHTS_POLICY_FAILED = "weights_policy_failed"  # mark: the policy left residues (stays outstanding)
    GPU_FAILED = "gpu_failed"                        # change: a GPU failed its health check; services on it are held
    GPU_CLEARED = "gpu_cleared"                      # undo of gpu_failed: a later health check passed
    HOST_LOCKED = "host_locked"                      # change: the host's lock is taken (llmtrial.core.hostlock)
    HOST_UNLOCKED = "host_unlocked"                  # undo of host_locked: a cleanup that gave the host back released it
    CLEANUP_START = "cleanup_start"                  # mark: a cleanup began
    CLEANUP_DONE = "cleanup_done"                    # mark: a cleanup ended, restored or not


@dataclass(frozen=True)
class ActionSpec:
    """The payload of one entry kind: the fields it must carry beyond t, action, run, id and
    node, and the kind of change it makes or undoes (None for a mark)."""

    required: tuple[str, ...] = ()
    change: str | None = None
    undo: bool = False


#: The payload of every entry kind (the typed shape of each ledger line).
ACTIONS: dict[Action, ActionSpec] = {
    Action.JOB_STARTED: ActionSpec(("label", "pid", "create_time"), "jobs"),
    Action.JOB_FINISHED: ActionSpec(("label", "pid", "undoes"), "jobs", undo=True),
    Action.JOB_STOPPED: ActionSpec(("label", "pid", "undoes", "outcome"), "jobs", undo=True),
    Action.SERVER_LAUNCH: ActionSpec(("label", "host", "port", "argv", "env_keys")),
    Action.SERVER_STARTED: ActionSpec(("label", "pid", "pgid", "host", "port", "launched_at"), "servers"),
    Action.SERVER_STOPPED: ActionSpec(("label", "pgid", "port"), "servers", undo=True),
    Action.GROUP_LAUNCH: ActionSpec(("label", "reach", "argv", "env_keys", "log_path", "token"), "servers"),
    Action.GROUP_STARTED: ActionSpec(("label", "launch", "pid", "pgid", "create_time")),
    Action.GROUP_STOPPED: ActionSpec(("label", "undoes", "outcome"), "servers", undo=True),
    Action.SERVICE_QUIET: ActionSpec(("service", "was_running", "state_seen"), "services"),
    Action.SERVICE_STOPPED: ActionSpec(("name", "down", "quiet")),
    Action.SERVICE_RESTORED: ActionSpec(("name", "undoes", "healthy_after_s"), "services", undo=True),
    Action.PATCH_FILE: ActionSpec(("patches", "dist", "version", "path", "file", "backup", "record_hash",
                                   "before_hash", "after_hash"), "patches"),
    Action.PATCH_PLUGIN: ActionSpec(("patches", "dir", "entry_points"), "patches"),
    Action.PATCH_APPLIED: ActionSpec(("mode", "patches")),
    Action.PATCH_REVERTED: ActionSpec(("patches", "path", "file", "undoes", "outcome"), "patches", undo=True),
    Action.PATCH_REVERT_FAILED: ActionSpec(("patches", "path", "file", "outcome")),
    Action.PATCH_PLUGIN_REMOVED: ActionSpec(("patches", "dir", "undoes", "outcome"), "patches", undo=True),
    Action.PATCH_PLUGIN_COPY: ActionSpec(("patches", "reach", "dir", "source"), "patches"),
    Action.PATCH_PLUGIN_COPIED: ActionSpec(("copy", "dir", "files")),
    Action.PATCH_PLUGIN_COPY_REMOVED: ActionSpec(("patches", "dir", "undoes", "outcome"), "patches", undo=True),
    Action.WEIGHTS_STAGED: ActionSpec(("path", "root", "after"), "weights"),
    Action.WEIGHTS_ARCHIVE_START: ActionSpec(("path", "archive")),
    Action.WEIGHTS_ARCHIVED: ActionSpec(("path", "archive", "bytes")),
    Action.WEIGHTS_DELETE_START: ActionSpec(("path",)),
    Action.WEIGHTS_DONE: ActionSpec(("path", "policy", "undoes", "outcome"), "weights", undo=True),
    Action.WEIGHTS_POLICY_FAILED: ActionSpec(("path", "policy", "outcome")),
    Action.GPU_FAILED: ActionSpec(("gpu", "uuid", "label", "evidence", "kernel_lines"), "gpus"),
    Action.GPU_CLEARED: ActionSpec(("gpu", "uuid", "undoes", "evidence"), "gpus", undo=True),
    Action.HOST_LOCKED: ActionSpec(("path", "holder"), "locks"),
    Action.HOST_UNLOCKED: ActionSpec(("path", "undoes", "outcome"), "locks", undo=True),
    Action.CLEANUP_START: ActionSpec(),
    Action.CLEANUP_DONE: ActionSpec(("restored", "residues")),
}


class LedgerError(ValueError):
    """A ledger line that is JSON but not an entry this version reads (named by file and line)."""


class Entry(BaseModel):
    """One ledger line: when, which action, which run and node wrote it, its id; then the payload
    of its action (:data:`ACTIONS` says which fields each action must carry). Every field a line
    may hold is declared here, typed; an entry with an undeclared field is refused when written."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    t: float
    action: str
    run: str = EARLIER_RUN
    id: str
    node: str = LOCAL_NODE
    machine: str | None = None
    # any change or undo
    label: str | None = None
    undoes: str | list[str] | None = None
    outcome: str | None = None
    reach: dict[str, Any] | None = Field(None, description="The node as Node.describe() gives it, to rebuild it.")
    # jobs, servers, process groups
    pid: int | None = None
    pgid: int | None = None
    create_time: float | None = None
    host: str | None = None
    port: int | None = None
    argv: list[str] | None = None
    env_keys: list[str] | None = None
    launched_at: float | None = None
    scratch: str | None = Field(None, description="server_launch, server_started, group_launch: the server's or the "
                                                  "group's temporary folder, on its node, for vLLM's IPC sockets and "
                                                  "store file (llmtrial.host.scratch), removed with it.")
    log_path: str | None = None
    token: str | None = None
    launch: str | None = Field(None, description="group_started: the id of its group_launch.")
    signals: list[str] | None = None
    stop_seconds: float | None = None
    survivors: list[int] | None = None
    port_closed: bool | None = None
    returncode: int | None = None
    # services
    service: dict[str, Any] | None = Field(None, description="service_quiet: the service as Service.to_json() gives it.")
    was_running: bool | None = None
    state_seen: str | None = None
    name: str | None = None
    down: bool | None = None
    quiet: str | None = Field(None, description="service_stopped: the id of its service_quiet.")
    healthy_after_s: float | None = None
    # patches
    patches: list[str] | None = None
    dist: str | None = None
    version: str | None = None
    path: str | None = None
    file: str | None = None
    backup: str | None = None
    record_hash: str | None = None
    before_hash: str | None = None
    after_hash: str | None = None
    hash: str | None = None
    matches_record: bool | None = None
    hunks: list[Any] | None = None
    dir: str | None = None
    entry_points: dict[str, Any] | None = None
    for_node: str | None = Field(None, description="patch_plugin, patch_applied: the node a plugin folder was written "
                                 "for alone (a patch in mode file here, plugin there); not live here.")
    mode: str | None = None
    files: list[str] | dict[str, str] | None = None
    source: str | None = None
    copy_id: str | None = Field(None, alias="copy", description="patch_plugin_copied: the id of its patch_plugin_copy.")
    # weights
    root: str | None = None
    after: str | None = None
    archive_dir: str | None = None
    kind: str | None = None
    copied_from: str | None = None
    repo_id: str | None = None
    commit: str | None = None
    disk: dict[str, Any] | None = None
    archive: str | None = None
    bytes: int | None = None
    policy: str | None = None
    freed_bytes: int | None = None
    # GPUs
    gpu: int | str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    evidence: str | None = None
    kernel_lines: list[str] | None = None
    health: HealthCheckBlock | None = Field(None, description="gpu_failed: the health check the GPU failed.")
    # the host's lock, cleanup
    holder: Holder | None = Field(None, description="host_locked: who takes the host's lock (the lock file's content).")
    earlier: Holder | None = Field(None, description="host_locked: the holder it took the lock over from, if any.")
    restored: bool | None = None
    residues: int | None = None

    def undone_ids(self) -> list[str]:
        """The ids this undo entry names (none for an entry of an old-format ledger)."""
        if self.undoes is None:
            return []
        return [self.undoes] if isinstance(self.undoes, str) else list(self.undoes)

    def written(self) -> dict[str, Any]:
        """The entry as its ledger line holds it: the fields it was given."""
        return self.model_dump(mode="json", exclude_unset=True)


#: Every key a ledger line may hold (a field's name, or its alias).
ENTRY_KEYS = frozenset(f.alias or name for name, f in Entry.model_fields.items())


def _service_name(e: Entry) -> Any:
    return e.service["name"] if e.service is not None else e.name or ""


@dataclass(frozen=True)
class Change:
    """One kind of change to the host: the actions that make it (``when`` it holds), the
    actions that undo it, and the key an old-format undo entry (no ids) is matched by."""

    kind: str
    makes: tuple[Action, ...]
    undone_by: tuple[Action, ...]
    key: Callable[[Entry], Any]
    when: Callable[[Entry], bool] = field(default=lambda e: True)

    def is_change(self, e: Entry) -> bool:
        return e.action in self.makes and self.when(e)

    def is_undo(self, e: Entry) -> bool:
        return e.action in self.undone_by


#: Every kind of change a trial makes to a host, in the order cleanup undoes them (``locks``, the host's
#: lock, last: it is released once the rest is given back). ``gpus`` are
#: GPUs held as failed (a health check after a failure): not a change the trial made, but a hold
#: on the host that stays until a later check clears it. ``servers``
#: are serving process groups: a vLLM server started here (``server_started``) and a group
#: started on any node, this one or another host (``group_launch``: a headless rank, a worker).
CHANGES: dict[str, Change] = {c.kind: c for c in (
    Change("jobs", (Action.JOB_STARTED,), (Action.JOB_FINISHED, Action.JOB_STOPPED), lambda e: e.pid),
    Change("servers", (Action.SERVER_STARTED, Action.GROUP_LAUNCH), (Action.SERVER_STOPPED, Action.GROUP_STOPPED),
           lambda e: e.pgid),
    Change("patches", (Action.PATCH_FILE, Action.PATCH_PLUGIN, Action.PATCH_PLUGIN_COPY),
           (Action.PATCH_REVERTED, Action.PATCH_PLUGIN_REMOVED, Action.PATCH_PLUGIN_COPY_REMOVED),
           lambda e: e.file or e.dir),
    Change("services", (Action.SERVICE_QUIET,), (Action.SERVICE_RESTORED,), _service_name,
           lambda e: bool(e.was_running)),
    Change("weights", (Action.WEIGHTS_STAGED,), (Action.WEIGHTS_DONE,), lambda e: e.path),
    Change("gpus", (Action.GPU_FAILED,), (Action.GPU_CLEARED,), lambda e: e.uuid or e.gpu),
    Change("locks", (Action.HOST_LOCKED,), (Action.HOST_UNLOCKED,), lambda e: e.path),
)}


def missing_fields(line: Mapping[str, Any]) -> list[str]:
    """The fields a ledger line of a known action lacks (its declared payload); [] for a complete
    line or an action outside the vocabulary."""
    try:
        spec = ACTIONS[Action(line.get("action"))]
    except ValueError:
        return []
    return [f for f in ("t", "action", "run", "id", "node", *spec.required) if f not in line]


def new_run_id() -> str:
    """A run id: the local start time and a random suffix (sortable, unique enough)."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


_PROCESS_RUN = new_run_id()


def current_run() -> str:
    """The run this process belongs to: ``LLMTRIAL_RUN`` when set (a workflow invocation and
    its jobs), else one id for this process (the command line's own cleanup, a test)."""
    return os.environ.get(RUN_ENV) or _PROCESS_RUN


def current_node() -> str:
    """The name of the node this process runs on: ``LLMTRIAL_NODE``, else :data:`LOCAL_NODE`."""
    return os.environ.get(NODE_ENV) or LOCAL_NODE


class Ledger:
    """Append-only JSON-lines file at ``path``; entries written here carry ``run`` and ``machine``. With
    ``only_host``, :meth:`entries` reads only the entries that host wrote (the cleanup of one host)."""

    def __init__(self, path: str | os.PathLike[str], run: str | None = None, node: str | None = None,
                 only_host: str | None = None) -> None:
        self.path = Path(path)
        self.run = run or current_run()
        self.node = node or current_node()
        self.only_host = only_host

    def append(self, action: str, **data: Any) -> Entry:
        """Write one entry (``node`` defaults to this ledger's) and return it. An entry of a change
        takes the host's lock first when the workflow gave one (:meth:`hold_host`)."""
        spec = ACTIONS.get(action)  # Action is a StrEnum: its plain string finds it too
        if spec is not None and spec.change not in (None, "locks") and not spec.undo:
            self.hold_host()
        return self._write(action, **data)

    def hold_host(self) -> None:
        """Take the host's lock for this ledger's trial and run (:mod:`llmtrial.core.hostlock`), waiting
        as long as the workflow allows; the ``host_locked`` entry is written just before the lock. No
        lock outside a workflow run (no ``LLMTRIAL_HOST_LOCK``)."""
        settings = lock_settings()
        if settings is None:
            return
        path, wait_s = settings
        node = current_node()
        me = holder_for(self.path.parent.resolve(), self.run, node)
        acquire(path, me, wait_s=wait_s, before=lambda earlier: self._write(
            Action.HOST_LOCKED, path=str(path), holder=me, earlier=earlier, node=node))

    def _write(self, action: str, **data: Any) -> Entry:
        entry = Entry.model_validate({"t": time.time(), "action": str(action), "run": self.run, "id": secrets.token_hex(8),
                                      "node": self.node, "machine": this_host(), **data})
        line = (json.dumps(entry.written()) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write with O_APPEND: concurrent jobs do not interleave
            os.fsync(fd)
        finally:
            os.close(fd)
        return entry

    def entries(self) -> list[Entry]:
        """Every entry, in order (with ``only_host``: that host's). A line torn by a crash mid-write
        is skipped; a line that is not an entry raises :class:`LedgerError` naming it."""
        if not self.path.exists():
            return []
        out, here = [], this_host()
        for i, raw in enumerate(self.path.read_text(encoding="utf-8").splitlines()):
            try:
                data = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line torn by a crash mid-write
            entry = self._entry(data, i + 1, here)
            if self.only_host is None or entry.machine == self.only_host:
                out.append(entry)
        return out

    def _entry(self, data: Any, line: int, here: str) -> Entry:
        """One line's entry; a field a later version wrote is left out (and said), never fatal."""
        if not isinstance(data, dict):
            raise LedgerError(f"{self.path} line {line}: not a ledger entry (a JSON object): {str(data)[:80]}")
        unknown = sorted(set(data) - ENTRY_KEYS)
        if unknown:
            log.warning("%s line %d: fields this version does not know, left out: %s", self.path, line, ", ".join(unknown))
        known = {k: v for k, v in data.items() if k in ENTRY_KEYS}
        try:
            entry = Entry.model_validate({**known, "id": known.get("id") or f"line-{line}",
                                          "machine": known.get("machine") or here})
        except ValidationError as exc:
            raise LedgerError(f"{self.path} line {line}: not a ledger entry: {'; '.join(error_lines(exc))}") from exc
        return entry


def match_undos(entries: Iterable[Entry], is_change: Callable[[Entry], bool], is_undo: Callable[[Entry], bool],
                key: Callable[[Entry], Any]) -> tuple[dict[str, Entry], dict[str, Entry]]:
    """Pair each change with the entry that undid it, in ledger order.

    Returns ``(outstanding, undone)``: the changes no entry has undone (by id, in order) and,
    per undone change's id, the entry that undid it. An undo entry of an old-format ledger
    (no run, no ids) undoes every outstanding change with the same ``key``; any other entry
    undoes only the ids it names; the key is matched on the same node only."""
    outstanding: dict[str, Entry] = {}
    undone: dict[str, Entry] = {}
    for e in entries:
        if is_change(e):
            outstanding[e.id] = e
        elif is_undo(e):
            legacy = e.undoes is None and e.run == EARLIER_RUN
            ids = [i for i, c in outstanding.items() if key(c) == key(e) and c.node == e.node] if legacy else e.undone_ids()
            for i in ids:
                if i in outstanding:
                    outstanding.pop(i)
                    undone[i] = e
    return outstanding, undone


@dataclass
class OpenChange:
    """An outstanding change of one target (a file, a folder) and the ids of every change of it that an
    undo of it names (a target changed more than once and not undone since)."""

    entry: Entry
    undo_ids: list[str] = field(default_factory=list)


def by_target(changes: dict[str, Entry], key: Callable[[Entry], Any], *, latest: bool = False) -> dict[Any, OpenChange]:
    """Outstanding changes (by id, as :func:`replay` gives them) by their target, ``key`` of each: each
    target with its first change (``latest``: its last one) and the ids of all of them."""
    out: dict[Any, OpenChange] = {}
    for i, e in changes.items():
        target = out.setdefault(key(e), OpenChange(e))
        target.undo_ids.append(i)
        if latest:
            target.entry = e
    return out


@dataclass
class Replay:
    """What a ledger says now: per kind of change (:data:`CHANGES`), the changes no entry
    has undone, by id in ledger order; and, per undone change's id, the entry that undid it."""

    outstanding: dict[str, dict[str, Entry]]
    undone: dict[str, Entry]

    def open(self, kind: str) -> list[Entry]:
        """The outstanding changes of one kind, in ledger order."""
        return list(self.outstanding[kind].values())

    def any_open(self, *, besides: Iterable[str] = ()) -> bool:
        """True when a change of any kind (other than those named) is outstanding."""
        skip = set(besides)
        return any(changes for kind, changes in self.outstanding.items() if kind not in skip)


def replay(entries: Iterable[Entry]) -> Replay:
    """Replay a ledger (from any run, any node): every change still outstanding, by kind,
    and what undid the rest. The one reading of a ledger every undoing stage uses."""
    entries = list(entries)
    outstanding: dict[str, dict[str, Entry]] = {}
    undone: dict[str, Entry] = {}
    for kind, change in CHANGES.items():
        outstanding[kind], done = match_undos(entries, change.is_change, change.is_undo, change.key)
        undone.update(done)
    return Replay(outstanding, undone)
