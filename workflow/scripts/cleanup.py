"""Give the host back from the ledger; write the cleanup record when the rule has one."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.cleanup import run_cleanup
from llmtrial.joblog import open_job_log
from llmtrial.records import write_record

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
results = Path(snakemake.params.results)
record = run_cleanup(results, ports=snakemake.params.ports, host=snakemake.params.host)
target = snakemake.output.get("record", results / "cleanup" / "on-demand.json")
write_record(target, record)
