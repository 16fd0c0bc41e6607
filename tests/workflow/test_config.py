"""The trial configuration: schema, defaults, error messages, per-configuration params."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from conftest import REPO
from llmtrial.config import (
    SCHEMA_PATH,
    ConfigError,
    check_config,
    configuration_port,
    configuration_spec,
    load_config,
    load_schema,
    validate_config,
)
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve.server import build_server_argv


def minimal() -> dict:
    return {
        "trial": "t",
        "model": {"name": "m", "source": {"kind": "tiny"}},
        "configurations": {"a": {}, "b": {"args": {"tensor_parallel_size": 2}, "env": {"X": "1"}}},
        "scenarios": {"s": {}},
    }


def schema_keys(node: dict, prefix: str = "") -> list[tuple[str, dict]]:
    """Every key of the trial file's schema (refs inlined): its dotted name and its schema, with
    ``required`` set where its block requires it; a block that may also be null is walked too."""
    out = []
    for name, sub in node.get("properties", {}).items():
        out.append((prefix + name, {**sub, "required": name in node.get("required", [])}))
        out.extend(schema_keys(sub, prefix + name + "."))
    for member in node.get("anyOf", []):
        out.extend(schema_keys(member, prefix))
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in extra:
        out.extend(schema_keys(extra, prefix + "<name>."))
    return out


def test_defaults_fill_nested_keys_even_when_parents_are_missing():
    config = validate_config(minimal())
    assert config["serving"]["base_port"] == 8100
    assert config["serving"]["args"] == {}
    assert config["model"]["source"]["tiny"]["hidden_size"] == 256
    assert config["scenarios"]["s"] == {
        "concurrency": 1, "num_prompts": 8, "input_len": 32, "output_len": 16,
        "request_rate": "inf", "passes": 1, "warmup": False, "slo": None, "timeout_s": 900,
        "dataset": "random", "prompts": None, "chat_template": False, "range_ratio": None, "prefix_len": None,
        "num_prefixes": 1,
    }
    assert config["configurations"]["a"] == {"args": {}, "env": {}, "description": "", "force": False, "nodes": [],
                                                "launch": "native"}
    assert config["nodes"] == {}


def test_unknown_key_is_named_with_its_full_path():
    config = minimal()
    config["serving"] = {"bas_port": 9000}
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert "'serving.bas_port'" in str(err.value)


def test_wrong_type_is_named_and_every_error_is_listed():
    config = minimal()
    config["scenarios"]["s"] = {"concurrency": "two"}
    config["configurations"]["a"] = {"env": {"N": 1}}
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    msg = str(err.value)
    assert "'scenarios.s.concurrency': 'two': Input should be a valid integer" in msg
    assert "'configurations.a.env.N'" in msg


def test_missing_required_key_is_named():
    config = minimal()
    del config["scenarios"]
    with pytest.raises(ConfigError, match="'scenarios'"):
        validate_config(config)


def test_bad_configuration_name_is_rejected():
    config = minimal()
    config["configurations"]["../x"] = {}
    with pytest.raises(ConfigError, match="configurations"):
        validate_config(config)


def test_every_schema_key_has_a_description_and_a_default():
    keys = schema_keys(load_schema())
    assert len(keys) > 150  # the walk reaches the nested blocks
    missing = [key for key, sub in keys if "description" not in sub or ("default" not in sub and not sub["required"])]
    assert missing == []


def test_config_readme_documents_every_key():
    readme = (REPO / "config" / "README.md").read_text()
    undocumented = [key for key, _ in schema_keys(load_schema()) if f"`{key}`" not in readme]
    assert undocumented == []


def test_default_trial_is_valid_and_has_two_configurations_and_two_scenarios():
    config = load_config(REPO / "config" / "config.yaml")
    assert len(config["configurations"]) == 2 and len(config["scenarios"]) == 2
    assert config["model"]["source"]["kind"] == "tiny"


def test_load_config_names_the_file(tmp_path):
    bad = tmp_path / "trial.yaml"
    bad.write_text(yaml.safe_dump({**minimal(), "extra": 1}))
    with pytest.raises(ConfigError, match=re.escape(str(bad)) + " key 'extra'"):
        load_config(bad)


def test_configuration_spec_merges_common_and_own_settings():
    config = minimal()
    config["serving"] = {"args": {"max_model_len": 512, "tensor_parallel_size": 1}, "env": {"A": "x", "X": "0"}}
    trial = check_config(config)
    spec = configuration_spec(trial, "b")
    assert spec.args == {"max_model_len": 512, "tensor_parallel_size": 2}
    assert spec.env == {"A": "x", "X": "1"}
    assert spec.port == 8101 == configuration_port(trial, "b")


def test_args_are_read_once_under_vllms_own_names_for_the_planner_and_the_server():
    config = minimal()
    config["serving"] = {"args": {"--max-model-len": 512, "tp": 1}}
    config["configurations"]["b"]["args"] = {"tp": 2, "enforce-eager": True}
    spec = configuration_spec(check_config(config), "b")
    # an alias is translated once: the configuration's tp overrides the common one, and no --tp reaches vLLM
    assert spec.args == {"max_model_len": 512, "tensor_parallel_size": 2, "enforce_eager": True}
    args = ServingArgs.from_config(spec.args)  # the one reading, for the planner and the argv alike
    assert args.tensor_parallel_size == 2 and args.given == spec.args
    argv = build_server_argv(model_dir="/m", served_model_name="m", host="127.0.0.1", port=8101, args=args)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and "--tp" not in argv
    # given straight, an alias is translated by the same reading, never passed through
    raw = build_server_argv(model_dir="/m", served_model_name="m", host="h", port=1,
                            args=ServingArgs.from_config({"tp": 2, "kv-cache-memory": 2**30}))
    assert raw[raw.index("--tensor-parallel-size") + 1] == "2" and "--tp" not in raw
    assert ServingArgs.from_config({"kv-cache-memory": 2**30}).kv_cache_memory_bytes == 2**30
    assert "--kv-cache-memory-bytes" not in raw and raw[raw.index("--kv-cache-memory") + 1] == str(2**30)


def test_one_argument_spelled_twice_is_refused_naming_both_keys():
    config = minimal()
    config["configurations"]["b"]["args"] = {"tp": 2, "tensor-parallel-size": 2}
    with pytest.raises(ConfigError, match=r"configurations\.b\.args': 'tp' and 'tensor-parallel-size' both set "
                                          "tensor_parallel_size"):
        validate_config(config)


def test_the_checks_across_keys_are_the_models_and_are_listed_at_once_each_at_its_key():
    """An argument spelled twice, a sweep whose steps go down, a cost without its price: each block's model
    refuses its own (llmtrial.core.trial_checks), and the loader lists them together, naming each key."""
    config = minimal()
    config["configurations"]["b"]["args"] = {"tp": 2, "tensor_parallel_size": 2}
    config["scenarios"]["s"] = {"concurrency": [4, 2]}
    config["cost"] = {"currency": "EUR"}
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    lines = str(err.value).splitlines()[1:]
    assert [line.strip().split(": ", 1)[0] for line in lines] == [
        "config key 'configurations.b.args'", "config key 'cost.price'", "config key 'scenarios.s.concurrency'"]
    assert "a sweep's values must increase, step by step (got [4, 2])" in lines[2]


def test_editing_one_configuration_leaves_the_others_spec_unchanged():
    config = validate_config(minimal())
    edited = copy.deepcopy(config)
    edited["configurations"]["b"]["args"]["max_num_seqs"] = 4
    before, after = check_config(config), check_config(edited)
    assert configuration_spec(after, "a") == configuration_spec(before, "a")
    assert configuration_spec(after, "b") != configuration_spec(before, "b")


def test_schema_path_points_at_the_workflow_schema():
    assert SCHEMA_PATH == REPO / "workflow" / "llmtrial" / "schemas" / "config.schema.json"


def test_a_cost_block_needs_its_price_and_an_iso_currency_and_names_the_key():
    config = minimal()
    config["cost"] = {"price": 2.5}
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert "config key 'cost.currency': missing: give the currency of the price" in str(err.value)
    config["cost"] = {"currency": "usd", "per": "gpu_hour"}
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    msg = str(err.value)
    assert "'cost.currency': 'usd': String should match pattern '^[A-Z]{3}$'" in msg
    assert "'cost.per': 'gpu_hour': Input should be 'accelerator_hour' or 'host_hour'" in msg
    config["cost"] = {"price": 2.5, "currency": "USD"}
    assert validate_config(config)["cost"] == {"price": 2.5, "currency": "USD", "per": "accelerator_hour", "note": ""}
    assert validate_config(minimal())["cost"] is None


def test_the_report_block_has_defaults_and_its_baseline_must_name_a_configuration():
    config = validate_config(minimal())
    assert config["report"] == {"baseline": None, "max_disagreement": 0.1, "notes": ""}
    assert validate_config({**minimal(), "report": {"baseline": "b"}})["report"]["baseline"] == "b"
    with pytest.raises(ConfigError, match=r"key 'report.baseline': 'tp9' is not a configuration of this trial \(a, b\)"):
        validate_config({**minimal(), "report": {"baseline": "tp9"}})


def test_a_file_patch_is_refused_on_another_node_of_a_configuration_and_a_plugin_there_is_not():
    config = minimal()
    config["nodes"] = {"a": {}, "b": {"reach": "ssh", "ssh": {"address": "10.0.0.2"}}}
    config["configurations"]["a"]["nodes"] = ["a", "b"]
    refused = (r"mode file changes the vLLM of the host the workflow runs on only, and configuration 'a' spans node "
               r"'b': give the patch mode plugin there \(nodes: \{b: plugin\}\)")
    for entry, key in (({"mode": "file"}, "mode"), ({}, "mode"), ({"mode": "plugin", "nodes": {"b": "file"}}, "nodes.b")):
        config["patches"] = {"demo-worker-log": entry}  # file is the default mode
        with pytest.raises(ConfigError, match=rf"key 'patches\.demo-worker-log\.{key}': {refused}"):
            validate_config(copy.deepcopy(config))
    config["patches"] = {"demo-worker-log": {"mode": "plugin"}}
    validate_config(copy.deepcopy(config))
    # seed 000: mode file on node a, the host the workflow runs on, and a plugin on node b
    config["patches"] = {"demo-worker-log": {"mode": "file", "nodes": {"b": "plugin"}}}
    assert validate_config(copy.deepcopy(config))["patches"]["demo-worker-log"]["nodes"] == {"b": "plugin"}
    config["patches"] = {"demo-worker-log": {"mode": "plugin", "nodes": {"c": "file"}}}
    with pytest.raises(ConfigError, match=r"key 'patches\.demo-worker-log\.nodes\.c': 'c' is not a node of this trial "
                                          r"\(a, b\)"):
        validate_config(copy.deepcopy(config))
    config["configurations"]["a"]["nodes"] = ["a"]  # one node: a file patch reaches it
    config["patches"] = {"demo-worker-log": {"mode": "file"}}
    validate_config(copy.deepcopy(config))
    assert load_config(REPO / "config" / "config.yaml")["patches"] == {"demo-worker-log": {"mode": "file", "nodes": {}}}


def test_a_misspelled_key_is_named_with_the_key_it_resembles():
    config = minimal()
    config["serving"] = {"bas_port": 9000}
    with pytest.raises(ConfigError, match=r"'serving\.bas_port': not a key of this block \(did you mean 'base_port'\?\)"):
        validate_config(config)
