"""Stage the model's weights outside results/, copy them to the trial's other nodes, write their manifest."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.core.joblog import open_job_log
from llmtrial.core.ledger import Ledger
from llmtrial.core.records import write_record
from llmtrial.core.trial_config import DiskBlock, SourceBlock, WeightsBlock
from llmtrial.weights.node_weights import stage_on_nodes
from llmtrial.weights.staging import stage_model

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log[0], echo=("llmtrial.weights",))  # download, conversion and hashing on the terminal too
ledger = Ledger(snakemake.params.ledger)
weights = WeightsBlock.model_validate(snakemake.params.weights)
manifest = stage_model(SourceBlock.model_validate(snakemake.params.source), Path(snakemake.params.staging), ledger=ledger,
                       root=Path(snakemake.params.root), weights=weights, disk=DiskBlock.model_validate(snakemake.params.disk))
manifest = stage_on_nodes(manifest, snakemake.params.nodes, ledger=ledger, trial=snakemake.params.trial,
                          model_name=snakemake.params.model, weights=weights)
write_record(snakemake.output.manifest, manifest, schema="manifest")
