# llmtrial: reproducible serving trials of LLMs with vLLM.
# This file is the table of contents; the stages live in workflow/rules/.

from snakemake.utils import min_version

min_version("9.0")


# ---- configuration (validated against llmtrial/schemas/config.schema.yaml in common.smk)
# A trial file given with --configfile is the whole trial; the default trial is read only
# when none is given (a `configfile:` here would be merged under the given file instead).
if not workflow.config_settings.configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


# ---- `snakemake --report`: the records, telemetry and report.html with the rule graph and runtimes
report: "workflow/report/workflow.rst"


# ---- stages, in the order data flows
include: "workflow/rules/preflight.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/services.smk"
include: "workflow/rules/patch.smk"
include: "workflow/rules/trial.smk"
include: "workflow/rules/cleanup.smk"
include: "workflow/rules/report.smk"


# ---- where jobs run under a cluster profile (profiles/slurm): the host group (preflight to the
# trial's cleanup, one allocation on one node; the profile's `groups`) on the node, these where
# snakemake runs. Locally every rule runs here either way.
localrules:
    all,
    stage_prompts,
    report,
    export,
    compare,
    cleanup,


# ---- target: the report (which needs every configuration and the cleanup), the exports beside it, and the comparison
# with an earlier trial when the trial file names one (`compare_with:`)
rule all:
    default_target: True
    input:
        trial_targets(),


# ---- the host is always given back: after a failed job, and after a run that left it changed
onsuccess:
    cleanup_if_unfinished()


onerror:
    cleanup_on_error()
