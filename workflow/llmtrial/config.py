"""Trial configuration: validation against the JSON Schema, defaults, and derived values.

The schema (``workflow/llmtrial/schemas/config.schema.yaml``) is the single description of every
key. :func:`validate_config` fills defaults in place and raises :class:`ConfigError`
listing every problem by its dotted key, so a typo names itself.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match

from llmtrial.answers.tasks import TaskSetError, task_set
from llmtrial.core.cost import check_cost
from llmtrial.core.resources import SCHEMAS
from llmtrial.host.gpus import check_pinning
from llmtrial.host.nodes import check_nodes, number_slurm_nodes
from llmtrial.patch.node_patches import check_patch_modes
from llmtrial.plan.plan_inputs import canonical_args
from llmtrial.serve.datasets import check_prefix_nodes
from llmtrial.serve.scenarios import check_scenario, contexts

SCHEMA_PATH = SCHEMAS / "config.schema.yaml"


class ConfigError(ValueError):
    """The trial configuration does not match the schema."""


def _with_defaults(validator_class: type) -> type:
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema) -> Iterator[ValidationError]:  # type: ignore[no-untyped-def]
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


def key_path(error: ValidationError) -> str:
    """Dotted key of a validation error, naming the unexpected key where there is one."""
    parts = [str(p) for p in error.absolute_path]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra:
            parts.append(extra[0])
    if error.validator == "required":
        match = re.match(r"'([^']+)' is a required property", error.message)
        if match:
            parts.append(match.group(1))
    return ".".join(parts) or "(top level)"


def _specific(error: ValidationError) -> ValidationError:
    """The most telling of a ``oneOf``'s failures (an item below the minimum rather than
    "not valid under any of the given schemas"); any other error as it is."""
    if error.validator == "oneOf" and error.context:
        return best_match(error.context)
    return error


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def validate_config(config: dict[str, Any], schema_path: Path = SCHEMA_PATH, *, source: str = "config") -> dict[str, Any]:
    """Fill defaults into ``config`` in place and check it; raise ConfigError naming each bad key."""
    schema = load_schema(schema_path)
    validator = _with_defaults(Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{source} key '{key_path(e)}': {e.message}" for e in map(_specific, errors)]
        raise ConfigError("invalid trial configuration:\n  " + "\n  ".join(lines))
    problems = [f"{source} key '{line.split(': ', 1)[0]}': {line.split(': ', 1)[1]}"
                for name, spec in config["scenarios"].items() for line in check_scenario(name, spec)]
    baseline = (config.get("report") or {}).get("baseline")
    if baseline is not None and baseline not in config["configurations"]:
        problems.append(f"{source} key 'report.baseline': {baseline!r} is not a "
                        f"configuration of this trial ({', '.join(config['configurations'])})")
    if config.get("outputs"):
        try:
            task_set(config["outputs"])
        except TaskSetError as exc:
            problems.append(f"{source} key 'outputs': {exc}")
    problems += [f"{source} key '{key}': {message}" for key, message in [*_check_args(config), *check_nodes(config),
                                                                          *check_patch_modes(config),
                                                                          *check_pinning(config),
                                                                          *check_cost(config.get("cost")),
                                                                          *check_prefix_nodes(config)]]
    if problems:
        raise ConfigError("invalid trial configuration:\n  " + "\n  ".join(problems))
    number_slurm_nodes(config)
    return config


def _check_args(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, problem) for each args block that spells one vLLM argument twice."""
    blocks = {"serving.args": config["serving"]["args"],
              **{f"configurations.{n}.args": e["args"] for n, e in config["configurations"].items()}}
    out = []
    for key, args in blocks.items():
        try:
            canonical_args(args)
        except ValueError as exc:
            out.append((key, str(exc)))
    return out


def task_params(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The trial's task set as plain data (a rule's params, so a changed task file reruns the
    configurations); empty when ``outputs`` is null."""
    return [t.model_dump(mode="json") for t in task_set(config["outputs"])] if config.get("outputs") else []


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file and validate it (used by the command line)."""
    p = Path(path)
    with open(p, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return validate_config(data, source=str(p))


def scenario_contexts(config: dict[str, Any]) -> list[int]:
    """The context lengths the scenarios reach (input + output), for the preemption boundary."""
    return sorted(set().union(*(contexts(s) for s in config["scenarios"].values())))


def configuration_port(config: dict[str, Any], name: str) -> int:
    """The port of configuration ``name``: base_port plus its position in the file."""
    names = list(config["configurations"])
    return int(config["serving"]["base_port"]) + names.index(name)


def configuration_spec(config: dict[str, Any], name: str) -> dict[str, Any]:
    """Everything one configuration's job needs, and nothing another configuration changes.

    This is what the trial rule passes as a param, so editing one configuration's args
    reruns only that configuration.
    """
    serving = config["serving"]
    entry = config["configurations"][name]
    return {
        "name": name,
        "description": entry.get("description", ""),
        "force": bool(entry.get("force", False)),
        "host": serving["host"],
        "port": configuration_port(config, name),
        "args": {**canonical_args(serving["args"]), **canonical_args(entry["args"])},
        "env": {**serving["env"], **entry["env"]},
        "startup_timeout_s": serving["startup_timeout_s"],
        "stop_timeout_s": serving["stop_timeout_s"],
        **_spread(config, entry),
    }


def _spread(config: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The nodes a configuration spans (their blocks, in its order), when it spans several:
    a single-host configuration's spec stays as it was."""
    names = entry.get("nodes") or []
    if len(names) < 2:
        return {}
    return {"nodes": {name: config["nodes"][name] for name in names}, "staging_dir": config["staging_dir"],
            "launch": entry.get("launch", "native")}
