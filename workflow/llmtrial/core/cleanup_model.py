"""The cleanup record's model and the quiet record's (which holds the cleanup of an earlier run it did
first): what a trial gave back, read from the ledger alone, and what it quieted. The other record
kinds are in :mod:`llmtrial.core.record_models`, which lists every kind."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from llmtrial.core.record_base import HeldGpu, LockRow, Maybe, NonNegInt, Number, RecordModel, Residue, Rows

# --------------------------------------------------------------------------- cleanup


class Undo(RecordModel):
    """A change of any run, the run that made it, and the run and outcome of what undid it (null while open)."""

    run: Any = None
    change: Any = None
    undone_by_run: str | None = None
    action: Any = None


class JobRow(Undo):
    """A configuration job and how it ended."""

    label: Any = None
    pid: Any = None
    alive_pids: Maybe[list[int]] = Field(None, description="The job's processes still alive when cleanup found it.")


class ServerRow(Undo):
    """A server (or process group) and how it was stopped."""

    label: Any = None
    pgid: Any = None
    port: Any = None
    node: Any = None
    alive_pids: Maybe[list[Any]] = None
    pid: Maybe[int | None] = Field(None, description="A process group's leader (its pgid).")
    error: Maybe[str] = Field(None, description="Why its node could not be reached to stop it.")
    stop: Maybe[dict[str, Any]] = Field(None, description="How it was stopped: signals, seconds, survivors, port closed.")


class ServiceRow(RecordModel):
    """One quiet of a service: its state before, when it stopped and came back, and its health."""

    name: str
    kind: Maybe[str] = None
    run: Any = None
    was_running: Maybe[bool] = None
    stopped_at: Number | None = None
    down: Any = None
    restarted_at: Number | None = None
    healthy: bool | None = None
    healthy_after_s: Number | None = None
    restored_by_run: str | None = None
    quiet: Maybe[str] = Field(None, description="The ledger entry of the quiet.")
    state_seen: Maybe[str | None] = Field(None, description="What the status command said before the quiet.")
    node: Maybe[str] = Field(None, description="The node it runs on (absent: this host).")


class PatchRow(RecordModel):
    """A file or plugin folder a patch changed (on its node), and its revert."""

    patches: list[str] = Field(description="The patches that changed it.")
    mode: Literal["file", "plugin"]
    target: str = Field(description="The file or folder.")
    node: Any = None
    run: Any = None
    backup: Maybe[str] = Field(None, description="Mode file: the copy of the original.")
    record_hash: Maybe[str] = None
    before_hash: Maybe[str] = None
    after_hash: Maybe[str] = None
    copy_of: str | None = Field(None, description="A plugin folder carried to another node: the folder here.")
    applied_at: Number | None = None
    reverted_at: Number | None = None
    reverted_by_run: str | None = None
    revert_outcome: str | None = None
    matches_record: bool | None = None
    change: Maybe[str] = Field(None, description="The ledger entry of the change.")
    path: Maybe[str] = Field(None, description="Mode file: the file's path relative to site-packages, as in RECORD.")
    entry_points: Maybe[dict[str, str]] = Field(None, description="Mode plugin: the entry points the folder declares.")


class PolicyDone(RecordModel):
    """What the weights policy did to one staged folder (a row of this run's or an earlier run's)."""

    freed_bytes: Maybe[int] = Field(None, description="Bytes freed.")
    kept_bytes: Maybe[int] = Field(None, description="Bytes left in place.")
    archive: Maybe[str] = Field(None, description="Policy archive: where the archive is.")
    residues: Maybe[list[Residue]] = Field(None, description="What could not be removed or archived.")
    archive_seconds: Maybe[Number] = Field(None, description="Seconds the archive took.")
    archive_copy: Maybe[str] = Field(None, alias="copy", description="The archive's copy as checked: files and bytes.")
    files_removed: Maybe[int] = Field(None, description="Files deleted.")
    node: Maybe[str] = Field(None, description="The node that holds it (a copy on another node).")


class RestoredService(RecordModel):
    """A service this cleanup started again, or kept stopped because its GPU failed, and how it came back."""

    name: str
    kind: Literal["systemd", "docker", "supervisor", "command"]
    run: str | None = Field(description="The run that quieted it.")
    quiet: str = Field(description="The ledger entry of the quiet.")
    started_at: float = Field(description="Unix time the restore of it began.")
    node: Maybe[str] = Field(None, description="The node it runs on (absent: this host).")
    state_before: Maybe[str] = Field(None, description="Its state before the start, as its status command said.")
    start_exit: Maybe[int | None] = Field(None, description="The start command's exit code (null: it timed out).")
    start_seen: Maybe[str] = Field(None, description="What the start command printed or why it failed.")
    healthy: bool = Field(description="Running and answering its health check.")
    health_seen: str = Field(description="What the last look at it saw.")
    healthy_after_s: Maybe[Number] = Field(None, description="Seconds from the restore's start to that look.")
    held_by_gpu: Maybe[int | str] = Field(None, description="Not started: the failed GPU it runs on.")


class PatchRevert(RecordModel):
    """One patched file, plugin folder or node's copy of one that this cleanup reverted or removed."""

    patches: list[str]
    run: str = Field(description="The run that changed it.")
    action: str = Field(description="What the revert did (restored from backup, removed, none, not restored: why).")
    path: Maybe[str] = Field(None, description="A file: its path relative to site-packages, as in RECORD.")
    file: Maybe[str] = Field(None, description="A file: its absolute path.")
    found_hash: Maybe[str | None] = Field(None, description="A file: its sha256 when the revert found it.")
    hash: Maybe[str | None] = Field(None, description="A file: its sha256 after the revert.")
    record_hash: Maybe[str | None] = Field(None, description="A file: its hash in RECORD.")
    matches_record: Maybe[bool] = Field(None, description="A file: it matches RECORD after the revert.")
    dir: Maybe[str] = Field(None, description="A plugin folder or its copy on a node.")
    node: Maybe[str] = Field(None, description="A copy: the node that holds it.")


