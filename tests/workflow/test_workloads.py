"""The workloads operators bring, through the workflow with real vLLM (CPU build): a scenario that sends the
operator's own prompts from a JSONL file (staged and hashed) and one from vLLM's prefix_repetition dataset
(served with prefix caching on, for it alone), in one trial; and a malformed prompt file refused, naming its
line, before anything runs.

The served tests read the sweep trial of tests/served_trials.py, whose tp1 (eager, a 1,024-token KV cache)
serves both workloads after the sweep's own scenarios, one pass each of four output tokens; the prefix
scenario on a relaunch of its own with prefix caching on.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from llmtrial.core.records import load_record
from served_trials import PREFIX_LEN, PROMPTS, WORKLOADS, write_prompts
from workflow_helpers import job_counts, snakemake, write_config

pytestmark = [pytest.mark.workflow, pytest.mark.aside, pytest.mark.long]  # the sweep trial's worker: no patch, ports of its own

BASE_PORT = 18420


def trial_config(base_port: int) -> dict:
    """A trial of its own with the workloads alone (the malformed prompt file's test: it never serves)."""
    return {
        "trial": "workloads",
        "model": {"name": "tiny-llama", "source": {"kind": "tiny", "seed": 0}},
        "serving": {"base_port": base_port, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                    "args": {"max_model_len": 512, "dtype": "bfloat16", "enforce_eager": True}},
        "configurations": {"tp1": {"args": {"tensor_parallel_size": 1}}},
        "scenarios": WORKLOADS,
    }


def scenario(sweep, name):
    assert sweep["run"].returncode == 0, sweep["run"].stderr[-3000:]
    return next(sc for sc in tp1_record(sweep).scenarios if sc.name == name)


def tp1_record(sweep):
    """tp1's configuration record, read as its model."""
    return load_record(sweep["results"] / "configs" / "tp1" / "record.json", "configuration")


def argv_value(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.e2e
def test_the_operators_prompts_are_sent_once_each_from_the_staged_copy_whose_sha256_provenance_holds(sweep):
    own = scenario(sweep, "own")
    [one] = own.pass_results
    sha = hashlib.sha256(sweep["prompts"].read_bytes()).hexdigest()
    assert one.status == "ok" and one.summary.completed == len(PROMPTS) and one.summary.failed == 0
    assert one.server_metrics.requests_finished == len(PROMPTS)
    assert one.summary.total_output_tokens == len(PROMPTS) * 4
    argv = [str(a) for a in one.argv]
    staged = sweep["work"] / argv_value(argv, "--dataset-path")
    assert argv_value(argv, "--dataset-name") == "custom" and "--skip-chat-template" in argv
    assert staged == sweep["results"] / "prompts" / "own.jsonl" and staged.read_bytes() == sweep["prompts"].read_bytes()
    assert (own.spec.prompts_staged, own.spec.prompts_sha256, own.spec.prompts_count) == (
        argv_value(argv, "--dataset-path"), sha, len(PROMPTS))
    provenance = load_record(sweep["results"] / "provenance.json", "provenance")
    assert provenance.prompt_files["own"].sha256 == sha and provenance.prompt_files["own"].source == "config/prompts.jsonl"
    # the file's prompts as written (no chat template), each once: the server's prompt tokens are theirs
    from transformers import AutoTokenizer

    manifest = load_record(sweep["results"] / "model" / "manifest.json", "manifest")
    tokenizer = AutoTokenizer.from_pretrained(sweep["work"] / manifest.model_dir)
    assert one.server_metrics.prompt_tokens == sum(len(tokenizer(p).input_ids) for p in PROMPTS)


@pytest.mark.e2e
def test_the_prefix_scenario_ran_alone_on_a_relaunch_with_prefix_caching_on_and_hit_the_cache(sweep):
    own, shared = scenario(sweep, "own"), scenario(sweep, "shared")
    record = tp1_record(sweep)
    assert "--no-enable-prefix-caching" in record.server.argv and "--enable-prefix-caching" not in record.server.argv
    relaunch = record.prefix_caching_server
    assert "--enable-prefix-caching" in relaunch.argv and relaunch.log == "prefix-caching-server.log"
    assert relaunch.launched_at > own.pass_results[-1].end and relaunch.stop.port_closed
    assert (own.prefix_caching, own.relaunched) == (False, None) and (shared.prefix_caching, shared.relaunched) == (True, True)
    [one] = shared.pass_results
    argv = [str(a) for a in one.argv]
    assert one.status == "ok" and one.summary.completed == 8
    assert (argv_value(argv, "--dataset-name"), argv_value(argv, "--prefix-repetition-prefix-len"),
            argv_value(argv, "--prefix-repetition-suffix-len"), argv_value(argv, "--prefix-repetition-num-prefixes")) == (
        "prefix_repetition", str(PREFIX_LEN), "32", "2")
    assert one.server_metrics.prefix_cache_hits > 0 and own.pass_results[0].server_metrics.prefix_cache_hits == 0
    assert [sc.name for sc in record.scenarios] == ["onset", "slo", "own", "shared"]  # the trial file's order, whatever ran first
    cleanup = json.loads((sweep["results"] / "cleanup" / "record.json").read_text())
    assert cleanup["restored"] and cleanup["residues"] == []


@pytest.mark.e2e
def test_the_report_says_prefix_caching_was_on_for_that_scenario_alone_and_names_the_prompt_file(sweep):
    scenario(sweep, "own")
    html = (sweep["results"] / "report.html").read_text()
    passes = html.split('id="scenarios"', 1)[1]
    own, shared = passes.split("<h3>Scenario own</h3>", 1)[1].split("<h3>Scenario shared</h3>", 1)
    sha = hashlib.sha256(sweep["prompts"].read_bytes()).hexdigest()
    assert f"8 prompts from config/prompts.jsonl (custom dataset, sha256 {sha[:12]}…, 8 in the file)" in own
    assert "prefix caching on" not in own
    assert "prefix caching on for this scenario alone (tp1): the configuration&#39;s server was launched again with " \
           "--enable-prefix-caching after the other scenarios, since the trial otherwise turns it off" in shared


@pytest.mark.e2e
def test_an_edited_prompt_file_is_staged_again_and_the_configuration_reruns(sweep):
    scenario(sweep, "own")
    original = sweep["prompts"].read_bytes()
    try:
        write_prompts(sweep["work"], [json.dumps({"prompt": p}) for p in reversed(PROMPTS)])
        dry = snakemake(sweep["work"], "-n", "--cores", "all")
    finally:
        sweep["prompts"].write_bytes(original)
    counts = job_counts(dry.stdout)
    assert dry.returncode == 0 and counts["stage_prompts"] == 1 and counts["trial"] == 1, dry.stdout[-2000:]


def test_a_malformed_prompt_file_is_refused_naming_the_scenario_and_its_line_before_anything_runs(tmp_path):
    lines = [json.dumps({"prompt": p}) for p in PROMPTS]
    lines[4] = '{"prompt": "an unfinished line'
    write_prompts(tmp_path, lines)
    write_config(tmp_path, trial_config(BASE_PORT))
    run = snakemake(tmp_path, "--cores", "all")
    assert run.returncode != 0
    assert "config key 'scenarios.own.prompts': config/prompts.jsonl line 5: not JSON (Unterminated string" in \
        run.stdout + run.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "staging").exists()
