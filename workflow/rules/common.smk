# Config loading, validation and target helpers. No rules here.

import re
from pathlib import Path

from llmtrial.cleanup import LEDGER_NAME, HostNotRestored, run_cleanup, unfinished
from llmtrial.ledger import Ledger
from llmtrial.config import (
    configuration_port,
    configuration_spec,
    scenario_contexts,
    validate_config,
)
from llmtrial.records import write_record


validate_config(
    config, Path(workflow.current_basedir) / ".." / "schemas" / "config.schema.yaml"
)

TRIAL = config["trial"]
CONFIGURATIONS = list(config["configurations"])


wildcard_constraints:
    trial=re.escape(TRIAL),
    configuration="|".join(re.escape(name) for name in CONFIGURATIONS),


def results_dir():
    return Path("results") / TRIAL


def report_path():
    return str(results_dir() / "report.html")


def ledger_path(wildcards):
    return str(results_dir() / "ledger.jsonl")


def staging_path(wildcards):
    return str(Path(config["staging_dir"]) / TRIAL / config["model"]["name"])


def configuration_records(wildcards):
    return expand(
        rules.trial.output.record, trial=TRIAL, configuration=CONFIGURATIONS
    )


def configuration_plans(wildcards):
    return expand(rules.plan.output.record, trial=TRIAL, configuration=CONFIGURATIONS)


def configuration_params(wildcards):
    """Only this configuration's settings: editing another one does not rerun this."""
    return configuration_spec(config, wildcards.configuration)


def trial_ports():
    return [configuration_port(config, name) for name in CONFIGURATIONS]


def cleanup_on_error():
    record = run_cleanup(
        results_dir(), ports=trial_ports(), host=config["serving"]["host"]
    )
    write_record(results_dir() / "cleanup" / "on-error.json", record)
    state = "restored" if record["restored"] else f"NOT restored: {record['residues']}"
    print(f"llmtrial cleanup after error: host {state}")


def cleanup_if_unfinished():
    """After a successful run: give back what a partial run left changed, and fail the
    run when the host could not be fully restored."""
    entries = Ledger(results_dir() / LEDGER_NAME).entries()
    if unfinished(entries):
        record = run_cleanup(
            results_dir(), ports=trial_ports(), host=config["serving"]["host"]
        )
        write_record(results_dir() / "cleanup" / "on-success.json", record)
        restored = record["restored"]
        residues = record["residues"]
    else:
        done = [e for e in entries if e.get("action") == "cleanup_done"]
        restored = not done or done[-1].get("restored", True)
        residues = done[-1].get("residues") if done else 0
    if not restored:
        raise HostNotRestored(
            f"the host was not fully restored ({residues} residue(s)); see "
            f"{results_dir() / 'cleanup'} and the report, fix them, then run `snakemake cleanup`"
        )
