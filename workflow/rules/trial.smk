# One job per serving configuration: start vLLM, cold start, scenarios, stop.
rule trial:
    input:
        manifest=rules.stage_model.output.manifest,
        # the staged prompt files' record, when a scenario reads one
        prompts=prompts_record,
        plan=rules.plan.output.record,
        # the kernel log's baseline, which a GPU health check after a failure compares with
        preflight=rules.preflight.output.record,
        # existence, not age: the job re-quiets the host itself when a cleanup gave it back
        quieted=ancient(rules.quiet.output.record),
        # likewise: the job applies the patches again itself when a cleanup reverted them
        patched=ancient(rules.patch.output.record),
    # both are written whatever the outcome (ok, failed or skipped): the job exits 0
    output:
        record=report(
            str(P.config_record()),
            caption="../report/configuration.rst",
            category="Records",
            subcategory="{configuration}",
            labels={"configuration": "{configuration}", "record": "outcome"},
        ),
        telemetry=report(
            str(P.telemetry()),
            caption="../report/telemetry.rst",
            category="Telemetry",
            labels={"configuration": "{configuration}"},
        ),
    log:
        job=str(P.log("trial/{configuration}")),
        server=str(P.server_log()),
    conda:
        "../../envs/serving.yaml"
    resources:
        serving=1,
        **host_resources("trial"),
    params:
        spec=configuration_params,
        confirm_against=confirm_params,
        served_model_name=config["model"]["name"],
        scenarios=config["scenarios"],
        bench=config["bench"],
        cold_start=config["cold_start"],
        telemetry=config["telemetry"],
        statistics=config["statistics"],
        outputs=config["outputs"],
        tasks=task_params(config),
        services=services_on_nodes(TRIAL_CONFIG),
        results=str(TRIAL_PATHS.root),
        patches=config["patches"],
        hardware=config["hardware"],
    script:
        "../scripts/run_trial.py"
