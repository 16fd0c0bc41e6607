# Config loading, validation and target helpers. No rules here.

import atexit
import json
import os
import re
import sys
import time
from pathlib import Path

from llmtrial.lifecycle.cleanup import cleanup_with_record, give_back_before_allocation_ends, host_lines, restore_after_run
from llmtrial.core.hostlock import LOCK_ENV, PID_ENV, PID_HOST_ENV, RUN_LOCK_ENV, WAIT_ENV, this_host
from llmtrial.core.ledger import NODE_ENV, RUN_ENV, new_run_id
from llmtrial.host.nodes import spanned_nodes, this_node_name
from llmtrial.host.services import services_on_nodes
from llmtrial.host.slurm_hosts import cap_status_checks, in_batch_step, remember_allocation
from llmtrial.patch.patchdata import patch_inputs
from llmtrial.plan.allocation import cleanup_submit, rule_resources
from llmtrial.provenance import COMMAND_ENV
from llmtrial.report.run_summary import run_summary
from llmtrial.serve.datasets import file_scenarios
from llmtrial.core.paths import TrialPaths
from llmtrial.config import (
    configuration_port,
    configuration_spec,
    scenario_contexts,
    check_config,
    task_params,
)


# The trial file as its model (llmtrial.core.trial_config.TrialConfig), built once; `config` gets its defaults
# in place, so a rule's params read the same values as plain data.
TRIAL_CONFIG = check_config(config)

# This invocation is one run: every ledger entry its jobs, onerror and onsuccess write carries
# this id. Jobs inherit it from the environment (never through params, which would make every
# job's params differ from the last run's).
RUN = os.environ.setdefault(RUN_ENV, new_run_id())
# When this snakemake started: the run's closing lines name the report only when this run rendered it.
RUN_STARTED = time.time()
# The trial's name for this host (its first local node, or "local"): every ledger entry of this
# run names it, as entries of the other nodes name theirs.
os.environ[NODE_ENV] = this_node_name(TRIAL_CONFIG)
# The command line that started this run, for the provenance record (llmtrial.provenance
# .command_from_env reads it back in a job; secrets are redacted when it is recorded).
os.environ.setdefault(COMMAND_ENV, json.dumps(sys.argv))
# The host's lock (llmtrial.core.hostlock): the first change a job writes to the ledger takes it for
# this run, held by this snakemake's pid; LLMTRIAL_HOST_LOCK names the file in place of host_lock.path.
os.environ[RUN_LOCK_ENV] = os.environ.get(LOCK_ENV) or TRIAL_CONFIG.host_lock.path
os.environ[WAIT_ENV] = str(TRIAL_CONFIG.host_lock.wait_s)
os.environ.setdefault(PID_ENV, str(os.getpid()))
os.environ.setdefault(PID_HOST_ENV, this_host())

TRIAL = TRIAL_CONFIG.trial
CONFIGURATIONS = list(TRIAL_CONFIG.configurations)


wildcard_constraints:
    trial=re.escape(TRIAL),
    configuration="|".join(re.escape(name) for name in CONFIGURATIONS),


#: Every path under results/<trial>/: P with the {trial} wildcard for rules, TRIAL_PATHS for this trial.
P = TrialPaths.pattern()
TRIAL_PATHS = TrialPaths.of(TRIAL)


def report_path():
    return str(TRIAL_PATHS.report)


def compare_name():
    """The folder under comparison/ for the earlier trial of `compare_with` (its results folder's name)."""
    earlier = Path(TRIAL_CONFIG.compare_with or "none")
    return earlier.name if earlier.name != TRIAL else f"{earlier.name}-earlier"


def trial_targets():
    """What `snakemake` builds: the report, the exports (llmtrial.export), and the comparison with the earlier
    trial when `compare_with` names one."""
    targets = [report_path(), str(TRIAL_PATHS.exports)]
    if TRIAL_CONFIG.compare_with:
        targets.append(str(TRIAL_PATHS.root / "comparison" / compare_name() / "comparison.html"))
    return targets


def ledger_path(wildcards):
    return str(TRIAL_PATHS.ledger)


def staging_root(wildcards):
    """The trial's own staging folder: cleanup never deletes anything outside it."""
    return str(Path(TRIAL_CONFIG.staging_dir) / TRIAL)


def staging_path(wildcards):
    return str(Path(staging_root(wildcards)) / TRIAL_CONFIG.model.name)