class HostService(RecordModel):
    """A service stopped, as read from the host after cleanup."""

    name: str
    running_and_healthy: bool
    seen: Maybe[str] = None
    run: Maybe[str | None] = Field(None, description="The run that quieted it.")
    quiet: Maybe[str] = Field(None, description="The ledger entry of the quiet.")


class PortState(RecordModel):
    """Whether one trial port still listened."""

    port: Any
    listening: Any
    pids: Maybe[list[int]] = Field(None, description="The processes that held the port.")


class WeightsFolder(PolicyDone):
    """One staged folder and what the policy did to it."""

    path: Any
    policy: Any
    action: Any
    run: Maybe[str | None] = Field(None, description="The run that staged it.")


class WeightsOutcome(RecordModel):
    """The cleanup record's ``weights``: always this shape, applied or not."""

    applied: bool = Field(description=(
        "The policy was applied (a cleanup after a failed job does not, so the rerun finds the weights)."))
    reason: str | None = Field(description="Why it was not applied; null when it was.")
    folders: list[WeightsFolder] = Field(description="This run's staged folders and what the policy did to each.")
    freed_bytes: NonNegInt = Field(description="Bytes freed in all.")
    residues: list[Residue]


class LeftBehind(RecordModel):
    """Changes of earlier runs that this cleanup undid or that are still outstanding, by kind."""

    jobs: list[JobRow]
    servers: list[ServerRow]
    groups: list[ServerRow] = Field([], description="Process groups the trial started on any node (ray, headless ranks).")
    services: list[ServiceRow]
    patches: list[PatchRow]
    weights: list[WeightsFolder]


class HostAfter(RecordModel):
    """What the host showed after cleanup."""

    services: list[HostService] = Field(description="Whether each service stopped is running and healthy now.")


