"""The trial file's checks across keys, run as its model's validators (:mod:`llmtrial.core.trial_config`):
each returns its problems as (key path under the block it checks, message), and :func:`raise_problems`
hands them to pydantic at those keys, so the loader lists them with every other error of the file.

What a trial file says alone is checked here: arguments spelled twice, a sweep's lists, a passes rule, an
SLO with no target, a cost without its price, nodes and services naming nodes the trial lacks, refused ssh
options, a pinned CUDA_VISIBLE_DEVICES, a file patch across nodes, the report's baseline, prefix caching
across nodes. What needs the disk (a prompt file, the task set) is checked by the loader after the model
(:func:`llmtrial.config.validate_config`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

if TYPE_CHECKING:
    from llmtrial.core.trial_config import ScenarioBlock, TrialConfig

#: A problem: where it is (keys under the block checked) and what is wrong.
Problem = tuple[tuple[str | int, ...], str]
#: The pydantic error type of a check's problem (the loader shows its message as it is).
CHECK_ERROR = "trial_check"

#: Short names of vLLM arguments that its CLI spells otherwise; translated once, here.
ARG_ALIASES = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size"}
#: A scenario's keys that a sweep lists, one value per step.
SWEEP_KEYS = ("concurrency", "input_len", "output_len", "num_prompts")
#: The dataset whose scenarios need prefix caching on (vLLM bench's prefix_repetition).
PREFIX_DATASET = "prefix_repetition"
#: ssh options the trial file may not give (each would run a local shell command, or waits for a person).
REFUSED_OPTIONS = {
    "proxycommand": "runs a command through a shell on this host",
    "localcommand": "runs a command through a shell on this host",
    "permitlocalcommand": "enables LocalCommand, a command run through a shell on this host",
    "knownhostscommand": "runs a command through a shell on this host",
    "batchmode": "is always yes: the trial never waits for a password or a prompt",
}


def raise_problems(title: str, problems: Iterable[Problem]) -> None:
    """Raise the problems a validator found, each at its key (pydantic prefixes the block's own location)."""
    found = [InitErrorDetails(type=PydanticCustomError(CHECK_ERROR, "{message}", {"message": message}), loc=loc,
                              input=None) for loc, message in problems]
    if found:
        raise ValidationError.from_exception_data(title, found)


def canonical_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration's vLLM ``args`` under vLLM's own names, the one reading of them that the
    planner and the server's argv both use: leading dashes dropped, dashes as underscores,
    :data:`ARG_ALIASES` translated. Two spellings of one argument are refused (ValueError
    naming both), whatever their values."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in args.items():
        name = str(key).lstrip("-").replace("-", "_")
        name = ARG_ALIASES.get(name, name)
        if name in out:
            raise ValueError(f"{spelled[name]!r} and {key!r} both set {name}: keep one")
        out[name], spelled[name] = value, str(key)
    return out


def args_problems(args: Mapping[str, Any]) -> list[Problem]:
    """An args block that spells one vLLM argument twice."""
    try:
        canonical_args(args)
    except ValueError as exc:
        return [(("args",), str(exc))]
    return []


def option_key(option: str) -> str:
    """An ssh option's key as ssh compares them (``Key=value``: the key, lowercase)."""
    return option.split("=", 1)[0].strip().lower()


def option_problem(option: str) -> str | None:
    """Why ``option`` (``Key=value``) may not be given to ssh from the trial file, or None."""
    if "=" not in option or not option.split("=", 1)[0].strip().isalnum():
        return f"{option!r} is not Key=value"
    reason = REFUSED_OPTIONS.get(option_key(option))
    return f"{option.split('=', 1)[0]} {reason}" if reason else None


def scenario_problems(spec: ScenarioBlock) -> list[Problem]:
    """A sweep's lists (not empty, increasing, one value per step each), a passes rule whose min is
    over its max, an SLO with no target."""
    problems: list[Problem] = []
    lists = {k: v for k in SWEEP_KEYS if isinstance(v := getattr(spec, k), list)}
    for k, values in lists.items():
        if not values:
            problems.append(((k,), "a sweep's list is empty"))
        elif k != "num_prompts" and any(b <= a for a, b in zip(values, values[1:], strict=False)):
            problems.append(((k,), f"a sweep's values must increase, step by step (got {values})"))
        elif k == "num_prompts" and any(b < a for a, b in zip(values, values[1:], strict=False)):
            problems.append(((k,), f"a sweep's prompt counts must not decrease (got {values})"))
    if len({len(v) for v in lists.values()} - {0}) > 1:
        listed = ", ".join(f"{k} ({len(v)})" for k, v in lists.items())
        problems.append(((), f"a sweep's lists must have one value per step, the same count each: {listed}"))
    passes = spec.passes
    if not isinstance(passes, int) and passes.min > passes.max:
        problems.append((("passes", "min"), f"{passes.min} is more than passes.max ({passes.max})"))
    slo = spec.slo
    if slo is not None and all(v is None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2el_ms)):
        problems.append((("slo",), "give at least one target (ttft_ms, tpot_ms, e2el_ms)"))
    return problems