def patch_files(wildcards):
    """The files of every enabled patch (an unknown patch name fails here, before any job)."""
    return patch_inputs(config["patches"])


def prompt_scenarios():
    """The scenarios that read the operator's prompt file, with their dataset and file only (the
    stage_prompts rule's params: editing another scenario does not stage the files again)."""
    return {name: {"dataset": spec.dataset, "prompts": spec.prompts}
            for name, spec in file_scenarios(TRIAL_CONFIG.scenarios).items()}


def prompt_files():
    return [spec["prompts"] for spec in prompt_scenarios().values()]


def prompts_record(wildcards):
    """The staged prompt files' record, when a scenario reads one (nothing otherwise)."""
    return [str(TRIAL_PATHS.prompts_record)] if prompt_scenarios() else []


def configuration_records(wildcards):
    return expand(
        rules.trial.output.record, trial=TRIAL, configuration=CONFIGURATIONS
    )


def configuration_telemetry(wildcards):
    return expand(
        rules.trial.output.telemetry, trial=TRIAL, configuration=CONFIGURATIONS
    )


def configuration_plans(wildcards):
    return expand(rules.plan.output.record, trial=TRIAL, configuration=CONFIGURATIONS)


def configuration_params(wildcards):
    """Only this configuration's settings: editing another one does not rerun this."""
    return configuration_spec(TRIAL_CONFIG, wildcards.configuration).model_dump(mode="json", exclude_none=True)


def confirm_params(wildcards):
    """With failures.confirm, every other configuration's spec, which a failed one may be relaunched
    against (editing one then reruns the others); without it, nothing."""
    if not TRIAL_CONFIG.failures.confirm:
        return {}
    return {name: configuration_spec(TRIAL_CONFIG, name).model_dump(mode="json", exclude_none=True)
            for name in CONFIGURATIONS if name != wildcards.configuration}


def host_resources(rule_name):
    """What a host stage asks of SLURM under profiles/slurm, from the trial file's `slurm` key
    (llmtrial.plan.allocation); nothing that limits a local run."""
    return rule_resources(TRIAL_CONFIG, rule_name)


def trial_ports():
    return [configuration_port(TRIAL_CONFIG, name) for name in CONFIGURATIONS]


def cleanup_on_error():
    record = cleanup_with_record(
        TRIAL_PATHS.root,
        TRIAL_PATHS.cleanup_on_error,
        ports=trial_ports(),
        host=config["serving"]["host"],
        submit=cleanup_submit(TRIAL_CONFIG),
    )
    for line in host_lines(TRIAL_PATHS.root, record):
        print(f"llmtrial cleanup after error: {line}")


def cleanup_at_allocation_end():
    record = give_back_before_allocation_ends(TRIAL_PATHS.root, ports=trial_ports(), host=config["serving"]["host"],
                                              submit=cleanup_submit(TRIAL_CONFIG))
    if record is not None:
        for line in host_lines(TRIAL_PATHS.root, record):
            print(f"llmtrial cleanup at the allocation's end: {line}", file=sys.stderr)


# Snakemake imports every installed executor plugin before it reads the workflow: the SLURM executor's
# wait between status checks is capped (llmtrial.host.slurm_hosts.cap_status_checks) so that the login side
# notices a trial's end within 20 s, not up to 3 minutes later.
if "snakemake_executor_plugin_slurm" in sys.modules:
    cap_status_checks(sys.modules["snakemake_executor_plugin_slurm"].Executor)


# Under SLURM the host group's snakemake runs in the allocation's batch script with no hooks
# (onerror runs on the submitting side, after the allocation ended): the node is given back before
# the allocation ends, so that no cleanup queues behind the next trial's allocation.
if workflow.remote_exec and in_batch_step():
    atexit.register(cleanup_at_allocation_end)
    remember_allocation()  # the group's steps see one node in SLURM_JOB_NODELIST


def cleanup_if_unfinished():
    """After a successful run: give back what a partial run left, then say where the report is,
    what it found and whether the host was restored."""
    record = None
    try:
        record = restore_after_run(TRIAL_PATHS.root, ports=trial_ports(), host=config["serving"]["host"],
                                   submit=cleanup_submit(TRIAL_CONFIG))
    finally:
        for line in run_summary(TRIAL_PATHS.root, since=RUN_STARTED, cleanup=record):
            print(f"llmtrial: {line}")
