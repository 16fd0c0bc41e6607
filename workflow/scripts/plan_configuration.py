"""Plan one serving configuration before it is launched."""

from typing import TYPE_CHECKING

from llmtrial.joblog import open_job_log
from llmtrial.preflight import plan_record
from llmtrial.records import read_record, write_record

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
record = plan_record(
    spec=snakemake.params.spec,
    source=snakemake.params.source,
    environment=read_record(snakemake.input.preflight)["environment"],
    hardware=snakemake.params.hardware,
    plan_settings=snakemake.params.settings,
    contexts=list(snakemake.params.contexts),
    archive_dir=snakemake.params.archive_dir,
)
write_record(snakemake.output.record, record, schema="plan")
