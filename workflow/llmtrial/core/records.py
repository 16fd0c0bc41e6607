"""Stage records: the JSON files that stages hand to each other and to the report.

Every number a record carries can say where it came from: ``measured`` (read from a
log line, a benchmark result or a sampler), ``predicted`` (computed before launch) or
``estimated`` (computed from an assumption), ``given`` (a figure a person supplied) or
``unknown`` (no figure; the source says why). :func:`fact` builds that shape.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from pydantic import BaseModel, ValidationError

from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.record_base import FactKind, RecordModel, error_lines
from llmtrial.core.record_models import KINDS, record_schema

if TYPE_CHECKING:
    from llmtrial.core.cleanup_model import CleanupRecord, QuietRecord
    from llmtrial.core.comparison_model import ComparisonRecord
    from llmtrial.core.configuration_model import ConfigurationRecord
    from llmtrial.core.preflight_model import PreflightRecord
    from llmtrial.core.record_models import ManifestRecord, PatchesRecord, PlanRecord, PromptsRecord, ProvenanceRecord

Kind = FactKind

def fact(value: Any, source: str, kind: Kind = "measured", unit: str | None = None) -> dict[str, Any]:
    """A number with its provenance: ``{"value", "kind", "source"[, "unit"]}``."""
    out: dict[str, Any] = {"value": value, "kind": kind, "source": source}
    if unit is not None:
        out["unit"] = unit
    return out


@functools.cache
def _validator(kind: str) -> Any:
    """The validator of the record kind ``kind``: its JSON Schema, generated from its model
    (:func:`llmtrial.core.record_models.record_schema`; the package ships the same as
    ``schemas/<kind>.record.schema.json``)."""
    from jsonschema import Draft202012Validator  # only when a record is checked

    return Draft202012Validator(record_schema(kind))


def as_written(data: Any) -> Any:
    """A record (or a part of one) as JSON data: a model dumped as :func:`write_record` writes it (by
    alias, the fields it was given), a dict as it is."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return data


def _schema_errors(data: Any, kind: str) -> list[str]:
    """``field.path: message`` for every field of ``data`` that breaks the schema of ``kind``."""
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
            for e in _validator(kind).iter_errors(json.loads(json.dumps(as_written(data), default=str)))]


def check_record(data: Any, schema: str, *, source: str | os.PathLike[str] | None = None) -> None:
    """Raise ValueError naming every field of ``data`` (a dict or a record model) that breaks the schema of
    the record kind ``schema`` (:data:`llmtrial.core.record_models.KINDS`), and the file it came from
    when ``source`` names one.

    A record that does not match is a fault of the workflow, never of the trial.
    """
    errors = _schema_errors(data, schema)
    if errors:
        where = f" {source}" if source is not None else ""
        raise ValueError(f"{schema} record{where} does not match its schema:\n  " + "\n  ".join(errors))


@overload
def load_record(path: str | os.PathLike[str], kind: Literal["preflight"]) -> PreflightRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["plan"]) -> PlanRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["manifest"]) -> ManifestRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["quiet"]) -> QuietRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["patches"]) -> PatchesRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["configuration"]) -> ConfigurationRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["cleanup"]) -> CleanupRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["provenance"]) -> ProvenanceRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["comparison"]) -> ComparisonRecord: ...
@overload
def load_record(path: str | os.PathLike[str], kind: Literal["prompts"]) -> PromptsRecord: ...


def load_record(path: str | os.PathLike[str], kind: str) -> RecordModel:
    """Read a record as its typed model (:data:`llmtrial.core.record_models.KINDS`, the type each kind's
    overload names); ValueError naming the file and each field at fault when it does not match its kind
    (the model is what the kind's schema is generated from: one validation says both)."""
    data = read_record(path)
    try:
        return KINDS[kind].model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{kind} record {path} does not match its schema:\n  " + "\n  ".join(error_lines(exc))) from None


def write_record(path: str | os.PathLike[str], data: Any, schema: str | None = None) -> Path:
    """Write ``data`` as JSON atomically (temporary file, fsync, rename), after checking it against the
    schema of the record kind ``schema`` (every stage's record names its kind; see
    :data:`llmtrial.core.record_models.KINDS`).

    A dict is written as it is (its keys in their order). A record model is written with the fields
    it was given (read, validated or set) and no others: a default it was not given is left out, so
    the record says what the stage set; its kind is the model's when ``schema`` is not named."""
    if isinstance(data, BaseModel):
        schema = schema or next((k for k, m in KINDS.items() if type(data) is m), None)
        data = as_written(data)
    if schema is not None:
        check_record(data, schema)
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_record(path: str | os.PathLike[str]) -> Any:
    """Read a record, naming the file when it is missing or not valid JSON."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"record not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"record {p} is not valid JSON: {exc}") from None
