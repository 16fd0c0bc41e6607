"""The trial file as one model (llmtrial.core.trial_config) against the schema the loader validates
with: on every trial file under config/ the model fills the same defaults, and a file the schema
refuses the model refuses too, at the same key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from conftest import REPO
from llmtrial.config import ConfigError, validate_config
from llmtrial.core.trial_config import TrialConfig
from llmtrial.host.nodes import number_slurm_nodes

TRIAL_FILES = sorted([REPO / "config" / "config.yaml", *(REPO / "config" / "trials").glob("*.yaml")])


def raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", TRIAL_FILES, ids=lambda p: p.name)
def test_the_model_fills_every_default_the_schema_fills(path):
    by_schema = validate_config(copy.deepcopy(raw(path)), source=str(path))
    by_model = TrialConfig.model_validate(copy.deepcopy(raw(path))).model_dump()
    number_slurm_nodes(by_model)  # the loader's numbering after validation, as validate_config does
    assert by_model == by_schema


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
    with pytest.raises(ConfigError) as by_schema:
        validate_config(copy.deepcopy(data), source="config")
    with pytest.raises(ValidationError) as by_model:
        TrialConfig.model_validate(data)
    where = ".".join(keys)
    assert f"'{where}" in str(by_schema.value)
    assert any(".".join(map(str, e["loc"])).startswith(where) for e in by_model.value.errors())


@pytest.mark.parametrize("keys", [("trial",), ("model",), ("model", "name"), ("model", "source"),
                                  ("model", "source", "kind"), ("configurations",), ("scenarios",)])
def test_a_required_key_left_out_is_refused_by_both_naming_it(keys):
    data = copy.deepcopy(raw(DEFAULT))
    node = data
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]
    with pytest.raises(ConfigError, match=f"'{'.'.join(keys)}'"):
        validate_config(copy.deepcopy(data), source="config")
    with pytest.raises(ValidationError) as by_model:
        TrialConfig.model_validate(data)
    assert ".".join(keys) in [".".join(map(str, e["loc"])) for e in by_model.value.errors()]
