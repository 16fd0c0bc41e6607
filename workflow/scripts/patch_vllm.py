"""Patch vLLM as the trial asks (reverting first what an earlier run left patched)."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.joblog import open_job_log
from llmtrial.ledger import Ledger
from llmtrial.patching import apply_patches
from llmtrial.paths import TrialPaths
from llmtrial.records import write_record

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
paths = TrialPaths(Path(snakemake.params.results))
record = apply_patches(dict(snakemake.params.patches), ledger=Ledger(paths.ledger), work_dir=paths.patches)
write_record(snakemake.output.record, record, schema="patches")
