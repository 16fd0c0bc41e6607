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
    resources:
        **host_resources("preflight"),
    conda:
        "../../envs/workflow.yaml"
    params:
        source=config["model"]["source"],
        staging=staging_path,
        disk=config["disk"],
        nodes=spanned_nodes(TRIAL_CONFIG),
        hardware=config["hardware"],
        probes=config["probes"],
    script:
        "../scripts/preflight.py"
