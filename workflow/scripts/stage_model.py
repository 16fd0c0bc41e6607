"""Stage the model's weights outside results/ and write their manifest."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.joblog import open_job_log
from llmtrial.ledger import Ledger
from llmtrial.records import write_record
from llmtrial.staging import stage_model

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0], echo=("llmtrial.hub",))  # download progress on the terminal too
manifest = stage_model(snakemake.params.source, Path(snakemake.params.staging), ledger=Ledger(snakemake.params.ledger),
                       root=Path(snakemake.params.root), weights=snakemake.params.weights, disk=snakemake.params.disk)
write_record(snakemake.output.manifest, manifest, schema="manifest")
