# After every configuration: stop anything the trial left running, check its ports.
rule cleanup_trial:
    input:
        records=configuration_records,
    output:
        record=report(
            str(P.cleanup),
            caption="../report/cleanup.rst",
            category="Records",
            subcategory="Trial",
            labels={"stage": "6 cleanup", "record": "host given back"},
        ),
    log:
        str(P.log("cleanup")),
    resources:
        **host_resources("cleanup_trial"),
    conda:
        "../../envs/workflow.yaml"
    params:
        results=str(TRIAL_PATHS.root),
        ports=trial_ports(),
        host=config["serving"]["host"],
        submit=cleanup_submit(TRIAL_CONFIG),
    script:
        "../scripts/cleanup.py"


# On demand, after a crash or kill -9: `snakemake cleanup` (runs no trial first). It runs where
# snakemake runs (a local rule under SLURM too) and sends the cleanup to the node the ledger names.
rule cleanup:
    log:
        str(TRIAL_PATHS.log("cleanup-on-demand")),
    conda:
        "../../envs/workflow.yaml"
    params:
        results=str(TRIAL_PATHS.root),
        ports=trial_ports(),
        host=config["serving"]["host"],
        submit=cleanup_submit(TRIAL_CONFIG),
    script:
        "../scripts/cleanup.py"
