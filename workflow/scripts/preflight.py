"""Record the environment the trial runs on."""

from llmtrial.joblog import open_job_log
from llmtrial.preflight import environment_record
from llmtrial.records import write_record

open_job_log(snakemake.log[0])
write_record(snakemake.output.environment, environment_record())
