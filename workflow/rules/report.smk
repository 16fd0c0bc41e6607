rule report:
    input:
        preflight=rules.preflight.output.record,
        manifest=rules.stage_model.output.manifest,
        patches=rules.patch.output.record,
        plans=configuration_plans,
        records=configuration_records,
        cleanup=rules.cleanup_trial.output.record,
    # the charts folder the report draws from joins these outputs (as a second report() item)
    output:
        report=report(
            str(P.report),
            caption="../report/report.rst",
            category="Report",
            labels={"trial": "{trial}", "file": "report.html"},
        ),
    log:
        str(P.log("report")),
    conda:
        "../../envs/workflow.yaml"
    script:
        "../scripts/render_report.py"
