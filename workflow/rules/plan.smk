# Will it fit? One plan per configuration, so editing one configuration replans only it.
rule plan:
    input:
        preflight=rules.preflight.output.record,
    output:
        record=report(
            str(P.plan()),
            caption="../report/plan.rst",
            category="Records",
            subcategory="{configuration}",
            labels={"configuration": "{configuration}", "record": "plan"},
        ),
    log:
        str(P.log("plan/{configuration}")),
    priority: 10
    resources:
        **host_resources("plan"),
    conda:
        "../../envs/workflow.yaml"
    params:
        spec=configuration_params,
        source=config["model"]["source"],
        hardware=config["hardware"],
        settings=config["plan"],
        contexts=scenario_contexts(TRIAL_CONFIG),
        archive_dir=config["model"]["weights"]["archive_dir"],
    script:
        "../scripts/plan_configuration.py"
