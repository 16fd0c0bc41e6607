"""Stage the operator's prompt files into results/<trial>/prompts/ and write their record."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.core.joblog import open_job_log
from llmtrial.core.records import write_record
from llmtrial.core.trial_config import ScenarioBlock
from llmtrial.serve.datasets import stage_prompts

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
# each scenario's dataset and prompt file (the rule's params name only these)
scenarios = {name: ScenarioBlock.model_validate(spec) for name, spec in snakemake.params.scenarios.items()}
staged = stage_prompts(scenarios, Path(snakemake.params.folder))
write_record(snakemake.output.record, staged, schema="prompts")
