"""The trial file as one model (llmtrial.core.trial_config), held to the hand-written JSON Schema it
replaced (``tests/data/config.schema.before-model.yaml``, read with jsonschema filling its defaults as
the loader did): on every trial file under config/ the loader fills the same defaults, and what the
old schema refused the loader refuses, naming the same key."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator, validators

from conftest import DATA, REPO
from llmtrial.config import ConfigError, validate_config
from llmtrial.host.nodes import number_slurm_nodes

TRIAL_FILES = sorted([REPO / "config" / "config.yaml", *(REPO / "config" / "trials").glob("*.yaml")])


def raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _filling_defaults(validator_class: type) -> type:
    """jsonschema filling each property's default before validating it, as the loader did before the model."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


BEFORE = _filling_defaults(Draft202012Validator)(yaml.safe_load((DATA / "config.schema.before-model.yaml").read_text()))


def old_key(error) -> str:
    """The dotted key the old loader named for a jsonschema error: a missing or unexpected key itself."""
    parts = [str(p) for p in error.absolute_path]
    if error.validator == "required":
        parts.append(re.match(r"'([^']+)'", error.message)[1])
    elif error.validator == "additionalProperties":
        parts.append(sorted(k for k in error.instance if k not in error.schema.get("properties", {}))[0])
    return ".".join(parts)


def by_old_schema(data: dict) -> tuple[dict, list[str]]:
    """``data`` with the old schema's defaults, and the dotted keys of its errors."""
    return data, [old_key(e) for e in BEFORE.iter_errors(data)]


#: Trial file keys added after the model replaced the schema (dotted under a block, ``*`` any name of a block's
#: entries): the old schema knows none of them.
ADDED_SINCE = ("failures", "serving.idle_watch_s", "patches.*.nodes", "nodes.*.gpus")


def without_added(config: dict) -> dict:
    """``config`` without the keys :data:`ADDED_SINCE` names."""
    out = copy.deepcopy(config)
    for key in ADDED_SINCE:
        *blocks, last = key.split(".")
        nodes = [out]
        for block in blocks:
            nodes = [v for n in nodes for v in n.values()] if block == "*" else [n.get(block, {}) for n in nodes]
        for node in nodes:
            node.pop(last, None)
    return out


@pytest.mark.parametrize("path", TRIAL_FILES, ids=lambda p: p.name)
def test_the_model_fills_every_default_the_schema_fills(path):
    by_schema, errors = by_old_schema(without_added(raw(path)))
    number_slurm_nodes(by_schema)  # the loader's numbering after validation, then as now
    assert errors == []
    by_model = validate_config(copy.deepcopy(raw(path)), source=str(path))
    assert "failures" in by_model and "idle_watch_s" in by_model["serving"]  # the model fills the added keys too
    by_model = without_added(by_model)
    assert json.dumps(by_model, sort_keys=True) == json.dumps(by_schema, sort_keys=True)  # 60 stays 60, not 60.0


def edited(path: Path, keys: tuple, value) -> dict:
    data = copy.deepcopy(raw(path))
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return data


DEFAULT = REPO / "config" / "config.yaml"


@pytest.mark.parametrize("keys, value", [
    (("configurations", "tp1", "argz"), {}),  # a misspelled key
    (("scenarios", "c1", "concurrency"), 0),  # below its minimum
    (("nodes", "b", "reach"), "pigeon"),  # not one of its values
    (("hardware", "gpus"), [-1]),  # an index below 0
    (("model", "source", "kind"), "ftp"),
    (("statistics", "level"), "high"),
    (("trial",), "has space"),  # breaks the name's pattern
])
def test_what_the_schema_refuses_the_model_refuses_at_the_same_key(keys, value):
    data = edited(DEFAULT, keys, value)
    where = ".".join(keys)
    assert any(e.startswith(where) for e in by_old_schema(copy.deepcopy(data))[1])
    with pytest.raises(ConfigError, match=f"config key '{re.escape(where)}"):  # or an item of it: 'hardware.gpus.0'
        validate_config(copy.deepcopy(data), source="config")


