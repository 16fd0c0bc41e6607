"""Plan one serving configuration before it is launched."""

from typing import TYPE_CHECKING

from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.core.joblog import open_job_log
from llmtrial.core.records import load_record, write_record
from llmtrial.core.trial_config import HardwareBlock, PlanBlock, SourceBlock
from llmtrial.core.vllm_install import recorded_vllm
from llmtrial.plan.planner import plan_record
from llmtrial.weights.model_source import model_config_for, planned_weights

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
source, archive_dir = SourceBlock.model_validate(snakemake.params.source), snakemake.params.archive_dir
preflight = load_record(snakemake.input.preflight, "preflight")
environment = preflight.environment
record = plan_record(
    spec=ConfigurationSpec.model_validate(snakemake.params.spec),
    model_config=model_config_for(source, archive_dir=archive_dir),
    weights=planned_weights(source, archive_dir),
    gpus=environment.gpus,
    vllm_version=recorded_vllm(environment.key_packages),
    hardware=HardwareBlock.model_validate(snakemake.params.hardware),
    settings=PlanBlock.model_validate(snakemake.params.settings),
    contexts=list(snakemake.params.contexts),
    no_config=f"the model's config.json could not be had before staging (source kind {source.kind!r}; "
              "see the plan's log)",
    probes=preflight.probes,
)
write_record(snakemake.output.record, record, schema="plan")
