"""A trial's results folder exported: every configuration x scenario (a sweep: every step) that ran, as a
Benchmark Report v0.2 in ``<out>/benchmark-report-v0.2/<configuration>/<scenario>.json`` (``<scenario>-step<N>``
for a sweep's step), ``<out>`` being ``results/<trial>/exports`` unless given.

Every report is built and validated before any file is written, so an export that fails leaves the
folder as it was; the error names the record or the field at fault. A configuration the planner rejected,
or one that failed before any scenario ran, has no report: :func:`export_trial` says why in its lines.
Files of an earlier export that this one does not write again (a configuration since removed) are removed,
and the folders they leave empty; the format's folder itself is always there, empty when nothing ran.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmd_benchmark_report.schema_v0_2 import BenchmarkReportV02

from llmtrial.compare.trials import TrialResults
from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.paths import TrialPaths
from llmtrial.export.benchmark_report import ReportUnit, benchmark_report, workloads

FORMAT_DIR = "benchmark-report-v0.2"


def report_name(w: ReportUnit) -> str:
    """The report's file name: ``<scenario>.json``, or ``<scenario>-step<N>.json`` for a sweep's step."""
    return f"{w.scenario.name}" + (f"-step{w.step}" if w.step is not None else "") + ".json"


def report_json(report: BenchmarkReportV02) -> str:
    """The report as written: the fields the export set (none of them null but a flag's value under ``native``)."""
    return json.dumps(report.model_dump(mode="json", exclude_unset=True), indent=2) + "\n"


def trial_reports(trial: TrialResults) -> tuple[dict[str, BenchmarkReportV02], list[str]]:
    """Each report by its path under the format's folder, and a line for each configuration left out."""
    reports: dict[str, BenchmarkReportV02] = {}
    left_out: list[str] = []
    for name, record in trial.configurations.items():
        found = workloads(record)
        if record.status == "skipped" or not found:
            why = ("the planner rejected it and it was not launched" if record.status == "skipped"
                   else f"it {record.status} before any scenario ran")
            left_out.append(f"{name}: no Benchmark Report: {why}")
            continue
        for w in found:
            reports[f"{name}/{report_name(w)}"] = benchmark_report(trial, w)
    return reports, left_out


def export_trial(results: str | Path, out: str | Path | None = None) -> list[str]:
    """Write ``results``' reports under ``out`` (default ``results/exports``); one line per file written and
    per configuration left out. :class:`~llmtrial.compare.trials.TrialFolderError` names a missing or
    invalid record, :class:`~llmtrial.export.br_validate.ReportInvalid` a field that breaks the schema."""
    trial = TrialResults.load(results)
    folder = Path(out if out is not None else TrialPaths(Path(results)).exports) / FORMAT_DIR
    reports, left_out = trial_reports(trial)
    written = {folder / rel: report_json(report) for rel, report in reports.items()}
    folder.mkdir(parents=True, exist_ok=True)  # the rule's output even when no configuration ran a scenario
    for path, text in written.items():
        atomic_write_text(path, text)
    for stale in sorted(folder.rglob("*.json")):
        if stale not in written:
            stale.unlink()
    for empty in sorted((d for d in folder.rglob("*") if d.is_dir()), reverse=True):
        if not any(empty.iterdir()):
            empty.rmdir()
    return [f"{path}: Benchmark Report v0.2 of {path.parent.name} x {path.stem}" for path in written] + left_out