class CleanupRecord(RecordModel):
    """What a cleanup gave back (results/<trial>/cleanup/record.json; on-demand.json for `snakemake cleanup` and
    `llmtrial cleanup`; on-error.json after a failed job; on-success.json after a partial run; under SLURM
    at-allocation-end.json, by an allocation that ended with changes open on its node). Written by
    llmtrial.lifecycle.cleanup from the ledger alone; read by the report. What this run changed is kept apart from
    what earlier runs left."""

    model_config = ConfigDict(title="cleanup record")

    run: str = Field(description="The run that did this cleanup.")
    started: float = Field(description="Unix time it began.")
    finished: float = Field(description="Unix time it ended.")
    ledger: str = Field(description="The ledger it read.")
    ledger_entries: NonNegInt = Field(description="Entries in the ledger when it began.")
    jobs: list[JobRow] = Field(description="This run's configuration jobs and how each ended.")
    servers: list[ServerRow] = Field(description="This run's servers and how each was stopped.")
    groups: Rows = Field([], description=(
        "This run's process groups on any node (a worker on another host), each with its node and how it was "
        "stopped there."))
    ports: list[PortState] = Field(description="Whether each trial port still listened after the servers were stopped.")
    services_restored: list[RestoredService] = Field(description="The services this cleanup started again.")
    services: list[ServiceRow] = Field(description="This run's quiets of services, from the ledger.")
    patches_reverted: list[PatchRevert] = Field(description="The patch reverts this cleanup did.")
    patches: list[PatchRow] = Field(description=(
        "This run's patched files and plugin folders, from the ledger, each with its node (a plugin folder "
        "carried to another node: copy_of names the folder here)."))
    weights: WeightsOutcome = Field(description=(
        "The staged weights' policy (keep, archive or delete), or why it was not applied."))
    left_behind: LeftBehind = Field(description=(
        "Changes of earlier runs that this cleanup undid or that are still outstanding."))
    host: HostAfter = Field(description="What the host showed after cleanup.")
    gpus_held: list[HeldGpu] = Field([], description=(
        "GPUs that failed their health check after a configuration failed and failed it again at this cleanup "
        "(gpu, uuid, the configuration, the evidence then and now): the services on them stay stopped."))
    residues: list[Residue] = Field(description="What could not be undone.")
    restored: bool = Field(description="No residue and every service stopped runs and is healthy again.")
    host_lock: list[LockRow] = Field([], description=(
        "The host's lock as every run of the trial took it, and what this cleanup did with it: released once the host "
        "was given back, kept while it was not."))


# --------------------------------------------------------------------------- quiet


class QuietedService(RecordModel):
    """One configured service: its state before and what was done."""

    name: str = Field(description="Service name from the config.")
    kind: Literal["systemd", "docker", "supervisor", "command"] = Field(description="How it is managed.")
    was_running: bool = Field(description="It ran when the stage read its state.")
    state_seen: str = Field(description="What its status command showed.")
    action: str = Field(description="stopped, or left stopped (was not running).")
    stopped_at: Maybe[float] = Field(None, description="Unix time the stop began.")
    stop_exit: int | None = Field(None, description="Exit code of the stop command.")
    down_after_s: Maybe[float] = Field(None, description="Seconds until it was down.")
    seen: Maybe[str] = Field(None, description="Its state after the stop.")
    node: Maybe[str] = Field(None, description="The node it runs on (absent: this host).")


class QuietGpu(RecordModel):
    """GPU memory and compute processes before and after."""

    before: Any
    after: Any
    memory_freed_bytes: int = Field(description="GPU memory in use before minus after.")


class QuietRecord(RecordModel):
    """What the quiet stage did (results/<trial>/services/quieted.json): per service its state before and what
    was done, the GPU memory freed, and the cleanup of an earlier run it did first. Written by
    llmtrial.host.services (quiet_host), with the restore first of llmtrial.lifecycle.cleanup (restore_first); read
    by the report."""

    model_config = ConfigDict(title="quieted services record")

    restored_first: CleanupRecord | None = Field(description=(
        "The cleanup record of what an earlier run left changed and this stage undid first, or null."))
    services: list[QuietedService] = Field(description="One entry per configured service, in config order.")
    residues: list[Residue] = Field(description="Services that would not stop.")
    quieted_at: float = Field(description="Unix time the stage ended.")
    gpu: QuietGpu | None = Field(description="GPU memory and compute processes before and after (null without NVML).")
