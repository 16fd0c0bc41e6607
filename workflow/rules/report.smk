rule report:
    input:
        preflight=rules.preflight.output.record,
        manifest=rules.stage_model.output.manifest,
        patches=rules.patch.output.record,
        plans=configuration_plans,
        records=configuration_records,
        cleanup=rules.cleanup_trial.output.record,
    output:
        report=str(P.report),
    log:
        str(P.log("report")),
    conda:
        "../../envs/workflow.yaml"
    script:
        "../scripts/render_report.py"
