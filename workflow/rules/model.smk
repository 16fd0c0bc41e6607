# Stage the weights outside results/ (never a directory() output), copy them to every other
# node a configuration spans, and write their manifest.
rule stage_model:
    input:
        preflight=rules.preflight.output.record,
    output:
        manifest=report(
            str(P.manifest),
            caption="../report/manifest.rst",
            category="Records",
            subcategory="Trial",
            labels={"stage": "2 weights", "record": "model manifest"},
        ),
    log:
        str(P.log("stage_model")),
    resources:
        **host_resources("stage_model"),
    conda:
        "../../envs/serving.yaml"
    params:
        source=config["model"]["source"],
        staging=staging_path,
        root=staging_root,
        weights=config["model"]["weights"],
        disk=config["disk"],
        ledger=ledger_path,
        nodes=spanned_nodes(TRIAL_CONFIG),
        trial=TRIAL,
        model=config["model"]["name"],
    script:
        "../scripts/stage_model.py"
