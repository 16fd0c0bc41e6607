"""The workloads a scenario sends: prompt files read and refused at load, staged with their sha256, and each
dataset mapped onto vLLM bench's own flags (checked against vLLM's own parser and dataset readers)."""

from __future__ import annotations

import hashlib
import json

import pytest

from llmtrial.config import ConfigError, validate_config
from llmtrial.core.record_base import Fact
from llmtrial.core.record_models import StagedPrompts
from llmtrial.core.scenario_model import ScenarioSpec, Step
from llmtrial.core.trial_config import ScenarioBlock
from llmtrial.serve.bench import bench_argv
from llmtrial.serve.datasets import (
    JobScenario,
    PassLoad,
    PromptFileError,
    dataset_flags,
    stage_prompts,
    with_staged,
)
from llmtrial.serve.onset import onset
from llmtrial.serve.scenarios import contexts
from llmtrial.weights.tiny import generate_tiny_model

PROMPTS = [f"Question {i}: what follows {i} in the sequence of whole numbers?" for i in range(1, 9)]


def custom_file(path, prompts=PROMPTS):
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def sharegpt_file(path, prompts=PROMPTS):
    data = [{"id": str(i), "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "The next one."}]}
            for i, p in enumerate(prompts)]
    path.write_text(json.dumps(data, indent=2))
    return path


def trial(**scenario) -> dict:
    return {"trial": "t", "model": {"name": "m", "source": {"kind": "tiny"}}, "configurations": {"a": {}},
            "scenarios": {"mine": scenario}}


def refusal(**scenario) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(trial(**scenario))
    return str(err.value)


def flag(argv, name):
    return argv[argv.index(name) + 1]


def blocks(scenarios: dict) -> dict[str, ScenarioBlock]:
    return {name: ScenarioBlock.model_validate(spec) for name, spec in scenarios.items()}


def flags(staged: str | None = None, **spec) -> list[str]:
    """The dataset flags of one pass of the scenario ``spec``, its prompt file staged at ``staged``."""
    block = ScenarioBlock.model_validate(spec)
    copy = None if staged is None else StagedPrompts(dataset=block.dataset, source=str(block.prompts), staged=staged,
                                                     sha256="0" * 64, bytes=1, prompts=8)
    return dataset_flags(JobScenario(block, copy), PassLoad.at(block))


# --------------------------------------------------------------------------- refused before anything runs


def test_a_missing_prompt_file_is_refused_naming_the_scenario_and_the_file(tmp_path):
    message = refusal(dataset="custom", prompts=str(tmp_path / "gone.jsonl"))
    assert f"config key 'scenarios.mine.prompts': {tmp_path / 'gone.jsonl'}: cannot read (No such file" in message


def test_a_jsonl_line_that_is_not_json_is_refused_naming_its_line(tmp_path):
    path = custom_file(tmp_path / "p.jsonl")
    lines = path.read_text().splitlines()
    lines[2] = '{"prompt": "three",'
    path.write_text("\n".join(lines) + "\n")
    message = refusal(dataset="custom", prompts=str(path))
    assert f"config key 'scenarios.mine.prompts': {path} line 3: not JSON (" in message


@pytest.mark.parametrize(("line", "why"), [('{"text": "no prompt"}', "no 'prompt' string"),
                                           ('{"prompt": 7}', "no 'prompt' string"),
                                           ('["a list"]', "a line is a JSON object"),
                                           ('{"prompt": "  "}', "no 'prompt' string")])
def test_a_jsonl_line_without_a_prompt_string_is_refused_naming_its_line(tmp_path, line, why):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one"}\n\n' + line + "\n")
    assert f"{path} line 3: {why}" in refusal(dataset="custom", prompts=str(path), num_prompts=1)


def test_a_sharegpt_entry_with_one_turn_is_refused_naming_the_line_it_starts_on(tmp_path):
    path = sharegpt_file(tmp_path / "p.json", PROMPTS[:3])
    data = json.loads(path.read_text())
    data[2]["conversations"] = data[2]["conversations"][:1]
    path.write_text(json.dumps(data, indent=2))
    start = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if '"id": "2"' in text) - 1
    message = refusal(dataset="sharegpt", prompts=str(path), num_prompts=2)
    assert f"config key 'scenarios.mine.prompts': {path} line {start}: an entry is an object whose 'conversations'" in message


