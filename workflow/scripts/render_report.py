"""Render results/<trial>/report.html from the records."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.joblog import open_job_log
from llmtrial.report import write_report

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
write_report(
    Path(snakemake.output.report),
    trial=snakemake.wildcards.trial,
    preflight=Path(snakemake.input.preflight),
    manifest=Path(snakemake.input.manifest),
    plans=[Path(p) for p in snakemake.input.plans],
    configurations=[Path(p) for p in snakemake.input.records],
    telemetry=[Path(p) for p in snakemake.input.telemetry],
    cleanup=Path(snakemake.input.cleanup),
    patches=Path(snakemake.input.patches),
    quiet=Path(snakemake.input.quiet),
    settings=snakemake.params.settings,
    charts_dir=Path(snakemake.output.charts),
)
