"""One serving configuration: serve, measure, stop; the outcome is always a record."""

from pathlib import Path
from typing import TYPE_CHECKING

from llmtrial.core.answers_model import Task
from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.core.joblog import open_job_log
from llmtrial.core.paths import JobPaths, TrialPaths
from llmtrial.core.records import load_record
from llmtrial.core.trial_config import BenchBlock, ColdStartBlock, HardwareBlock, OutputsBlock, PatchBlock, ScenarioBlock
from llmtrial.host.nodes import spec_nodes
from llmtrial.serve.datasets import with_staged
from llmtrial.serve.measure import Workload
from llmtrial.serve.trial import TrialJob

if TYPE_CHECKING:  # Snakemake injects `snakemake` when it runs the script
    from snakemake.iocontainers import snakemake

open_job_log(snakemake.log.job)
spec = ConfigurationSpec.model_validate(snakemake.params.spec)
kernel_log = load_record(snakemake.input.preflight, "preflight").kernel_log  # the baseline a crash is read against
scenarios = {name: ScenarioBlock.model_validate(block) for name, block in snakemake.params.scenarios.items()}
TrialJob(
    trial=snakemake.wildcards.trial,
    spec=spec,
    manifest=load_record(snakemake.input.manifest, "manifest"),
    plan=load_record(snakemake.input.plan, "plan"),
    services=snakemake.params.services,
    workload=Workload(served_model_name=snakemake.params.served_model_name,
                      # a prompt file's scenario reads its staged copy, checked against the prompts record
                      scenarios=with_staged(scenarios, *(load_record(p, "prompts") for p in snakemake.input.prompts)),
                      bench_settings=BenchBlock.model_validate(snakemake.params.bench),
                      cold_start=ColdStartBlock.model_validate(snakemake.params.cold_start),
                      telemetry_interval=float(snakemake.params.telemetry["interval_s"]),
                      level=float(snakemake.params.statistics["level"]), outputs=OutputsBlock.model_validate(snakemake.params.outputs) if snakemake.params.outputs else None,
                      tasks=tuple(Task.model_validate(t) for t in snakemake.params.tasks)),
    paths=JobPaths(TrialPaths(Path(snakemake.params.results)), snakemake.wildcards.configuration),
    patches={name: PatchBlock.model_validate(block) for name, block in snakemake.params.patches.items()},
    nodes=spec_nodes(spec),
    hardware=HardwareBlock.model_validate(snakemake.params.hardware),
    kernel_baseline=kernel_log.lines if kernel_log is not None else [],
    confirm_against={name: ConfigurationSpec.model_validate(other)
                     for name, other in snakemake.params.confirm_against.items()},
).run()
