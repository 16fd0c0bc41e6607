# Patch vLLM before any server starts: each patch named under `patches`, as a file patch
# (checked against vLLM's RECORD, ledger first, all files or none) or as a plugin folder the
# servers load. Its record stays after cleanup reverts the patches: a configuration rerun
# on its own applies them again itself (from the ledger), like the quiet stage.
rule patch:
    input:
        quieted=rules.quiet.output.record,
        # the patches' own files: editing a diff or a hook patches again
        patch_files=patch_files,
    output:
        record=report(
            str(P.patches_record),
            caption="../report/patches.rst",
            category="Records",
            subcategory="Trial",
            labels={"stage": "4 patch vLLM", "record": "patches applied"},
        ),
    log:
        str(P.log("patch")),
    resources:
        **host_resources("patch"),
    conda:
        "../../envs/serving.yaml"
    params:
        patches=config["patches"],
        results=str(TRIAL_PATHS.root),
    script:
        "../scripts/patch_vllm.py"
