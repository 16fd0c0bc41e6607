# One job per serving configuration: start vLLM, cold start, scenarios, stop.
rule trial:
    input:
        manifest=rules.stage_model.output.manifest,
        plan=rules.plan.output.record,
        # existence, not age: the job re-quiets the host itself when a cleanup gave it back
        quieted=ancient(rules.quiet.output.record),
        # likewise: the job applies the patches again itself when a cleanup reverted them
        patched=ancient(rules.patch.output.record),
    output:
        record="results/{trial}/configs/{configuration}/record.json",
        telemetry="results/{trial}/configs/{configuration}/telemetry.csv",
    log:
        job="results/{trial}/logs/trial/{configuration}.log",
        server="results/{trial}/configs/{configuration}/server.log",
    conda:
        "../../envs/serving.yaml"
    resources:
        serving=1,
    params:
        spec=configuration_params,
        served_model_name=config["model"]["name"],
        scenarios=config["scenarios"],
        bench=config["bench"],
        cold_start=config["cold_start"],
        telemetry=config["telemetry"],
        services=config["services"],
        ledger=ledger_path,
        patches=config["patches"],
    script:
        "../scripts/run_trial.py"
