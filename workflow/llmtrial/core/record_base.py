"""The base of every record model and the parts several record kinds share: a check, a fact, a GPU
held as failed, a residue.

A model refuses fields it does not name (``extra="forbid"``, ``additionalProperties: false`` in its
generated schema): a record carries what its model declares and nothing else, so a writer that adds a
figure declares it first. A record written before a field was added still reads (such a field is
optional). A field a record may leave out but never write as null
is typed :data:`Maybe` (the generated schema says only its type; the model reads it as None when
absent).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from llmtrial.core.trial_checks import CHECK_ERROR

T = TypeVar("T")

#: A field that may be absent but, when present, is never null: ``x: Maybe[str] = Field(None, ...)``.
Maybe = Union[T, SkipJsonSchema[None]]  # noqa: UP007 (a generic alias: ``T | ...`` is not subscriptable)

#: An integer at least 0.
NonNegInt = Annotated[int, Field(ge=0)]

#: A figure a record may write as an integer or as a fraction; the model keeps which it was (the report
#: shows ``14`` and ``14.0`` apart, as the record has them).
Number = int | float

#: A sha256 as lowercase hex.
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]

#: Rows of a table the record does not type further: a list of objects.
Rows = list[dict[str, Any]]

FactKind = Literal["measured", "predicted", "estimated", "given", "unknown"]
Verdict = Literal["fits", "fits_with_offload", "does_not_fit", "unknown"]


def error_lines(exc: ValidationError) -> list[str]:
    """``key.path: message`` for each error of a model's validation (a record's, a patch file's, a node's); a
    check across keys (:data:`llmtrial.core.trial_checks.CHECK_ERROR`) by its message alone, which names them."""
    return [str(e["msg"]) if e["type"] == CHECK_ERROR else f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}"
            for e in exc.errors()]


class RecordModel(BaseModel):
    """The base of every record model and of its parts."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)


class Check(RecordModel):
    """One check of the host or of a configuration."""

    name: str = Field(description="What was checked (allocator, dev_shm, disk_headroom, ...).")
    status: Literal["ok", "warn", "fail", "skip"] = Field(description="fail stops the trial; skip when it does not apply.")
    detail: str = Field(description="One sentence on what was seen.")
    # what some checks keep beside the sentence (llmtrial.host.checks, probes, crossnode)
    size_bytes: Maybe[int | dict[str, int | None]] = Field(None, description=(
        "dev_shm: /dev/shm's size; node_dev_shm: each node's, by node name."))
    free_bytes: Maybe[int] = Field(None, description="dev_shm: /dev/shm's free bytes.")
    soft: Maybe[int | None] = Field(None, description="open_files: the soft limit on open files (null: unlimited).")
    hard: Maybe[int | None] = Field(None, description="open_files: the hard limit (null: unlimited).")
    effective: Maybe[Any] = Field(None, description="allocator: the allocator setting in effect and where it came from.")
    below: Maybe[list[Any]] = Field(None, description="pcie_link: each GPU whose link runs below its maximum.")
    far_below: Maybe[Number] = Field(None, description="link_bandwidth: the fraction of the link's promise under which "
                                     "a measured bandwidth warns.")
    off: Maybe[list[Any]] = Field(None, description="peer_access: the GPU pairs without peer access.")
    configurations: Maybe[list[str]] = Field(None, description="peer_access: the configurations that split over GPUs.")
    versions: Maybe[dict[str, str | None]] = Field(None, description=(
        "A version check across nodes: each node's version (null: not installed), by node."))
    differing: Maybe[list[Any]] = Field(None, description="model_files: the staged files whose hashes differ across nodes.")
    changed: Maybe[dict[str, list[str]]] = Field(None, description="vllm_files: by node name, its vLLM files that differ "
                                                 "from RECORD.")
    errors: Maybe[dict[str, str]] = Field(None, description="node_reachable: why each node that did not answer failed.")
    nodes: Maybe[Any] = Field(None, description="A check across nodes: what each node showed, by node name.")
    processes: Maybe[Any] = Field(None, description="stale_processes: the processes of an earlier trial, by node name.")


class Fact(RecordModel):
    """A number (or text) with where it came from."""

    value: Any = Field(description="The figure.")
    kind: FactKind = Field(description="How it was obtained.")
    source: str = Field(description="Where: a log file and line (server.log:73), a result file, or the sampler.")
    unit: Maybe[str] = Field(None, description="Unit of value.")
    line: Maybe[str] = Field(None, description="The log line it was read from.")
    per_rank: Maybe[list[Any]] = Field(None, description="Every value when each worker printed its own line.")
    note: Maybe[str] = Field(None, description="What the unit as logged means (vLLM's V0 printed GiB as GB).")
    derived: Maybe[str] = Field(None, description="How a figure the log does not print was computed from ones it does.")
    method: Maybe[str] = Field(None, description="An estimate's rule, in words (decode_tok_s_ceiling).")
    terms: dict[str, Any] | None = Field(None, description=(
        "decode_tok_s_ceiling: seconds per stage (weights_s, offload_s, comm_s_per_token) and the bytes per "
        "token behind them; null when unknown."))
    not_counted: Maybe[list[str]] = Field(None, description=(
        "decode_tok_s_ceiling: terms left out because their bandwidth was not measured (the bound stays an "
        "upper bound)."))
    bandwidths_gbps: Maybe[dict[str, Number]] = Field(None, description=(
        "decode_tok_s_ceiling: the bandwidths it divides by, GB/s, by what they move (memory, offload, link)."))


class HeldGpu(RecordModel):
    """A GPU the ledger still holds as failed (after a configuration failed on it)."""

    gpu: Any
    uuid: Any = None
    label: Any = None
    evidence: Any = None
    run: Maybe[str | None] = Field(None, description="The run that held it as failed.")
    evidence_now: Maybe[str | None] = Field(None, description="What its health check says now.")


class Residue(RecordModel):
    """What could not be undone without force."""

    kind: Literal["process", "port", "service", "file", "weights", "gpu", "node"] = Field(description=(
        "What was left (node: a SLURM node whose changes its cleanup could not reach)."))
    what: str = Field(description="Which one.")
    tried: str = Field(description="What cleanup tried.")
    seen: str = Field(description="What it saw afterwards.")
    size: Maybe[int | None] = Field(None, description="Weights: the bytes left there, when known.")
    node: Maybe[str] = Field(None, description=(
        "The node it was left on, where not this host (a node cleanup could not reach is named with ssh's error)."))


class LockRow(RecordModel):
    """One taking of the host's lock (llmtrial.core.hostlock) and what this cleanup did with it."""

    path: str = Field(description="The lock file.")
    run: str = Field(description="The run that took it.")
    outcome: str = Field(description=(
        "released; taken over by run R (a later run of the trial holds it); held by <holder> (another trial's, left "
        "alone); not held; or kept (the host was not given back: it stays held until a cleanup gives it back)."))
