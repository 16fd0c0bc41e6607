rule report:
    input:
        preflight=rules.preflight.output.record,
        manifest=rules.stage_model.output.manifest,
        patches=rules.patch.output.record,
        plans=configuration_plans,
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