@pytest.mark.parametrize("keys", [("trial",), ("model",), ("model", "name"), ("model", "source"),
                                  ("model", "source", "kind"), ("configurations",), ("scenarios",)])
def test_a_required_key_left_out_is_refused_by_both_naming_it(keys):
    data = copy.deepcopy(raw(DEFAULT))
    node = data
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]
    where = ".".join(keys)
    assert where in by_old_schema(copy.deepcopy(data))[1]
    with pytest.raises(ConfigError, match=f"config key '{re.escape(where)}': missing: a required key"):
        validate_config(copy.deepcopy(data), source="config")


# --- the GPUs each node gives (nodes.<name>.gpus) ----------------------------------------------------

SEED_000 = REPO / "config" / "trials" / "seed000-qwen3.5-397b-fp8-pp3.yaml"


def test_seed_000_gives_two_gpus_on_node_a_and_one_on_node_b_adding_up_to_its_three():
    config = validate_config(raw(SEED_000), source=str(SEED_000))
    counts = {name: block["gpus"] for name, block in config["nodes"].items()}
    assert counts == {"a": 2, "b": 1} and sum(counts.values()) == config["hardware"]["gpus"] == 3


def test_a_trial_whose_nodes_give_no_count_keeps_them_uncounted():
    config = validate_config(raw(REPO / "config" / "trials" / "two-hosts-cpu.yaml"))
    assert [block["gpus"] for block in config["nodes"].values()] == [None, None]


def refused(data: dict) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(data, source=str(SEED_000))
    return str(err.value)


@pytest.mark.parametrize("a, b", [(1, 1), (2, 2), (4, 0)])
def test_nodes_counts_that_do_not_add_up_to_hardware_gpus_are_refused_naming_the_key_and_file(a, b):
    data = raw(SEED_000)
    data["nodes"]["a"]["gpus"], data["nodes"]["b"]["gpus"] = a, b
    message = refused(data)
    assert f"{SEED_000} key 'hardware.gpus': 3 GPUs, but the nodes' gpus add up to {a + b} (a {a} + b {b})" in message


@pytest.mark.parametrize("gpus", [None, [0, 1, 2]])
def test_with_nodes_counts_hardware_gpus_must_be_the_trials_count(gpus):
    data = raw(SEED_000)
    data["hardware"]["gpus"] = gpus
    assert f"{SEED_000} key 'hardware.gpus': {gpus!r} names GPUs of this host alone; give the trial's count, 3 " \
           "(the nodes' gpus: a 2 + b 1)" in refused(data)


def test_a_count_on_one_node_only_is_refused_naming_the_node_without_it():
    data = raw(SEED_000)
    del data["nodes"]["b"]["gpus"]
    message = refused(data)
    assert f"{SEED_000} key 'nodes.b.gpus': missing: node(s) a give their GPUs, so every node must" in message
    assert "nodes.a.gpus" not in message


def test_a_configuration_whose_nodes_give_fewer_gpus_than_its_ranks_is_refused_unless_forced():
    data = raw(SEED_000)  # pipeline parallel 3 (serving.args) on node a alone, which gives 2
    data["configurations"]["pp3-offload"]["nodes"] = ["a"]
    message = refused(copy.deepcopy(data))
    assert (f"{SEED_000} key 'configurations.pp3-offload.nodes': its ranks occupy 3 GPUs (tensor x pipeline x data "
            "parallel size), its nodes give 2 (a 2)") in message
    assert "pp3-no-offload" not in message  # still on both nodes: 2 + 1 = 3
    data["configurations"]["pp3-offload"]["force"] = True  # launched anyway, to reproduce a crash
    assert validate_config(data)["configurations"]["pp3-offload"]["nodes"] == ["a"]


def test_a_node_giving_no_gpu_to_a_configuration_on_gpus_is_refused():
    data = raw(SEED_000)
    data["nodes"]["a"]["gpus"], data["nodes"]["b"]["gpus"] = 3, 0
    data["hardware"]["gpus"] = 3
    assert (f"{SEED_000} key 'configurations.pp3-offload.nodes': node(s) b give no GPU (gpus: 0) to a configuration "
            "whose ranks run on GPUs") in refused(data)
