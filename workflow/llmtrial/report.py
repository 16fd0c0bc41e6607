"""The trial report: one self-contained HTML file rendered from the stage records only.

jinja2 with autoescaping on; inline CSS, no scripts, no network. Every measured number
is shown with its source (log line, result file or sampler) so an auditor can trace it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2

from llmtrial.fileio import atomic_write_text
from llmtrial.records import human_bytes, read_record
from llmtrial.resources import TEMPLATES


def fmt_num(value: Any, digits: int = 2) -> str:
    """Numbers for tables: thousands separators, fixed decimals; '—' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_pct(value: Any) -> str:
    """A relative error as a signed percentage."""
    if value is None:
        return "—"
    return f"{100 * float(value):+.3f} %"


def fmt_bytes(value: Any) -> str:
    return "—" if value is None else human_bytes(value)


def fmt_time(value: Any) -> str:
    if value is None:
        return "—"
    return dt.datetime.fromtimestamp(float(value), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def build_context(*, trial: str, preflight: Mapping[str, Any], manifest: Mapping[str, Any],
                  plans: list[Mapping[str, Any]], configurations: list[Mapping[str, Any]],
                  cleanup: Mapping[str, Any], patches: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the template sees: the records, plus tables regrouped by scenario."""
    scenario_names: list[str] = []
    for rec in configurations:
        for sc in rec.get("scenarios", []):
            if sc["name"] not in scenario_names:
                scenario_names.append(sc["name"])
    scenarios = []
    for name in scenario_names:
        rows, spec = [], None
        for rec in configurations:
            for sc in rec.get("scenarios", []):
                if sc["name"] != name:
                    continue
                spec = spec or sc["spec"]
                for one in sc["passes"]:
                    rows.append({"configuration": rec["configuration"], "pass": one,
                                 "agreement": sc.get("agreement", {})})
        scenarios.append({"name": name, "spec": spec, "rows": rows})
    failed = [r for r in configurations if r.get("status") == "failed"]
    skipped = [r for r in configurations if r.get("status") == "skipped"]
    return {
        "trial": trial,
        "generated": fmt_time(dt.datetime.now(tz=dt.UTC).timestamp()),
        "environment": preflight["environment"],
        "preflight": preflight,
        "plans": plans,
        "skipped": skipped,
        "manifest": manifest,
        "configurations": configurations,
        "scenarios": scenarios,
        "failures": failed,
        "cleanup": cleanup,
        "patches": patches or {"vllm": None, "patches": []},
        "n_ok": sum(1 for r in configurations if r.get("status") == "ok"),
    }


def render_report(context: Mapping[str, Any], template_dir: Path = TEMPLATES) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=fmt_num, bytes=fmt_bytes, time=fmt_time, pct=fmt_pct)
    return env.get_template("report.html.j2").render(**context)


def write_report(out: Path, *, trial: str, preflight: Path, manifest: Path, plans: Iterable[Path],
                 configurations: Iterable[Path], cleanup: Path, patches: Path | None = None) -> Path:
    """Read the records named, render, and write the report atomically."""
    context = build_context(
        trial=trial,
        preflight=read_record(preflight),
        manifest=read_record(manifest),
        plans=[read_record(p) for p in plans],
        configurations=[read_record(p) for p in configurations],
        cleanup=read_record(cleanup),
        patches=read_record(patches) if patches is not None else None,
    )
    html = render_report(context)
    return atomic_write_text(out, html)
