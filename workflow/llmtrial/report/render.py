"""The trial report: one self-contained HTML file rendered from the stage records only.

jinja2 with autoescaping on; inline CSS and SVG charts, no scripts, no network. It opens
with what the trial concludes (:mod:`llmtrial.report.conclusions`), then the charts
(:mod:`llmtrial.report.charts`), then every record's detail. Every measured number is shown with
its source (log line, result file or sampler) so an auditor can trace it.

Each record is read as its model (:func:`llmtrial.core.records.load_record`), and the templates
read their fields as attributes, as they read the context and its rows (:mod:`llmtrial.report.sections`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment
from markdown_it import MarkdownIt
from markupsafe import Markup

from llmtrial.core.cleanup_model import CleanupRecord, QuietRecord
from llmtrial.core.configuration_model import (
    ConfigurationRecord,
    GpuProcess,
    SamplerStats,
)
from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.preflight_model import PreflightRecord
from llmtrial.core.record_models import ManifestRecord, PatchesRecord, PlanRecord, ProvenanceRecord
from llmtrial.core.records import load_record
from llmtrial.core.resources import TEMPLATES
from llmtrial.core.scenario_model import (
    Agreement,
    PassSummary,
    Scenario,
    ScenarioSpec,
    ServerMetrics,
    WindowFigures,
    WindowStat,
)
from llmtrial.core.trial_config import ReportBlock, StatisticsBlock
from llmtrial.core.units import human_bytes
from llmtrial.host.gpus import describe_process, gpu_label
from llmtrial.logs.startup_phases import PHASES
from llmtrial.report import charts
from llmtrial.report.answers import answers_context, answers_gaps
from llmtrial.report.cells import ScenarioTable, Settings
from llmtrial.report.conclusions import (
    FIGURES,
    asked,
    cold_warm,
    fixed_scenarios,
    not_measured,
    outcome_sentences,
    repetition,
    repetition_note,
    repetition_noteworthy,
    scenario_specs,
    scenario_tables,
    streams,
    warning_sentences,
)
from llmtrial.report.costs import cost_gaps, energy_method, energy_rows
from llmtrial.report.multinode import nodes_context
from llmtrial.report.sections import (
    BoundRows,
    Finding,
    GpuLook,
    GpuSection,
    GpuWindow,
    HostWindow,
    PassRow,
    PhaseRow,
    RepetitionNote,
    ReportContext,
    Sampling,
    ScenarioPasses,
    SourceRow,
)
from llmtrial.report.sweeps import SweepTable, sweep_gaps, sweep_tables
from llmtrial.report.templates import template_environment
from llmtrial.report.why_failed import why_failed
from llmtrial.serve.energy import ENERGY_TOLERANCE
from llmtrial.serve.telemetry import read_samples

if TYPE_CHECKING:  # pandas is only needed by the telemetry samples
    import pandas

#: NVML's figures per GPU and window that the report shows: the row's key, the metric, its figure over the window.
GPU_FIGURES = (("util", "util_percent", "mean"), ("mem_util", "mem_util_percent", "mean"), ("power", "power_w", "mean"),
               ("power_limit", "power_limit_w", "mean"), ("mem_used", "mem_used_bytes", "max"),
               ("pcie_tx", "pcie_tx_kbps", "mean"), ("pcie_rx", "pcie_rx_kbps", "mean"), ("temp", "temp_c", "max"))
#: The host source's figures per window that the report shows: the row's key, the metric, its figure.
HOST_FIGURES = (("cpu", "host.cpu_percent", "mean"), ("tree_cpu", "host.tree_cpu_percent", "mean"),
                ("tree_rss", "host.tree_rss_bytes", "max"), ("mem_used", "host.mem_used_bytes", "max"),
                ("samples", "host.cpu_percent", "n"))


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


def _scenario_rows(configurations: list[ConfigurationRecord]) -> list[ScenarioPasses]:
    """Every pass of every configuration, regrouped by scenario (the detailed tables): a warm-up
    pass first, marked as such, and per configuration how many passes ran and why they stopped."""
    scenarios = []
    for name, spec in scenario_specs(configurations).items():
        entries = [(rec.configuration, sc) for rec in configurations for sc in fixed_scenarios(rec) if sc.name == name]
        rows = [PassRow(conf, one, one is sc.warmup, sc.agreement or Agreement(), one.summary or PassSummary(),
                        one.server_metrics or ServerMetrics())
                for conf, sc in entries for one in ([sc.warmup] if sc.warmup else []) + sc.pass_results]
        notes = [RepetitionNote(conf, repetition_note(repetition(sc), sc.warmup))
                 for conf, sc in entries if repetition_noteworthy(sc)]
        scenarios.append(ScenarioPasses(name=name, spec=spec, rows=rows, notes=notes, passes_asked=asked(spec),
                                        caching=caching_text(entries)))
    return scenarios


def workload_text(spec: ScenarioSpec) -> str:
    """What a pass of the scenario sends, in words: the dataset and its lengths (the template's ``workload`` filter)."""
    dataset = spec.dataset or "random"
    if dataset in ("custom", "sharegpt"):
        digest = f", sha256 {spec.prompts_sha256[:12]}…" if spec.prompts_sha256 else ""
        held = f", {spec.prompts_count} in the file" if spec.prompts_count else ""
        return f"{spec.num_prompts} prompts from {spec.prompts} ({dataset} dataset{digest}{held}), {spec.output_len} out tokens"
    if dataset == "prefix_repetition":
        return (f"{spec.num_prompts} prompts of {spec.input_len} in / {spec.output_len} out tokens, the first "
                f"{spec.prefix_len} tokens of each one of {spec.num_prefixes or 1} shared prefix(es) (prefix_repetition "
                "dataset, prefix caching on)")
    ratio = spec.range_ratio
    if isinstance(ratio, dict):
        ratio = f"{ratio['input']} input, {ratio['output']} output"
    spread = f" (range ratio {ratio})" if ratio else ""
    return f"{spec.num_prompts} prompts of {spec.input_len} in / {spec.output_len} out tokens{spread}"


def caching_text(entries: Sequence[tuple[str, Scenario]]) -> str | None:
    """Where the scenario ran with prefix caching on, in words (None where it ran with it off everywhere)."""
    relaunched = [conf for conf, sc in entries if sc.prefix_caching and sc.relaunched]
    by_args = [conf for conf, sc in entries if sc.prefix_caching and not sc.relaunched]
    parts = []
    if relaunched:
        parts.append(f"prefix caching on for this scenario alone ({', '.join(relaunched)}): the configuration's server "
                     "was launched again with --enable-prefix-caching after the other scenarios, since the trial "
                     "otherwise turns it off")
    if by_args:
        parts.append(f"prefix caching on ({', '.join(by_args)}): the configuration's own args turn it on")
    return "; ".join(parts) or None


def _sweeps(configurations: list[ConfigurationRecord]) -> list[tuple[SweepTable, charts.Chart | None]]:
    """Each sweep's tables and sentences (:func:`llmtrial.report.sweeps.sweep_tables`) with its chart."""
    names = [r.configuration for r in configurations]
    return [(t, charts.sweep_chart(t, names)) for t in sweep_tables(configurations)]


def notes_html(notes: str | None) -> Markup:
    """The operator's notes (plain text or Markdown) as HTML: raw HTML escaped, no images
    (nothing the page would fetch), links only of safe schemes (markdown-it's default)."""
    if not notes:
        return Markup("")
    md = MarkdownIt("commonmark", {"html": False}).disable("image")
    return Markup(md.render(notes))


def _charts(tables: list[ScenarioTable], configurations: list[ConfigurationRecord],
            telemetry: Mapping[str, pandas.DataFrame], per: str) -> list[charts.Chart]:
    names = [r.configuration for r in configurations]
    out = [charts.latency_chart(tables, names), charts.pareto_chart(tables, names, per),
           charts.prediction_chart(configurations, names)]
    out += [charts.timeseries_chart(r, telemetry[r.configuration]) for r in configurations
            if r.configuration in telemetry]
    return [c for c in out if c is not None]


def _figure(summary: Mapping[str, WindowStat], metric: str, stat: str) -> float | None:
    """One figure (mean, max, n, ...) of one sampled ``source.metric`` over a window; None when not sampled."""
    return getattr(summary[metric], stat) if metric in summary else None


def _summary(window: WindowFigures | None) -> dict[str, WindowStat]:
    """What telemetry sampled in a window, per ``source.metric``; empty when nothing was."""
    return (window.summary if window else None) or {}


def gpu_rows(configurations: list[ConfigurationRecord]) -> list[GpuWindow]:
    """Per pass (the warm-up and sweep steps too) and GPU: what NVML sampled in its window (mean
    utilisation, power against the limit, memory, PCIe traffic), from its telemetry summary."""
    rows = []
    for r in configurations:
        for sc in r.scenarios:
            for label, p in sc.runs():
                summary = _summary(p.telemetry)
                for g in sorted({k.split(".")[1] for k in summary if k.startswith("nvml.gpu")}):
                    rows.append(GpuWindow(r.configuration, label, g, **{
                        key: _figure(summary, f"nvml.{g}.{metric}", stat) for key, metric, stat in GPU_FIGURES}))
    return rows


def host_rows(configurations: list[ConfigurationRecord]) -> list[HostWindow]:
    """Per configuration and window (start-up, then each pass): what the host source sampled (system and
    server-tree CPU, RSS, memory used, samples)."""
    rows = []
    for r in configurations:
        start = r.telemetry.startup_window
        windows = [("start-up", start)] if start and start.summary is not None else []
        windows += [(f"{sc.name} pass {p.pass_}", p.telemetry) for sc in r.scenarios for p in sc.pass_results]
        for label, window in windows:
            summary = _summary(window)
            rows.append(HostWindow(r.configuration, label,
                                   **{key: _figure(summary, metric, stat) for key, metric, stat in HOST_FIGURES}))
    return rows


def telemetry_rows(configurations: list[ConfigurationRecord]) -> Sampling:
    """Each telemetry source of each configuration with the sampler's own figures for it, the GPU and CPU
    package energy per pass where measured (:func:`llmtrial.report.costs.energy_rows`), and how often the
    host source sampled (1 s when not recorded)."""
    sources = []
    for r in configurations:
        sampler = r.telemetry.sampler or {}
        sources += [SourceRow(r.configuration, name, src, sampler[name] if name in sampler else SamplerStats())
                    for name, src in (r.telemetry.sources or {}).items()]
    energy = energy_rows(configurations)
    sampler = (configurations[0].telemetry.sampler or {}) if configurations else {}
    return Sampling(sources=sources, energy=energy, host_interval_s=sampler["host"].achieved_interval_s
                    if "host" in sampler else 1.0, hosts=host_rows(configurations), gpus=gpu_rows(configurations))


def bound_rows(plans: list[PlanRecord], configurations: list[ConfigurationRecord]) -> list[BoundRows]:
    """Per plan with a decode throughput bound: the bound, and its configuration's passes measured beside it."""
    return [BoundRows(p.configuration, p.facts["decode_tok_s_ceiling"],
                      next((r.throughput_bound for r in configurations if r.configuration == p.configuration), []))
            for p in plans if "decode_tok_s_ceiling" in p.facts]


def phase_rows(configurations: list[ConfigurationRecord]) -> tuple[list[str], list[PhaseRow]]:
    """The start-up phases any configuration's log showed, in start-up order, and each configuration's row."""
    names = [n for n in PHASES if any(p.name == n for r in configurations for p in r.startup_phases)]
    rows = []
    for r in (r for r in configurations if r.startup_phases):
        by_name = {p.name: p for p in r.startup_phases}
        seconds = [p.seconds for p in r.startup_phases]
        rows.append(PhaseRow(configuration=r.configuration, phases=[by_name.get(n) for n in names],
                             total=None if None in seconds else sum(seconds), compile_cache=r.compile_cache))
    return names, rows


def build_context(*, trial: str, preflight: PreflightRecord, manifest: ManifestRecord, plans: list[PlanRecord],
                  configurations: list[ConfigurationRecord], cleanup: CleanupRecord, patches: PatchesRecord | None = None,
                  quiet: QuietRecord | None = None, telemetry: Mapping[str, pandas.DataFrame] | None = None,
                  settings: ReportBlock | None = None, provenance: ProvenanceRecord | None = None,
                  statistics: StatisticsBlock | None = None) -> ReportContext:
    """What the template sees: the records, the conclusions worked out of them, and the charts.
    ``telemetry`` maps a configuration to its samples (:func:`llmtrial.serve.telemetry.read_samples`);
    ``settings`` is the trial file's ``report`` block, ``statistics`` its ``statistics`` block; the price of
    the cost figures is the ``provenance`` record's ``cost`` (none without it)."""
    cfg = Settings.from_config(settings, statistics)
    cost = provenance.cost if provenance is not None else None
    tables = scenario_tables(configurations, plans, cfg, cost)
    per = "GPU" if preflight.environment.gpus.present else "CPU worker"
    unstable = {(t.name, c.configuration): c.spread for t in tables for c in t.cells if c.unstable}
    sweeps = _sweeps(configurations)
    baseline = tables[0].baseline if tables else cfg.baseline
    phases = phase_rows(configurations)
    return ReportContext(
        trial=trial,
        generated=fmt_time(dt.datetime.now(tz=dt.UTC).timestamp()),
        environment=preflight.environment,
        preflight=preflight,
        plans=plans,
        bounds=bound_rows(plans, configurations),
        model=next((p.model for p in plans if p.model), None),
        skipped=[r for r in configurations if r.status == "skipped"],
        manifest=manifest,
        configurations=configurations,
        scenarios=_scenario_rows(configurations),
        failures=[r for r in configurations if r.status == "failed"],
        cleanup=cleanup,
        left_behind=sum(len(rows) for _kind, rows in cleanup.left_behind),
        patches=patches,
        quiet=quiet,
        n_ok=sum(1 for r in configurations if r.status == "ok"),
        settings=cfg,
        per=per,
        tables=tables,
        sweeps=sweeps,
        any_warmup=any(sc.warmup for r in configurations for sc in r.scenarios),
        outcomes=outcome_sentences(configurations),
        warnings=warning_sentences(configurations),
        warned=[r for r in configurations if r.engine_warnings],
        phase_names=phases[0], phase_rows=phases[1],
        unstable=unstable,
        figures=FIGURES,
        charts=_charts(tables, configurations, telemetry or {}, per),
        cold_warm=[cw for cw in (cold_warm(r) for r in configurations) if cw],
        streams=[s for r in configurations for s in streams(r)],
        sampling=telemetry_rows(configurations),
        not_measured=not_measured(preflight=preflight, configurations=configurations, plans=plans, tables=tables)
        + cost_gaps(preflight=preflight, configurations=configurations, cost=cost, tables=tables)
        + sweep_gaps(t for t, _chart in sweeps) + answers_gaps(configurations),
        cost=cost,
        energy_method=energy_method(),
        energy_tolerance=ENERGY_TOLERANCE,
        answers=answers_context(configurations, baseline, manifest),
        notes=notes_html(cfg.notes),
        provenance=provenance,
        nodes=nodes_context(configurations, preflight, manifest),
        gpus=gpu_report(configurations, cleanup),
        why_failed=why_failed(configurations),
    )


def findings(context: ReportContext) -> list[Finding]:
    """What the trial found, in the report's order (its first screen): each sentence, and whether it
    quotes a figure."""
    lines = [(s, True) for t in context.tables for s in t.sentences]
    lines += [(s, True) for sw, _chart in context.sweeps for s in sw.sentences]
    lines += [(s, False) for s in [*context.outcomes, *context.warnings]]
    lines += [(context.why_failed.headline, False)] if context.why_failed else []
    nodes, gpus, answers = context.nodes, context.gpus, context.answers
    lines += [(c.sentence, True) for c in (nodes.configurations if nodes else [])]
    lines += [(s, True) for s in (gpus.sentences if gpus else [])]
    lines += [(s, False) for s in (answers.sentences if answers else [])]
    return [Finding(text, figure) for text, figure in lines]


def outcome_summary(context: ReportContext) -> str:
    """The report's opening sentence: how many configurations completed, failed, were not launched."""
    return (f"{context.n_ok} of {len(context.configurations)} serving configurations completed; "
            f"{len(context.failures)} failed; {len(context.skipped)} not launched (the planner said they "
            "cannot work).")


def findings_text(context: ReportContext) -> str:
    """The report's first screen as plain text (``findings.txt``): the outcome, then each finding."""
    return "\n".join([outcome_summary(context), *(f"- {f.text}" for f in findings(context))]) + "\n"


def report_environment(template_dir: Path = TEMPLATES) -> Environment:
    """The templates with the report's filters."""
    env = template_environment(template_dir)
    env.filters.update(num=fmt_num, bytes=fmt_bytes, time=fmt_time, pct=fmt_pct, workload=workload_text)
    return env


def render_report(context: ReportContext, template_dir: Path = TEMPLATES) -> str:
    return report_environment(template_dir).get_template("report.html.j2").render(**vars(context), findings=findings(context),
                                                     outcome_summary=outcome_summary(context))


def write_report(out: Path, *, trial: str, preflight: Path, manifest: Path, plans: Iterable[Path],
                 configurations: Iterable[Path], cleanup: Path, patches: Path | None = None,
                 quiet: Path | None = None, telemetry: Iterable[Path] = (), settings: ReportBlock | None = None,
                 provenance: Path | None = None, charts_dir: Path | None = None,
                 statistics: StatisticsBlock | None = None, findings_file: Path | None = None) -> Path:
    """Read the records named, each as its model, render, and write the report atomically.
    ``telemetry`` are the configurations' samples files, in the order of ``configurations``;
    ``charts_dir``, when given, also receives each chart as an SVG file (for Snakemake's own report);
    ``findings_file`` the first screen as plain text (:func:`findings_text`)."""
    records = [load_record(p, "configuration") for p in configurations]
    samples = {r.configuration: read_samples(p) for r, p in zip(records, telemetry, strict=False) if Path(p).exists()}
    context = build_context(
        trial=trial,
        preflight=load_record(preflight, "preflight"),
        manifest=load_record(manifest, "manifest"),
        plans=[load_record(p, "plan") for p in plans],
        configurations=records,
        cleanup=load_record(cleanup, "cleanup"),
        patches=load_record(patches, "patches") if patches is not None else None,
        quiet=load_record(quiet, "quiet") if quiet is not None else None,
        telemetry=samples,
        settings=settings,
        provenance=load_record(provenance, "provenance") if provenance is not None else None,
        statistics=statistics,
    )
    if charts_dir is not None:
        write_charts(Path(charts_dir), [*context.charts, *(chart for _sw, chart in context.sweeps if chart)])
    if findings_file is not None:
        atomic_write_text(Path(findings_file), findings_text(context))
    return atomic_write_text(out, render_report(context))


def write_charts(folder: Path, items: Iterable[charts.Chart]) -> list[Path]:
    """Each chart as a standalone SVG file, the folder emptied of older charts first."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.svg"):
        old.unlink()
    return [atomic_write_text(folder / f"{c.name}.svg", c.svg) for c in items]


def gpu_report(configurations: Sequence[ConfigurationRecord], cleanup: CleanupRecord) -> GpuSection | None:
    """The report's GPUs section: per configuration, what the census found before launch and
    each GPU's health after a failure; the GPUs cleanup still holds; one finding sentence per
    fact an auditor must see. None when no configuration had a GPU to look at."""
    rows = [GpuLook(r.configuration, r.gpu_census, r.gpu_health)
            for r in configurations if (r.gpu_census and r.gpu_census.gpus) or r.gpu_health]
    if not rows:
        return None
    sentences = []
    for row in rows:
        census_, health = row.census, row.health
        if census_ and census_.foreign:
            sentences.append(f"{row.configuration} was not launched: " + "; ".join(
                describe_process(GpuProcess.model_validate(p)) for p in census_.foreign) + " computed on a selected GPU.")
        allowed = [p for p in (census_.processes if census_ else []) if p.allowed_by]
        if allowed:
            sentences.append(f"{row.configuration} shared its GPUs with " + "; ".join(
                f"{describe_process(p)}, allowed as {p.allowed_by}" for p in allowed) + ".")
        for gpu in (health.gpus if health else None) or []:
            if gpu.healthy is False:
                sentences.append(f"After {row.configuration} failed, {gpu_label(gpu.index, gpu.uuid)} failed its health "
                                 f"check: {gpu.evidence}.")
    for held in cleanup.gpus_held:
        sentences.append(f"Cleanup still holds GPU {held.gpu} as failed, so the services on it were not started.")
    return GpuSection(rows=rows, sentences=sentences, held=list(cleanup.gpus_held))
