"""A Benchmark Report checked against llm-d's published package: ``llmd-benchmark-report`` (pinned in
envs/workflow.txt), whose ``schema_v0_2`` models are the schema of the v0.2 line (reports declaring ``0.2`` and
``0.2.1`` validate against them alike, 0.2.1 having only added optional fields). The exports build their reports
from those models and say ``version: "0.2"``: every field they write is already in the first 0.2 revision.

What this module adds to the package: the refusal names the report (its file, or its configuration x scenario)
and each field at fault, as :class:`ReportInvalid` with one ``field.path: what is wrong`` line per fault. The
package checks a statistic's units in the object holding it and its message names the unit, not always the
field; the line names the field (the statistic of that object in that unit). And the version must be of the 0.2
line, which the package's model does not check.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from llmd_benchmark_report.schema_v0_2 import BenchmarkReportV02
from pydantic import ValidationError
from pydantic_core import ErrorDetails

#: The version the exports declare (the v0.2 line's first revision).
SCHEMA_VERSION = "0.2"

#: The package's message for a statistic in a unit its field does not allow (the field named in 0.2.1's rules only).
_BAD_UNITS = re.compile(r'Invalid units "(?P<unit>[^"]+)"(?: for "(?P<field>[^"]+)")?')


class ReportInvalid(ValueError):
    """A report that breaks the schema; the message has one ``field.path: what is wrong`` line per fault."""


def _node(data: Any, loc: tuple[int | str, ...]) -> Any:
    """The part of ``data`` at an error's place (a union member's name in the place is no key of the data)."""
    for key in loc:
        listed = isinstance(data, list) and isinstance(key, int) and key < len(data)
        if listed or (isinstance(data, Mapping) and key in data):
            data = data[key]
    return data


def _refused(data: Any, error: ErrorDetails, unit: str) -> bool:
    """Whether ``data`` is refused at the error's place for a statistic in ``unit``."""
    try:
        BenchmarkReportV02.model_validate(data)
    except ValidationError as exc:
        return any(e["loc"] == error["loc"] and (m := _BAD_UNITS.search(e["msg"])) and m["unit"] == unit
                   for e in exc.errors())
    return False


def _at_fault(data: Any, error: ErrorDetails) -> list[str]:
    """The fields a refusal of the units in the object at the error's place is about: the one its message names,
    else each statistic of that object in the refused unit that the package refuses alone (the package checks
    them in turn and names the unit only); none for any other error."""
    found = _BAD_UNITS.search(error["msg"])
    given = _node(data, error["loc"])
    if found is None or not isinstance(given, Mapping):
        return []
    if found["field"]:
        return [found["field"]]
    unit = found["unit"]
    named = [k for k, v in given.items() if isinstance(v, Mapping) and v.get("units") == unit]
    if len(named) < 2:
        return named
    alone = []
    for name in named:
        alike = copy.deepcopy(data)  # the other statistics in that unit left out
        node = _node(alike, error["loc"])
        for other in named:
            if other != name:
                del node[other]
        if _refused(alike, error, unit):
            alone.append(name)
    return alone or named


def _where(data: Any, error: ErrorDetails) -> list[str]:
    """Where the error is, as dotted paths: pydantic names a union member or a validator in its path
    (``inference_engine``, ``function-after[...]``), which are dropped."""
    path = ".".join(str(p) for p in error["loc"] if isinstance(p, int)
                    or not str(p).startswith(("function-", "inference_engine", "generic")))
    fields = _at_fault(data, error)
    if not fields:
        return [path or "(top level)"]
    return [f"{path}.{field}" if path else field for field in fields]


def validate_report(data: Any, *, source: str | None = None) -> BenchmarkReportV02:
    """``data`` (a report as JSON data) as the package's :class:`BenchmarkReportV02`; :class:`ReportInvalid`
    naming each field at fault (and ``source``, the file or the configuration x scenario it is about) when it
    breaks the schema or declares a version outside the 0.2 line."""
    where = f" {source}" if source else ""
    try:
        report = BenchmarkReportV02.model_validate(data)
    except ValidationError as exc:
        lines = [f"{path}: {e['msg']}" for e in exc.errors() for path in _where(data, e)]
        raise ReportInvalid(f"Benchmark Report{where} does not match the v0.2 schema:\n  " + "\n  ".join(lines)) from None
    if not re.fullmatch(r"0\.2(\.\d+)?", report.version):
        raise ReportInvalid(f"Benchmark Report{where}: version: {report.version!r} is not of the {SCHEMA_VERSION} line")
    return report
