rule report:
    input:
        preflight=rules.preflight.output.record,
        manifest=rules.stage_model.output.manifest,
        quiet=rules.quiet.output.record,
        patches=rules.patch.output.record,
        plans=configuration_plans,
        records=configuration_records,
        telemetry=configuration_telemetry,
        cleanup=rules.cleanup_trial.output.record,
        prompts=prompts_record,
    output:
        report=report(
            str(P.report),
            caption="../report/report.rst",
            category="Report",
            labels={"trial": "{trial}", "file": "report.html"},
        ),
        charts=report(
            directory(str(P.charts)),
            patterns=["{name}.svg"],
            caption="../report/chart.rst",
            category="Charts",
            labels={"chart": "{name}"},
        ),
        findings=str(P.findings),
        provenance=report(
            str(P.provenance),
            caption="../report/provenance.rst",
            category="Records",
            subcategory="Trial",
            labels={"record": "provenance"},
        ),
    log:
        str(P.log("report")),
    conda:
        "../../envs/workflow.yaml"
    params:
        settings=config["report"],
        statistics=config["statistics"],
        # the price is read back from the provenance record; as a param, a new price reruns the report
        cost=config["cost"],
        configfiles=workflow.configfiles,
    script:
        "../scripts/render_report.py"


# ---- this trial against an earlier one (`compare_with:` in the trial file): written under this trial's folder
rule compare:
    input:
        report=str(P.report),
        earlier=ancient(str(Path(config["compare_with"] or ".") / "provenance.json")),
    output:
        record=str(P.root / "comparison" / compare_name() / "comparison.json"),
        page=str(P.root / "comparison" / compare_name() / "comparison.html"),
    log:
        str(P.log("compare")),
    conda:
        "../../envs/workflow.yaml"
    params:
        earlier=config["compare_with"],
    script:
        "../scripts/compare_trials.py"


# ---- the records in other tools' formats (llmtrial.export): llm-d's Benchmark Report v0.2 per configuration
# x scenario, under exports/benchmark-report-v0.2/; read from the records alone, as the report is
rule export:
    input:
        provenance=rules.report.output.provenance,
        preflight=rules.preflight.output.record,
        manifest=rules.stage_model.output.manifest,
        plans=configuration_plans,
        records=configuration_records,
    output:
        exports=directory(str(P.exports)),
    log:
        str(P.log("export")),
    conda:
        "../../envs/workflow.yaml"
    script:
        "../scripts/export_reports.py"