def node_problems(trial: TrialConfig) -> list[Problem]:
    """An ssh node without an address, a refused ssh option, a configuration or a service naming a node
    the trial lacks."""
    problems: list[Problem] = []
    for name, block in trial.nodes.items():
        if block.reach == "ssh" and not block.ssh.address:
            problems.append((("nodes", name, "ssh", "address"), "a node reached over ssh needs an address"))
        problems += [(("nodes", name, "ssh", "options", i), f"ssh option {problem}")
                     for i, option in enumerate(block.ssh.options) if (problem := option_problem(option))]
    known = ", ".join(trial.nodes) if trial.nodes else "the trial lists no nodes"
    for cname, entry in trial.configurations.items():
        problems += [(("configurations", cname, "nodes"), f"{node!r} is not a node of this trial ({known})")
                     for node in entry.nodes if node not in trial.nodes]
    return problems + [(("services", sname, "node"), f"{entry.node!r} is not a node of this trial ({known})")
                       for sname, entry in trial.services.items() if entry.node is not None and entry.node not in trial.nodes]


def placement_problems(trial: TrialConfig) -> list[Problem]:
    """An env that sets CUDA_VISIBLE_DEVICES while hardware.gpus lists the GPUs (the census and telemetry
    would watch other GPUs than the server used); a file patch while a configuration spans nodes (it
    changes this host only); prefix caching across nodes (the relaunch with it on is done on one host
    only); a report baseline that is not a configuration."""
    problems: list[Problem] = []
    if isinstance(trial.hardware.gpus, list):
        envs = [(("serving", "env"), trial.serving.env),
                *((("configurations", n, "env"), e.env) for n, e in trial.configurations.items())]
        problems += [((*key, "CUDA_VISIBLE_DEVICES"), "hardware.gpus lists the trial's GPUs and pins the servers to "
                      "them (by UUID): leave CUDA_VISIBLE_DEVICES out of the env") for key, env in envs
                     if "CUDA_VISIBLE_DEVICES" in env]
    spread = [name for name, entry in trial.configurations.items() if len(entry.nodes) > 1]
    if spread:
        problems += [(("patches", name, "mode"), f"mode file changes this host's vLLM only, and configuration "
                      f"{spread[0]!r} spans more than one node: use mode plugin, which is carried to every node")
                     for name, entry in trial.patches.items() if entry.mode == "file"]
    cached = [name for name, spec in trial.scenarios.items() if spec.dataset == PREFIX_DATASET]
    for name in spread if cached else []:
        try:
            args = {**canonical_args(trial.serving.args), **canonical_args(trial.configurations[name].args)}
        except ValueError:  # an argument spelled twice: its args' own check names it
            continue
        if not args.get("enable_prefix_caching"):
            problems.append((("configurations", name), f"spans nodes, and scenario {cached[0]} ({PREFIX_DATASET}) "
                             "needs its server launched again with prefix caching on, which is done on one host "
                             "only: set enable_prefix_caching: true in its args to run every scenario with prefix "
                             "caching on"))
    baseline = trial.report.baseline
    if baseline is not None and baseline not in trial.configurations:
        problems.append((("report", "baseline"), f"{baseline!r} is not a configuration of this trial "
                         f"({', '.join(trial.configurations)})"))
    return problems


def cost_problems(price: float | None, currency: str | None) -> list[Problem]:
    """A cost block without its price or its currency (the model fills the rest)."""
    wanted = {"price": (price, "the price of one accelerator-hour or host-hour, a number above 0"),
              "currency": (currency, "the currency of the price, an ISO 4217 code such as USD or EUR")}
    return [((key,), f"missing: give {what}") for key, (value, what) in wanted.items() if value is None]
