"""The trial report: one self-contained HTML file rendered from the stage records only.

jinja2 with autoescaping on; inline CSS and SVG charts, no scripts, no network. It opens
with what the trial concludes (:mod:`llmtrial.report.conclusions`), then the charts
(:mod:`llmtrial.report.charts`), then every record's detail. Every measured number is shown with
its source (log line, result file or sampler) so an auditor can trace it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup

from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.records import human_bytes, read_record
from llmtrial.core.resources import TEMPLATES
from llmtrial.host.gpus import describe_process, gpu_label
from llmtrial.report import charts
from llmtrial.report.conclusions import (
    FIGURES,
    Settings,
    cold_warm,
    fixed_scenarios,
    not_measured,
    outcome_sentences,
    repetition_note,
    repetition_noteworthy,
    scenario_sentences,
    scenario_specs,
    scenario_tables,
    streams,
    warning_sentences,
)
from llmtrial.report.spans import nodes_context
from llmtrial.report.sweeps import sweep_gaps, sweep_tables
from llmtrial.serve.scenarios import passes_asked, repetition_of, runs_of
from llmtrial.serve.telemetry import read_samples


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


def _scenario_rows(configurations: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every pass of every configuration, regrouped by scenario (the detailed tables): a warm-up
    pass first, marked as such, and per configuration how many passes ran and why they stopped."""
    scenarios = []
    for name, spec in scenario_specs(configurations).items():
        entries = [(rec["configuration"], sc) for rec in configurations for sc in fixed_scenarios(rec)
                   if sc["name"] == name]
        rows = [{"configuration": conf, "pass": one, "agreement": sc.get("agreement", {}), "warmup": one is sc.get("warmup")}
                for conf, sc in entries for one in ([sc["warmup"]] if sc.get("warmup") else []) + sc["pass_results"]]
        notes = [{"configuration": conf, "note": repetition_note(repetition_of(sc), sc.get("warmup"))}
                 for conf, sc in entries if repetition_noteworthy(sc)]
        scenarios.append({"name": name, "spec": spec, "rows": rows, "notes": notes, "passes_asked": passes_asked(spec)})
    return scenarios


