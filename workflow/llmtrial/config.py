"""Trial configuration: validation against its model, defaults, and derived values.

The model (:class:`llmtrial.core.trial_config.TrialConfig`) is the single description of every key;
``schemas/config.schema.json`` is generated from it. :func:`validate_config` fills defaults in place
and raises :class:`ConfigError` listing every problem by its dotted key, so a typo names itself.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from llmtrial.answers.tasks import TaskSetError, task_set
from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.core.record_models import CONFIG_SCHEMA
from llmtrial.core.resources import SCHEMAS
from llmtrial.core.trial_checks import CHECK_ERROR, canonical_args
from llmtrial.core.trial_config import TRIAL_KEYS, OutputsBlock, TrialConfig
from llmtrial.host.nodes import number_slurm_nodes
from llmtrial.serve.datasets import check_dataset
from llmtrial.serve.scenarios import contexts

SCHEMA_PATH = SCHEMAS / CONFIG_SCHEMA


class ConfigError(ValueError):
    """The trial configuration does not match the schema."""


#: What pydantic puts in an error's location for the member of a union it tried (``int``,
#: ``list[int]``, ``PassesRuleBlock``, ``function-after[...]``): never a key of the trial file, whose keys
#: are snake_case and whose names (configurations, scenarios, ...) are in the data the path walks.
_UNION_MEMBER = re.compile(r"(int|str|float|bool|none|[A-Z]\w*|.*[\[\]-].*)")


def key_path(loc: tuple[int | str, ...], data: Any) -> str:
    """The dotted key an error's location names in ``data``, the members of a union it went through left out."""
    parts, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) and part < len(node):
            parts.append(str(part))
            node = node[part]
        elif not (isinstance(part, str) and _UNION_MEMBER.fullmatch(part)):
            parts.append(str(part))  # a key that is missing, or not one of the block's
            node = None
    return ".".join(parts) or "(top level)"


def _message(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(error["loc"][-1]), TRIAL_KEYS, n=1)
        return "not a key of this block" + (f" (did you mean {close[0]!r}?)" if close else "")
    if error["type"] == "missing":
        return "missing: a required key"
    if error["type"] == CHECK_ERROR:  # a check across keys (llmtrial.core.trial_checks) says it all
        return str(error["msg"])
    shown = repr(error["input"])
    return f"{shown if len(shown) <= 80 else shown[:77] + '...'}: {error['msg']}"


def model_problems(exc: ValidationError, data: Any, source: str) -> list[str]:
    """One line per error (its key and what is wrong), each key once: a value no member of a union
    takes is named with the first member's complaint, or where one member got further, with what is
    wrong deeper in it (``range_ratio.output``, not "range_ratio: not a number")."""
    seen: dict[str, str] = {}
    for error in exc.errors():
        seen.setdefault(key_path(error["loc"], data), _message(error))
    deepest = {key: message for key, message in seen.items() if not any(k.startswith(key + ".") for k in seen)}
    return [f"{source} key '{key}': {message}" for key, message in sorted(deepest.items())]


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline({**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """The trial file's JSON Schema as generated from its model, each ``$ref`` replaced by what it names
    (one tree to read: every key with its description and default)."""
    schema = json.loads(path.read_text(encoding="utf-8"))
    return _inline(schema, schema.get("$defs", {}))


def check_config(config: dict[str, Any], *, source: str = "config") -> TrialConfig:
    """Check ``config`` against :class:`~llmtrial.core.trial_config.TrialConfig`, fill its defaults in place
    and return it as the model (what the workflow builds once); raise ConfigError naming each bad key."""
    try:
        trial = TrialConfig.model_validate(config)
    except ValidationError as exc:
        raise ConfigError("invalid trial configuration:\n  " + "\n  ".join(model_problems(exc, config, source))) from None
    config.clear()
    config.update(trial.model_dump())
    # what the model cannot say alone: the files a scenario's dataset and the task set read
    problems = [f"{source} key '{line.split(': ', 1)[0]}': {line.split(': ', 1)[1]}"
                for name, spec in trial.scenarios.items() for line in check_dataset(f"scenarios.{name}", spec)]
    if trial.outputs is not None:
        try:
            task_set(trial.outputs)
        except TaskSetError as exc:
            problems.append(f"{source} key 'outputs': {exc}")
    if problems:
        raise ConfigError("invalid trial configuration:\n  " + "\n  ".join(problems))
    number_slurm_nodes(config)
    return TrialConfig.model_validate(config) if any(b.reach == "slurm" for b in trial.nodes.values()) else trial


def validate_config(config: dict[str, Any], *, source: str = "config") -> dict[str, Any]:
    """:func:`check_config`, returning the filled ``config`` itself."""
    check_config(config, source=source)
    return config


def task_params(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The trial's task set as plain data (a rule's params, so a changed task file reruns the
    configurations); empty when ``outputs`` is null."""
    return [t.model_dump(mode="json") for t in task_set(OutputsBlock.model_validate(config["outputs"]))] \
        if config["outputs"] else []


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file and validate it (used by the command line)."""
    p = Path(path)
    try:
        with open(p, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read it: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return validate_config(data, source=str(p))


def scenario_contexts(trial: TrialConfig) -> list[int]:
    """The context lengths the scenarios reach (input + output), for the preemption boundary."""
    return sorted(set().union(*(contexts(s) for s in trial.scenarios.values())))


def configuration_port(trial: TrialConfig, name: str) -> int:
    """The port of configuration ``name``: base_port plus its position in the file."""
    return trial.serving.base_port + list(trial.configurations).index(name)


def configuration_spec(trial: TrialConfig, name: str) -> ConfigurationSpec:
    """Everything one configuration's job needs, and nothing another configuration changes.

    The plan and trial rules pass it as a param (as its JSON data), so editing one configuration's
    args reruns only that configuration.
    """
    serving, entry = trial.serving, trial.configurations[name]
    spread = len(entry.nodes) >= 2  # a single-host configuration's spec names no nodes
    return ConfigurationSpec(
        name=name, description=entry.description, force=entry.force, host=serving.host,
        port=configuration_port(trial, name), args={**canonical_args(serving.args), **canonical_args(entry.args)},
        env={**serving.env, **entry.env}, startup_timeout_s=serving.startup_timeout_s,
        stop_timeout_s=serving.stop_timeout_s,
        idle_watch_s=serving.idle_watch_s,
        nodes={n: trial.nodes[n] for n in entry.nodes} if spread else {},
        staging_dir=trial.staging_dir if spread else None, launch=entry.launch if spread else None)
