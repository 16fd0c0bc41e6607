"""Give the host back from the ledger; write the cleanup record when the rule has one."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.core.joblog import open_job_log
from llmtrial.lifecycle.cleanup import cleanup_with_record

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
# the trial's cleanup rule names its record; on demand (`snakemake cleanup`) it is on-demand.json;
# both apply the staged weights' policy
cleanup_with_record(Path(snakemake.params.results), snakemake.output.get("record"),
                    ports=snakemake.params.ports, host=snakemake.params.host, weights=True,
                    submit=snakemake.params.submit)
