"""Patch vLLM as the trial asks (reverting first what an earlier run left patched)."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.core.joblog import open_job_log
from llmtrial.core.ledger import Ledger
from llmtrial.core.paths import TrialPaths
from llmtrial.core.records import write_record
from llmtrial.core.trial_config import PatchBlock
from llmtrial.patch.patching import apply_patches

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
paths = TrialPaths(Path(snakemake.params.results))
patches = {name: PatchBlock.model_validate(block) for name, block in snakemake.params.patches.items()}
record = apply_patches(patches, ledger=Ledger(paths.ledger), work_dir=paths.patches)
write_record(snakemake.output.record, record, schema="patches")
