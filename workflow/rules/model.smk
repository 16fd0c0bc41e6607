rule stage_model:
    input:
        environment=rules.preflight.output.environment,
    output:
        manifest="results/{trial}/model/manifest.json",
    log:
        "results/{trial}/logs/stage_model.log",
    conda:
        "../../envs/serving.yaml"
    params:
        source=config["model"]["source"],
        staging=staging_path,
    script:
        "../scripts/stage_model.py"