def test_a_sharegpt_file_that_is_not_json_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('[\n  {"conversations": []},\n  oops\n]\n')
    assert f"{path} line 3: not JSON (Expecting value)" in refusal(dataset="sharegpt", prompts=str(path))


def test_more_prompts_per_pass_than_the_file_holds_are_refused(tmp_path):
    path = custom_file(tmp_path / "p.jsonl")
    message = refusal(dataset="custom", prompts=str(path), num_prompts=[4, 12])
    assert f"'scenarios.mine.num_prompts': 12 is more than the 8 prompts in {path}: a pass sends each prompt at most once" \
        in message


def test_keys_of_another_dataset_are_refused_by_name(tmp_path):
    path = custom_file(tmp_path / "p.jsonl")
    assert "'scenarios.mine.prompts': dataset custom reads the operator's prompt file: name it" in refusal(dataset="custom")
    assert "'scenarios.mine.prompts': only datasets custom and sharegpt read a prompt file (this scenario's dataset " \
           "is random)" in refusal(prompts=str(path))
    assert "'scenarios.mine.range_ratio': only dataset random varies its lengths (this one is custom)" in refusal(
        dataset="custom", prompts=str(path), range_ratio=0.2)
    assert "'scenarios.mine.chat_template': only dataset custom" in refusal(chat_template=True)
    assert "'scenarios.mine.prefix_len': only dataset prefix_repetition" in refusal(prefix_len=8)
    assert "'scenarios.mine.input_len': a sweep cannot vary it" in refusal(dataset="custom", prompts=str(path),
                                                                          input_len=[16, 32])


def test_prefix_repetition_needs_a_prefix_shorter_than_the_prompt_and_whole_groups_and_ratios_stay_below_one():
    assert "'scenarios.mine.prefix_len': dataset prefix_repetition needs" in refusal(dataset="prefix_repetition")
    assert "'scenarios.mine.input_len': the whole prompt (32) must be longer than its shared prefix (prefix_len 32)" \
        in refusal(dataset="prefix_repetition", prefix_len=32, input_len=32)
    assert "'scenarios.mine.num_prompts': 9 is not a multiple of num_prefixes (2)" in refusal(
        dataset="prefix_repetition", prefix_len=16, num_prefixes=2, num_prompts=9)
    assert "'scenarios.mine.range_ratio': 1.0: Input should be less than 1" in refusal(range_ratio=1.0)
    assert refusal(range_ratio={"output": 1}).endswith("'scenarios.mine.range_ratio.output': 1: Input should be less than 1")


def test_a_configuration_across_nodes_that_would_need_a_relaunch_is_refused():
    config = {**trial(dataset="prefix_repetition"), "nodes": {"a": {}, "b": {}}, "patches": {},
              "configurations": {"one": {"nodes": ["a"]}, "two": {"nodes": ["a", "b"]},
                                 "cached": {"args": {"enable-prefix-caching": True}, "nodes": ["a", "b"]}}}
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    [line] = [line for line in str(err.value).splitlines() if "prefix caching" in line]
    assert line.strip().startswith("config key 'configurations.two': spans nodes, and scenario mine (prefix_repetition)")
    assert "set enable_prefix_caching: true in its args" in line


# --------------------------------------------------------------------------- the flags


