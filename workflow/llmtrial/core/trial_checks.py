"""The trial file's model's shared parts: its number type (:data:`Number`), its names' patterns (:class:`keys`), and
what its checks across keys share (:mod:`llmtrial.core.trial_config` runs them as its model's
validators): each check returns its problems as (key path under the block it checks, message), and
:func:`raise_problems` hands them to pydantic at those keys, so the loader lists them with every other
error of the file. The checks that need no model are here (arguments, ssh options, a cost's price, where a
file patch may go); those that read a block's fields are beside the blocks.

The model checks what a trial file says alone: arguments spelled twice, a sweep's lists, a passes rule, an
SLO with no target, a cost without its price, nodes and services naming nodes the trial lacks, refused ssh
options, the nodes' GPU counts against the trial's and each configuration's, a pinned CUDA_VISIBLE_DEVICES, a file patch on a node other than this host, the report's baseline, prefix caching
across nodes. What needs the disk (a prompt file, the task set) is checked by the loader after the model
(:func:`llmtrial.config.validate_config`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

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


def _as_given(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A number checked as a float and kept as given: an integer stays an integer, so a resolved
    trial file (and its hash in the provenance record) is what the file said."""
    checked = handler(value)
    return value if type(value) is int else checked


#: A JSON number (an integer or not), its bounds checked, its value kept as the file gave it.
Number = Annotated[float, WrapValidator(_as_given)]


@dataclass(frozen=True)
class keys:  # noqa: N801 (used as an annotation's marker: ``Annotated[dict[str, X], keys(PATTERN)]``)
    """A mapping's keys held to ``pattern``: a key that breaks it is named in the error, and the JSON
    Schema says it as ``propertyNames``."""

    pattern: str

    def check(self, value: dict[str, Any]) -> dict[str, Any]:
        bad = [key for key in value if not re.match(self.pattern, key)]
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))} does not match {self.pattern!r}")
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**handler(schema), "propertyNames": {"pattern": self.pattern}}


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


def world_size(*blocks: Mapping[str, Any]) -> int | None:
    """GPUs a configuration's ranks occupy: tensor x pipeline x data parallel size of its args ``blocks``
    (serving.args, then its own: later over earlier, each read by :func:`canonical_args`); None where a
    size is not an integer."""
    merged = {k: v for block in blocks for k, v in canonical_args(block).items()}
    try:
        return math.prod(int(merged.get(k, 1)) for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                                           "data_parallel_size"))
    except (TypeError, ValueError):
        return None


def option_key(option: str) -> str:
    """An ssh option's key as ssh compares them (``Key=value``: the key, lowercase)."""
    return option.split("=", 1)[0].strip().lower()


def option_problem(option: str) -> str | None:
    """Why ``option`` (``Key=value``) may not be given to ssh from the trial file, or None."""
    if "=" not in option or not option.split("=", 1)[0].strip().isalnum():
        return f"{option!r} is not Key=value"
    reason = REFUSED_OPTIONS.get(option_key(option))
    return f"{option.split('=', 1)[0]} {reason}" if reason else None


def reach_problems(reach: str, address: str | None, options: Sequence[str]) -> list[Problem]:
    """A node reached over ssh without an address (``ssh.address``), a refused ssh option (``ssh.options``)."""
    problems: list[Problem] = []
    if reach == "ssh" and not address:
        problems.append((("ssh", "address"), "a node reached over ssh needs an address"))
    return problems + [(("ssh", "options", i), f"ssh option {problem}")
                       for i, option in enumerate(options) if (problem := option_problem(option))]


def cost_problems(price: float | None, currency: str | None) -> list[Problem]:
    """A cost block without its price or its currency (the model fills the rest)."""
    wanted = {"price": (price, "the price of one accelerator-hour or host-hour, a number above 0"),
              "currency": (currency, "the currency of the price, an ISO 4217 code such as USD or EUR")}
    return [((key,), f"missing: give {what}") for key, (value, what) in wanted.items() if value is None]


def file_patches_elsewhere(modes: Mapping[str, tuple[str, Mapping[str, str]]], spans: Mapping[str, Sequence[str]],
                           here: set[str]) -> list[Problem]:
    """A patch in mode file on a node of a configuration spanning nodes other than the one the workflow runs on
    (``here``: the nodes reached locally): mode file rewrites this host's vLLM only. ``modes``: each patch's mode
    and its modes by node; ``spans``: each configuration spanning nodes, with its nodes."""
    problems: list[Problem] = []
    for pname, (mode, by_node) in modes.items():
        elsewhere = [(c, n) for c, nodes in spans.items() for n in nodes if n not in here and by_node.get(n, mode) == "file"]
        if elsewhere:
            config, node = elsewhere[0]
            where = ("patches", pname, "nodes", node) if node in by_node else ("patches", pname, "mode")
            problems.append((where, f"mode file changes the vLLM of the host the workflow runs on only, and "
                             f"configuration {config!r} spans node {node!r}: give the patch mode plugin there "
                             f"(nodes: {{{node}: plugin}}), which is carried to the node"))
    return problems


def gpu_count_problems(counts: Mapping[str, int | None], gpus: int | Sequence[int | str] | None,
                       spans: Mapping[str, tuple[Sequence[str], int | None]]) -> list[Problem]:
    """The GPUs each node gives the trial (``counts``: each node's ``gpus``, None where not given) against the
    trial's (``gpus``: hardware.gpus) and each configuration's (``spans``: its nodes, and its world size, None where
    not checked: a forced configuration). A count on some nodes only, a hardware.gpus other than their sum, a
    configuration whose nodes give fewer GPUs than its ranks occupy or one of them none. Nothing when no node
    gives a count."""
    given = {n: c for n, c in counts.items() if c is not None}
    if not given:
        return []
    shown = " + ".join(f"{n} {c}" for n, c in given.items())
    problems: list[Problem] = [(("nodes", n, "gpus"), f"missing: node(s) {', '.join(given)} give their GPUs, so every "
                                "node must (0 for a node without)") for n, c in counts.items() if c is None]
    total = sum(given.values())
    if not isinstance(gpus, int) or gpus != total:
        why = (f"{gpus} GPUs, but the nodes' gpus add up to {total} ({shown})" if isinstance(gpus, int) else
               f"{gpus!r} names GPUs of this host alone; give the trial's count, {total} (the nodes' gpus: {shown})")
        problems.append((("hardware", "gpus"), why))
    for name, (nodes, world) in spans.items() if len(given) == len(counts) else ():
        have = sum(given.get(n, 0) for n in nodes)
        parts = " + ".join(f"{n} {given[n]}" for n in nodes if n in given)
        if world is not None and world > have:
            problems.append((("configurations", name, "nodes"), f"its ranks occupy {world} GPUs (tensor x pipeline x "
                             f"data parallel size), its nodes give {have} ({parts}): lower a parallel size, span "
                             "more nodes, or set force: true to launch it anyway"))
        idle = [n for n in nodes if given.get(n) == 0]
        if total and len(nodes) > 1 and idle:
            problems.append((("configurations", name, "nodes"), f"node(s) {', '.join(idle)} give no GPU (gpus: 0) to "
                             "a configuration whose ranks run on GPUs: leave them out of its nodes"))
    return problems
