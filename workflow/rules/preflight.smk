rule preflight:
    output:
        environment="results/{trial}/preflight/environment.json",
    log:
        "results/{trial}/logs/preflight.log",
    conda:
        "../../envs/workflow.yaml"
    script:
        "../scripts/preflight.py"
