"""Typed models of the eight record kinds, each paired with its JSON schema.

A stage's record is checked against ``workflow/llmtrial/schemas/<schema>.record.schema.yaml`` before it
is written (:func:`llmtrial.core.records.write_record`); the model here is the same shape typed for
the code that reads records (:func:`llmtrial.core.records.load_record`). The top-level fields a
model requires are the fields its schema requires (a test holds them together). Models allow
fields they do not name, as the schemas do: a record may carry more than its readers need.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class Check(_Model):
    name: str
    status: Literal["ok", "warn", "fail", "skip"]
    detail: str


class Fact(_Model):
    value: Any
    kind: Literal["measured", "predicted", "estimated", "given", "unknown"]
    source: str
    unit: str | None = None


class Residue(_Model):
    kind: Literal["process", "port", "service", "file", "weights", "gpu"]
    what: str
    tried: str
    seen: str
    node: str | None = None


class PreflightRecord(_Model):
    """results/<trial>/preflight/record.json"""

    environment: dict[str, Any]
    checks: list[Check]
    disk: dict[str, Any]
    probes: dict[str, Any] | None = None


class PlanRecord(_Model):
    """results/<trial>/plans/<name>.json"""

    configuration: str
    verdict: Literal["fits", "fits_with_offload", "does_not_fit", "unknown"]
    reasons: list[str]
    checks: list[Check]
    hardware: dict[str, Any]
    plan: dict[str, Any]
    facts: dict[str, Fact]
    force: bool
    model: dict[str, Any] | None = None


class ManifestFile(_Model):
    path: str
    size: int
    sha256: str


class ManifestRecord(_Model):
    """results/<trial>/model/manifest.json (and manifest.json of a staged or archived folder)"""

    model_dir: str
    source: dict[str, Any]
    files: list[ManifestFile]
    total_bytes: int
    created: str


class QuietRecord(_Model):
    """results/<trial>/services/quieted.json"""

    restored_first: CleanupRecord | None
    services: list[dict[str, Any]]
    residues: list[Residue]
    quieted_at: float
    gpu: dict[str, Any] | None


class PatchesRecord(_Model):
    """results/<trial>/patches/record.json"""

    started: float
    finished: float
    apply_seconds: float
    reverted_first: list[dict[str, Any]]
    vllm: dict[str, Any] | None
    patches: list[dict[str, Any]]


class PlanVerdict(_Model):
    verdict: Literal["fits", "fits_with_offload", "does_not_fit", "unknown"]
    reasons: list[str]
    forced: bool


class EngineWarning(_Model):
    """One warning the engine printed (:func:`llmtrial.logs.engine_warnings.engine_warnings`)."""

    name: str
    line: str
    source: str
    count: int
    summary: str
    advice: str
    kind: Literal["measured"]
    process: str | None = None


class ConfigurationRecord(_Model):
    """results/<trial>/configs/<name>/record.json"""

    trial: str
    configuration: str
    status: Literal["ok", "failed", "skipped"]
    failure: dict[str, Any] | None
    server: dict[str, Any]
    startup: dict[str, Fact]
    engine_warnings: list[EngineWarning] = []
    cold_start: dict[str, Fact]
    scenarios: list[dict[str, Any]]
    telemetry: dict[str, Any]
    timing: dict[str, Any]
    plan: PlanVerdict
    prediction: list[dict[str, Any]]
    throughput_bound: list[dict[str, Any]] = []


class WeightsOutcome(_Model):
    """The cleanup record's ``weights``: always this shape, applied or not."""

    applied: bool
    reason: str | None
    folders: list[dict[str, Any]]
    freed_bytes: int
    residues: list[Residue]


class CleanupRecord(_Model):
    """results/<trial>/cleanup/record.json, on-demand.json, on-success.json"""

    run: str
    started: float
    finished: float
    ledger: str
    ledger_entries: int
    jobs: list[dict[str, Any]]
    servers: list[dict[str, Any]]
    groups: list[dict[str, Any]] = []
    ports: list[dict[str, Any]]
    services_restored: list[dict[str, Any]]
    services: list[dict[str, Any]]
    patches_reverted: list[dict[str, Any]]
    patches: list[dict[str, Any]]
    weights: WeightsOutcome
    left_behind: dict[str, list[dict[str, Any]]]
    host: dict[str, Any]
    residues: list[Residue]
    gpus_held: list[dict[str, Any]] = []
    restored: bool


class TrialFile(_Model):
    path: str
    sha256: str | None
    reason: str | None = None


class ProvenanceRecord(_Model):
    """What produced the trial's records (:func:`llmtrial.provenance.collect`)"""

    commit: str | None
    dirty: bool | None
    git_reason: str | None
    repo: str
    command_line: list[str] | None
    config: dict[str, Any]
    config_sha256: str
    trial_files: list[TrialFile]


QuietRecord.model_rebuild()

#: Every record kind: the name its schema file has (``<kind>.record.schema.yaml``) and its model.
KINDS: dict[str, type[_Model]] = {
    "preflight": PreflightRecord,
    "plan": PlanRecord,
    "manifest": ManifestRecord,
    "quiet": QuietRecord,
    "patches": PatchesRecord,
    "configuration": ConfigurationRecord,
    "cleanup": CleanupRecord,
    "provenance": ProvenanceRecord,
}