def _sweeps(configurations: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each sweep's tables and sentences (:func:`llmtrial.report.sweeps.sweep_tables`) with its chart."""
    names = [r["configuration"] for r in configurations]
    return [{**t, "chart": charts.sweep_chart(t, names)} for t in sweep_tables(configurations)]


def notes_html(notes: str | None) -> Markup:
    """The operator's notes (plain text or Markdown) as HTML: raw HTML escaped, no images
    (nothing the page would fetch), links only of safe schemes (markdown-it's default)."""
    if not notes:
        return Markup("")
    md = MarkdownIt("commonmark", {"html": False}).disable("image")
    return Markup(md.render(notes))


def _charts(tables: list[dict[str, Any]], configurations: list[Mapping[str, Any]],
            telemetry: Mapping[str, Any], per: str) -> list[charts.Chart]:
    names = [r["configuration"] for r in configurations]
    out = [charts.latency_chart(tables, names), charts.pareto_chart(tables, names, per),
           charts.prediction_chart(configurations, names)]
    out += [charts.timeseries_chart(r, telemetry[r["configuration"]]) for r in configurations
            if r["configuration"] in telemetry]
    return [c for c in out if c is not None]


def gpu_rows(configurations: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per pass (the warm-up and sweep steps too) and GPU: what NVML sampled in its window (mean
    utilisation, power against the limit, memory, PCIe traffic), from its telemetry summary."""
    rows = []
    for r in configurations:
        for sc in r.get("scenarios", []):
            for label, p in runs_of(sc):
                summary = (p.get("telemetry") or {}).get("summary") or {}
                gpus = sorted({k.split(".")[1] for k in summary if k.startswith("nvml.gpu")})
                for g in gpus:
                    f = {k.split(".", 2)[2]: v for k, v in summary.items() if k.startswith(f"nvml.{g}.")}
                    rows.append({"configuration": r["configuration"], "window": label, "gpu": g, "figures": f})
    return rows


def build_context(*, trial: str, preflight: Mapping[str, Any], manifest: Mapping[str, Any],
                  plans: list[Mapping[str, Any]], configurations: list[Mapping[str, Any]],
                  cleanup: Mapping[str, Any], patches: Mapping[str, Any] | None = None,
                  quiet: Mapping[str, Any] | None = None, telemetry: Mapping[str, Any] | None = None,
                  settings: Mapping[str, Any] | None = None, provenance: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the template sees: the records, the conclusions worked out of them, and the charts.
    ``telemetry`` maps a configuration to its samples (:func:`llmtrial.serve.telemetry.read_samples`)."""
    cfg = Settings.from_config(settings)
    by_name = {p["configuration"]: p for p in plans}
    tables = scenario_tables(configurations, by_name, cfg)
    gpus = preflight["environment"].get("gpus") or {}
    per = "GPU" if gpus.get("present") else "CPU worker"
    unstable = {(t["name"], c["configuration"]): c["spread"] for t in tables for c in t["cells"] if c["unstable"]}
    sweeps = _sweeps(configurations)
    return {
        "trial": trial,
        "generated": fmt_time(dt.datetime.now(tz=dt.UTC).timestamp()),
        "environment": preflight["environment"],
        "preflight": preflight,
        "plans": plans,
        "model": next((p["model"] for p in plans if p.get("model")), None),
        "skipped": [r for r in configurations if r.get("status") == "skipped"],
        "manifest": manifest,
        "configurations": configurations,
        "scenarios": _scenario_rows(configurations),
        "failures": [r for r in configurations if r.get("status") == "failed"],
        "cleanup": cleanup,
        "patches": patches or {"vllm": None, "patches": []},
        "quiet": quiet,
        "n_ok": sum(1 for r in configurations if r.get("status") == "ok"),
        "settings": cfg,
        "per": per,
        "tables": [{**t, "sentences": scenario_sentences(t)} for t in tables],
        "sweeps": sweeps,
        "any_warmup": any(sc.get("warmup") for r in configurations for sc in r.get("scenarios", [])),
        "outcomes": outcome_sentences(configurations),
        "warnings": warning_sentences(configurations),
        "warned": [r for r in configurations if r.get("engine_warnings")],
        "unstable": unstable,
        "figures": FIGURES,
        "charts": _charts(tables, configurations, telemetry or {}, per),
        "cold_warm": [cw for cw in (cold_warm(r) for r in configurations) if cw],
        "streams": [s for r in configurations for s in streams(r)],
        "gpu_rows": gpu_rows(configurations),
        "not_measured": not_measured(preflight=preflight, configurations=configurations, plans=plans, tables=tables)
        + sweep_gaps(sweeps),
        "notes": notes_html((settings or {}).get("notes")),
        "provenance": provenance,
        "nodes": nodes_context([ConfigurationRecord.model_validate(r) for r in configurations if r.get("nodes")],
                               preflight, manifest),
        "gpus": gpu_report(configurations, cleanup),
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
                 configurations: Iterable[Path], cleanup: Path, patches: Path | None = None,
                 quiet: Path | None = None, telemetry: Iterable[Path] = (), settings: Mapping[str, Any] | None = None,
                 provenance: Path | None = None, charts_dir: Path | None = None) -> Path:
    """Read the records named, render, and write the report atomically. ``telemetry`` are the
    configurations' samples files, in the order of ``configurations``; ``charts_dir``, when
    given, also receives each chart as an SVG file (for Snakemake's own report)."""
    records = [read_record(p) for p in configurations]
    samples = {r["configuration"]: read_samples(p) for r, p in zip(records, telemetry, strict=False) if Path(p).exists()}
    context = build_context(
        trial=trial,
        preflight=read_record(preflight),
        manifest=read_record(manifest),
        plans=[read_record(p) for p in plans],
        configurations=records,
        cleanup=read_record(cleanup),
        patches=read_record(patches) if patches is not None else None,
        quiet=read_record(quiet) if quiet is not None else None,
        telemetry=samples,
        settings=settings,
        provenance=read_record(provenance) if provenance is not None else None,
    )
    if charts_dir is not None:
        write_charts(Path(charts_dir), [*context["charts"], *(s["chart"] for s in context["sweeps"] if s["chart"])])
    return atomic_write_text(out, render_report(context))


def write_charts(folder: Path, items: Iterable[charts.Chart]) -> list[Path]:
    """Each chart as a standalone SVG file, the folder emptied of older charts first."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.svg"):
        old.unlink()
    return [atomic_write_text(folder / f"{c.name}.svg", c.svg) for c in items]


def gpu_report(configurations: Sequence[Mapping[str, Any]], cleanup: Mapping[str, Any]) -> dict[str, Any] | None:
    """The report's GPUs section: per configuration, what the census found before launch and
    each GPU's health after a failure; the GPUs cleanup still holds; one finding sentence per
    fact an auditor must see. None when no configuration had a GPU to look at."""
    rows = [{"configuration": r["configuration"], "census": r.get("gpu_census"), "health": r.get("gpu_health")}
            for r in configurations if (r.get("gpu_census") or {}).get("gpus") or r.get("gpu_health")]
    if not rows:
        return None
    sentences = []
    for row in rows:
        census_ = row["census"] or {}
        if census_.get("foreign"):
            sentences.append(f"{row['configuration']} was not launched: " + "; ".join(
                map(describe_process, census_["foreign"])) + " computed on a selected GPU.")
        allowed = [p for p in census_.get("processes", []) if p.get("allowed_by")]
        if allowed:
            sentences.append(f"{row['configuration']} shared its GPUs with " + "; ".join(
                f"{describe_process(p)}, allowed as {p['allowed_by']}" for p in allowed) + ".")
        for gpu in (row["health"] or {}).get("gpus", []):
            if gpu.get("healthy") is False:
                sentences.append(f"After {row['configuration']} failed, {gpu_label(gpu)} failed its health check: "
                                 f"{gpu['evidence']}.")
    for held in cleanup.get("gpus_held") or []:
        sentences.append(f"Cleanup still holds GPU {held['gpu']} as failed, so the services on it were not started.")
    return {"rows": rows, "sentences": sentences, "held": list(cleanup.get("gpus_held") or [])}
