# Quiet the host's other services before any server starts. Its record stays after cleanup
# restores the host: a configuration rerun on its own quiets the host again itself (from the
# ledger), because a regenerated input here would rerun every configuration.
rule quiet:
    input:
        # as late as possible: services stay up while the weights are staged
        manifest=rules.stage_model.output.manifest,
    output:
        record=report(
            str(P.quieted),
            caption="../report/quieted.rst",
            category="Records",
            subcategory="Trial",
            labels={"stage": "3 quiet services", "record": "services quieted"},
        ),
    log:
        str(P.log("quiet")),
    resources:
        **host_resources("quiet"),
    conda:
        "../../envs/workflow.yaml"
    params:
        services=services_on_nodes(TRIAL_CONFIG),
        results=str(TRIAL_PATHS.root),
        ports=trial_ports(),
        host=config["serving"]["host"],
    script:
        "../scripts/quiet_services.py"
