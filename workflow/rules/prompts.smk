# Copy the operator's prompt files (scenarios with dataset custom or sharegpt) into the trial's
# results with their sha256; the benchmark reads the copies. The files are this rule's input, so
# an edited file is staged again and the configurations run again.
rule stage_prompts:
    input:
        prompt_files(),
    output:
        record=report(
            str(P.prompts_record),
            caption="../report/prompts.rst",
            category="Records",
            subcategory="Trial",
            labels={"stage": "2 prompts", "record": "prompt files"},
        ),
    log:
        str(P.log("stage_prompts")),
    conda:
        "../../envs/workflow.yaml"
    params:
        scenarios=prompt_scenarios(),
        folder=str(TRIAL_PATHS.prompts),
    script:
        "../scripts/stage_prompts.py"
