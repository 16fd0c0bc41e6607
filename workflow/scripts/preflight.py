"""Record the environment the trial runs on."""

from typing import TYPE_CHECKING

from llmtrial.joblog import open_job_log
from llmtrial.preflight import environment_record
from llmtrial.records import write_record

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
write_record(snakemake.output.environment, environment_record())
