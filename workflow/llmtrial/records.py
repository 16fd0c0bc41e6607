"""Stage records: the JSON files that stages hand to each other and to the report.

Every number a record carries can say where it came from: ``measured`` (read from a
log line, a benchmark result or a sampler), ``predicted`` (computed before launch) or
``estimated`` (computed from an assumption), ``given`` (a figure a person supplied) or
``unknown`` (no figure; the source says why). :func:`fact` builds that shape.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from llmtrial.fileio import atomic_write_text

Kind = Literal["measured", "predicted", "estimated", "given", "unknown"]

#: Environment variable names whose values never reach a record, a log or the report.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|CREDENTIAL", re.IGNORECASE)


def human_bytes(value: float) -> str:
    """A byte count for people: 1,023 B, 1.50 KiB, ... TiB."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.2f} {unit}"
        size /= 1024
    return f"{value} B"


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment for records: values of secret-looking names replaced by ``<redacted>``."""
    return {k: ("<redacted>" if SECRET_NAME.search(k) else v) for k, v in env.items()}


def fact(value: Any, source: str, kind: Kind = "measured", unit: str | None = None) -> dict[str, Any]:
    """A number with its provenance: ``{"value", "kind", "source"[, "unit"]}``."""
    out: dict[str, Any] = {"value": value, "kind": kind, "source": source}
    if unit is not None:
        out["unit"] = unit
    return out


SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def check_record(data: Any, schema: str) -> None:
    """Raise ValueError naming every field of ``data`` that breaks ``<schema>.record.schema.yaml``.

    A record that does not match is a fault of the workflow, never of the trial.
    """
    import yaml
    from jsonschema import Draft202012Validator

    with open(SCHEMAS / f"{schema}.record.schema.yaml", encoding="utf-8") as fh:
        validator = Draft202012Validator(yaml.safe_load(fh))
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
              for e in validator.iter_errors(json.loads(json.dumps(data, default=str)))]
    if errors:
        raise ValueError(f"{schema} record does not match its schema:\n  " + "\n  ".join(errors))


def write_record(path: str | os.PathLike[str], data: Any, schema: str | None = None) -> Path:
    """Write ``data`` as JSON atomically (temporary file, fsync, rename), after checking it
    against the record schema named ``schema`` when one is given."""
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
