"""Quiet the host's services (restoring first what an earlier run left changed)."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.core.joblog import open_job_log
from llmtrial.core.records import write_record
from llmtrial.lifecycle.readiness import quiet

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
results = Path(snakemake.params.results)
record = quiet(results, snakemake.params.services, ports=snakemake.params.ports, host=snakemake.params.host)
write_record(snakemake.output.record, record, schema="quiet")
