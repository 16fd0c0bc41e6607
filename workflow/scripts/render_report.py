"""Render results/<trial>/report.html from the records."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial import provenance
from llmtrial.core.joblog import open_job_log
from llmtrial.core.records import load_record, write_record
from llmtrial.core.trial_config import ReportBlock, StatisticsBlock
from llmtrial.report.render import write_report

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
# what produced this report: the checkout this script is part of, the trial files, the command
prompts = [load_record(p, "prompts") for p in snakemake.input.prompts]  # none without a prompt file
produced_by = provenance.collect(snakemake.config, configfiles=snakemake.params.configfiles,
                                 command=provenance.command_from_env(), repo=Path(snakemake.scriptdir).parents[1],
                                 prompts=prompts[0] if prompts else None)
write_record(snakemake.output.provenance, produced_by, schema="provenance")
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
    settings=ReportBlock.model_validate(snakemake.params.settings),
    statistics=StatisticsBlock.model_validate(snakemake.params.statistics),
    provenance=Path(snakemake.output.provenance),
    charts_dir=Path(snakemake.output.charts),
    findings_file=Path(snakemake.output.findings),
)