def test_each_dataset_maps_onto_vllm_benchs_own_flags():
    assert flags(input_len=64, output_len=32) == [
        "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32"]  # as before the datasets
    assert flags(dataset="random", input_len=64, output_len=32, range_ratio=0.25)[-2:] == [
        "--random-range-ratio", "0.25"]
    assert flags(input_len=64, output_len=32, range_ratio={"input": 0.5, "output": 0})[-1] == \
        '{"input":0.5,"output":0.0}'
    assert flags(dataset="prefix_repetition", input_len=96, output_len=8, prefix_len=64, num_prefixes=2) == [
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "64",
        "--prefix-repetition-suffix-len", "32", "--prefix-repetition-num-prefixes", "2",
        "--prefix-repetition-output-len", "8"]
    custom = {"dataset": "custom", "output_len": 8, "prompts": "mine.jsonl", "staged": "results/t/prompts/s.jsonl"}
    assert flags(**custom) == ["--dataset-name", "custom", "--dataset-path", "results/t/prompts/s.jsonl",
                               "--custom-output-len", "8", "--no-oversample", "--skip-chat-template"]
    assert "--skip-chat-template" not in flags(**custom, chat_template=True)
    assert flags(**{**custom, "dataset": "sharegpt"})[4:6] == ["--sharegpt-output-len", "8"]
    with pytest.raises(PromptFileError, match="not staged"):
        flags(dataset="custom", output_len=8, prompts="mine.jsonl")


def test_the_planners_contexts_take_the_longest_lengths_and_leave_a_prompt_file_out():
    assert contexts(ScenarioBlock(input_len=100, output_len=20, range_ratio=0.5)) == {150 + 30}
    assert contexts(ScenarioBlock.model_validate({"input_len": 100, "output_len": 20,
                                                  "range_ratio": {"input": 0.25, "output": 0}})) == {125 + 20}
    assert contexts(ScenarioBlock(dataset="prefix_repetition", input_len=96, output_len=8, prefix_len=64)) == {104}
    assert contexts(ScenarioBlock(dataset="custom", input_len=32, output_len=8, num_prompts=8, concurrency=[1, 2])) == set()


def test_a_sweep_over_a_prompt_file_or_varied_lengths_predicts_no_onset_and_says_why():
    steps = [Step.model_validate({"pass": n, "seed": n, "start": 0.0, "end": 1.0, "argv": [], "log": "l", "step": n,
                                  "concurrency": n, "num_prompts": 4, "input_len": 32, "output_len": 8, "status": "ok",
                                  "figures": {"preemptions": 0}}) for n in (1, 2)]
    kv = Fact(value=64, kind="measured", source="server.log:1")
    assert [r.predicted_preempts for r in onset(steps, kv, 16, ScenarioSpec(input_len=32)).per_step] == [False, True]
    for spec, why in ((ScenarioSpec(dataset="custom"), "the prompt file's, not known before they are tokenized"),
                      (ScenarioSpec(range_ratio=0.3), "the requests' lengths vary (range_ratio)")):
        out = onset(steps, kv, 16, spec)
        assert out.per_step == [] and out.unpredicted.endswith(why) and out.preemption.predicted_step is None


# --------------------------------------------------------------------------- staging


def test_a_prompt_file_is_staged_with_its_sha256_and_the_benchmark_reads_the_copy(tmp_path):
    path = custom_file(tmp_path / "mine.txt")  # any name: the copy is .jsonl, which vLLM's reader needs
    scenarios = blocks({"own": {"dataset": "custom", "prompts": str(path), "output_len": 8}, "rand": {"input_len": 4}})
    record = stage_prompts(scenarios, tmp_path / "results" / "prompts")
    [(name, staged)] = record.scenarios.items()
    assert name == "own" and staged.staged == str(tmp_path / "results" / "prompts" / "own.jsonl")
    assert staged.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and staged.prompts == 8
    path.write_text('{"prompt": "edited after staging"}\n')  # the operator's file no longer matters
    run = with_staged(scenarios, record)
    spec = run["own"].spec()
    assert spec.prompts_staged == staged.staged and spec.prompts_sha256 == staged.sha256 and spec.prompts_count == 8
    assert run["rand"].block == scenarios["rand"] and run["rand"].staged is None
    argv = bench_argv(host="h", port=1, served_model_name="m", tokenizer="t", seed=1, result_dir="r",
                      result_filename="f.json", percentiles=[50], scenario=run["own"], load=PassLoad(1, 8, 32, 8))
    assert flag(argv, "--dataset-path") == staged.staged


