# After every configuration: stop anything the trial left running, check its ports.
rule cleanup_trial:
    input:
        records=configuration_records,
    output:
        record="results/{trial}/cleanup/record.json",
    log:
        "results/{trial}/logs/cleanup.log",
    conda:
        "../../envs/workflow.yaml"
    params:
        results=str(results_dir()),
        ports=trial_ports(),
        host=config["serving"]["host"],
    script:
        "../scripts/cleanup.py"


# On demand, after a crash or kill -9: `snakemake cleanup` (runs no trial first).
rule cleanup:
    log:
        str(results_dir() / "logs" / "cleanup-on-demand.log"),
    conda:
        "../../envs/workflow.yaml"
    params:
        results=str(results_dir()),
        ports=trial_ports(),
        host=config["serving"]["host"],
    script:
        "../scripts/cleanup.py"
