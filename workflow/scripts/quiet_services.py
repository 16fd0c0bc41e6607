"""Quiet the host's services (restoring first what an earlier run left changed)."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.cleanup import restore_first
from llmtrial.joblog import open_job_log
from llmtrial.records import write_record
from llmtrial.services import quiet_host

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
results = Path(snakemake.params.results)
restored = restore_first(results, ports=snakemake.params.ports, host=snakemake.params.host)
record = quiet_host(results, dict(snakemake.params.services), restored_first=restored)
write_record(snakemake.output.record, record, schema="quiet")
