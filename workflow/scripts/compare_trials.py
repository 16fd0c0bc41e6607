"""This trial against the earlier one its trial file names (compare_with): the comparison record and page."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.compare.comparison import compare_trials
from llmtrial.compare.page import write_comparison
from llmtrial.core.joblog import open_job_log

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
record = compare_trials(snakemake.params.earlier, Path(snakemake.input.report).parent)
write_comparison(record, Path(snakemake.output.record).parent)
for line in record.sentences:
    print(line)
