"""Record the environment, the host checks and the cross-node checks; stop the trial when one must."""

from typing import TYPE_CHECKING

from llmtrial.core.joblog import open_job_log
from llmtrial.core.records import write_record
from llmtrial.core.trial_config import DiskBlock, HardwareBlock, ProbesBlock, SourceBlock
from llmtrial.lifecycle.preflight import run_preflight

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0])
record = run_preflight(source=SourceBlock.model_validate(snakemake.params.source), staging_dir=snakemake.params.staging,
                       disk=DiskBlock.model_validate(snakemake.params.disk), nodes=snakemake.params.nodes,
                       hardware=HardwareBlock.model_validate(snakemake.params.hardware),
                       probes=ProbesBlock.model_validate(snakemake.params.probes))
write_record(snakemake.output.record, record, schema="preflight")
