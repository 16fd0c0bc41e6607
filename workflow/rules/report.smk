rule report:
    input:
        environment=rules.preflight.output.environment,
        manifest=rules.stage_model.output.manifest,
        records=configuration_records,
        cleanup=rules.cleanup_trial.output.record,
    output:
        report="results/{trial}/report.html",
    log:
        "results/{trial}/logs/report.log",
    conda:
        "../../envs/workflow.yaml"
    script:
        "../scripts/render_report.py"