def test_a_staged_copy_edited_or_gone_is_refused_and_so_is_one_never_staged(tmp_path):
    scenarios = blocks({"own": {"dataset": "custom", "prompts": str(custom_file(tmp_path / "p.jsonl"))}})
    record = stage_prompts(scenarios, tmp_path / "prompts")
    copy = tmp_path / "prompts" / "own.jsonl"
    copy.write_text(copy.read_text().replace("Question 1", "Question one"))
    with pytest.raises(PromptFileError, match=r"own.jsonl: the staged prompts of scenario own changed since they "
                                              r"were staged .*snakemake --forcerun stage_prompts"):
        with_staged(scenarios, record)
    copy.unlink()
    with pytest.raises(PromptFileError, match="cannot be read"):
        with_staged(scenarios, record)
    with pytest.raises(PromptFileError, match="scenario own: its prompt file is not staged"):
        with_staged(scenarios)


# --------------------------------------------------------------------------- vLLM's own readers


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(generate_tiny_model(tmp_path_factory.mktemp("datasets-tiny") / "model", seed=0)))


def samples(argv, tokenizer):
    """The requests vLLM's benchmark builds from the dataset flags of ``argv`` (its own parser and readers)."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return get_samples(parser.parse_args(argv[3:]), tokenizer)


def scenario_argv(scenario: JobScenario, seed=1, **load):
    """One pass of ``scenario`` (its counts and lengths changed by ``load``), one request in flight at a time."""
    return bench_argv(host="127.0.0.1", port=1, served_model_name="m", tokenizer="t", seed=seed, result_dir="r",
                      result_filename="f.json", percentiles=[50], scenario=scenario,
                      load=PassLoad(**{**vars(PassLoad.at(scenario.block)), "concurrency": 1, **load}))


@pytest.mark.slow
@pytest.mark.parametrize(("dataset", "write"), [("custom", custom_file), ("sharegpt", sharegpt_file)])
def test_vllm_reads_each_staged_prompt_once_as_written_with_the_scenarios_output_len(tmp_path, tokenizer, dataset, write):
    scenarios = blocks({"own": {"dataset": dataset, "prompts": str(write(tmp_path / "p")), "output_len": 5,
                                "num_prompts": 8}})
    run = with_staged(scenarios, stage_prompts(scenarios, tmp_path / "prompts"))["own"]
    first, other = (samples(scenario_argv(run, seed), tokenizer) for seed in (1, 2))
    assert sorted(s.prompt for s in first) == sorted(PROMPTS) and {s.expected_output_len for s in first} == {5}
    assert [s.prompt for s in first] != [s.prompt for s in other]  # each pass's seed draws its own order
    fewer = samples(scenario_argv(run, num_prompts=3), tokenizer)
    assert len(fewer) == 3 and len({s.prompt for s in fewer}) == 3


@pytest.mark.slow
def test_vllm_builds_prompts_that_share_each_prefix_and_random_lengths_within_the_range(tokenizer):
    spec = {"dataset": "prefix_repetition", "input_len": 48, "output_len": 4, "prefix_len": 32, "num_prefixes": 2,
            "num_prompts": 6}
    built = samples(scenario_argv(JobScenario(ScenarioBlock.model_validate(spec))), tokenizer)
    assert len(built) == 6 and {s.expected_output_len for s in built} == {4}
    assert all(abs(s.prompt_len - 48) <= 1 for s in built)  # vLLM's decode and re-encode may shift a token (it warns)
    prefixes = [tuple(tokenizer(s.prompt, add_special_tokens=False).input_ids[:24]) for s in built]
    assert sorted(prefixes.count(p) for p in set(prefixes)) == [3, 3]
    varied = samples(scenario_argv(JobScenario(ScenarioBlock(input_len=40, output_len=10, num_prompts=32,
                                                             range_ratio=0.5))), tokenizer)
    outputs = {s.expected_output_len for s in varied}
    assert min(outputs) >= 5 and max(outputs) <= 15 and len(outputs) > 3
