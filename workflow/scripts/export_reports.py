"""Write results/<trial>/exports/ from the records (llm-d's Benchmark Report v0.2 per configuration x scenario)."""

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.core.joblog import open_job_log
from llmtrial.export.exports import export_trial

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
for line in export_trial(Path(snakemake.input.provenance).parent, snakemake.output.exports):
    logging.getLogger("llmtrial.export").info(line)
