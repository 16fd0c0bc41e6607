# Before anything changes the host: environment, host checks, disk headroom for the weights;
# when the trial lists nodes, the cross-node checks of every node a configuration spans.
rule preflight:
    output:
        record=report(
            str(P.preflight),
            caption="../report/preflight.rst",
            category="Records",
            subcategory="Trial",
            labels={"stage": "1 preflight", "record": "environment, host checks, disk"},
        ),
    log:
        str(P.log("preflight")),
    conda:
        "../../envs/workflow.yaml"
    params:
        source=config["model"]["source"],
        staging=staging_path,
        disk=config["disk"],
        nodes=spanned_nodes(config),
        hardware=config["hardware"],
        probes=config["probes"],
    script:
        "../scripts/preflight.py"


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
    conda:
        "../../envs/workflow.yaml"
    params:
        spec=configuration_params,
        source=config["model"]["source"],
        hardware=config["hardware"],
        settings=config["plan"],
        contexts=scenario_contexts(config),
        archive_dir=config["model"]["weights"]["archive_dir"],
    script:
        "../scripts/plan_configuration.py"
