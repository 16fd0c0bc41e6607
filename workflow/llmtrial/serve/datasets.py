"""What a scenario's benchmark sends, mapped onto vLLM bench's own dataset flags: vLLM's random
dataset (with its range ratio), the operator's own prompts (a ``custom`` JSONL file or a ShareGPT
JSON file), or vLLM's ``prefix_repetition`` dataset.

A prompt file is read when the trial file is loaded: a file that is missing or malformed is refused
there, naming the scenario, the file and the line, before any server starts. The ``stage_prompts``
rule copies it into the trial's results (``results/<trial>/prompts/<scenario>.jsonl`` or ``.json``)
and writes the ``prompts`` record with each copy's sha256; the benchmark reads the staged copy.
So a later edit of the operator's file never changes a pass silently: the file is the rule's input,
so Snakemake stages it again and the configurations run again, and a staged copy whose bytes no
longer match its record is refused when a configuration's job starts.

Every request of a file scenario generates ``output_len`` tokens (``--custom-output-len`` or
``--sharegpt-output-len``, with ``--ignore-eos``), and a pass sends each prompt at most once
(``--no-oversample``), in an order drawn from the pass's seed.

A ``prefix_repetition`` scenario runs with prefix caching on, which the trial otherwise turns off:
its configuration's server is launched again with ``--enable-prefix-caching`` after the other
scenarios (:mod:`llmtrial.serve.measure`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.fileio import atomic_write_bytes, sha256_file
from llmtrial.core.record_models import PromptsRecord, StagedPrompts
from llmtrial.core.scenario_model import ScenarioSpec
from llmtrial.core.trial_checks import PREFIX_DATASET
from llmtrial.core.trial_config import RangeRatioBlock, ScenarioBlock

#: vLLM bench's --dataset-name values a scenario may name.
DATASETS = ("random", "custom", "sharegpt", "prefix_repetition")
#: The datasets read from the operator's file, each with its staged copy's suffix (vLLM reads custom from .jsonl only).
FILE_SUFFIX = {"custom": ".jsonl", "sharegpt": ".json"}
#: The dataset keys' defaults, the trial file's model's: a scenario recorded before the keys existed reads as these.
DEFAULTS: dict[str, Any] = {key: ScenarioBlock.model_fields[key].default
                            for key in ("dataset", "prompts", "chat_template", "range_ratio", "prefix_len", "num_prefixes")}


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file and, where it can, the line."""


@dataclass(frozen=True)
class PassLoad:
    """What one benchmark run sends: a fixed scenario's counts and lengths, or one step of a sweep's
    (``step`` counts from 1; None for a fixed scenario's pass)."""

    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    step: int | None = None

    @classmethod
    def at(cls, spec: ScenarioBlock, index: int = 0, step: int | None = None) -> PassLoad:
        """The values at position ``index`` of a sweep's lists (a scalar repeats on every step)."""
        return cls(_at(spec.concurrency, index), _at(spec.num_prompts, index), _at(spec.input_len, index),
                   _at(spec.output_len, index), step)


def _at(value: int | list[int], index: int) -> int:
    return int(value[index]) if isinstance(value, list) else int(value)


@dataclass(frozen=True)
class JobScenario:
    """A scenario as a configuration's job runs it: the trial file's block and, for a prompt file's
    scenario, its staged copy (the prompts record's entry, checked against its sha256)."""

    block: ScenarioBlock
    staged: StagedPrompts | None = None

    def spec(self) -> ScenarioSpec:
        """The scenario as the configuration record keeps it: the block, with the staged copy's path, sha256
        and prompt count for a prompt file's scenario."""
        copy = {} if self.staged is None else {"prompts_staged": self.staged.staged,
                                               "prompts_sha256": self.staged.sha256,
                                               "prompts_count": self.staged.prompts}
        return ScenarioSpec.model_validate({**self.block.model_dump(), **copy})


def needs_prefix_caching(spec: ScenarioBlock) -> bool:
    """Whether the scenario runs with prefix caching on (the prefix_repetition dataset)."""
    return spec.dataset == PREFIX_DATASET


# --------------------------------------------------------------------------- reading a prompt file


def count_prompts(path: str | Path, dataset: str) -> int:
    """The prompts in the ``custom`` or ``sharegpt`` file at ``path``; PromptFileError naming the file
    and line at fault. The count is cached by the file's size and mtime (a ShareGPT dump is large, and
    the trial file is loaded by every snakemake call)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise PromptFileError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if not p.is_file():
        raise PromptFileError(f"{p}: not a file")
    return _cached_count(str(p), dataset, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _cached_count(path: str, dataset: str, size: int, mtime_ns: int) -> int:
    return read_count(Path(path).read_bytes(), dataset, path)


def read_count(data: bytes, dataset: str, name: str) -> int:
    """The prompts in ``data``, the bytes of a ``dataset`` file called ``name`` in messages."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PromptFileError(f"{name} line {line}: not UTF-8") from None
    count = _custom_count(text, name) if dataset == "custom" else _sharegpt_count(text, name)
    if count == 0:
        raise PromptFileError(f"{name}: holds no prompt")
    return count


def _parsed(text: str, name: str, line: int | None, kind: type, shape: str) -> Any:
    """``text`` parsed as JSON of ``kind``; PromptFileError naming file ``name`` and ``line`` (None: the whole
    file, its line the parser's) when it is not JSON or not ``shape``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptFileError(f"{name} line {line or exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(data, kind):
        raise PromptFileError(f"{name} line {line or 1}: {shape}, not a {type(data).__name__}")
    return data


def _custom_count(text: str, name: str) -> int:
    """vLLM's custom format: one JSON object per line with a ``prompt`` string (blank lines skipped,
    as vLLM's reader skips them)."""
    count = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        raw = _parsed(line, name, number, dict, 'a line is a JSON object such as {"prompt": "..."}')
        if not isinstance(raw.get("prompt"), str) or not raw["prompt"].strip():
            raise PromptFileError(f"{name} line {number}: no 'prompt' string")
        count += 1
    return count


def _sharegpt_count(text: str, name: str) -> int:
    """vLLM's ShareGPT format: a JSON list of objects whose ``conversations`` hold at least two turns
    (the prompt, then the reply), each an object with a ``value`` string. vLLM skips an entry with
    fewer turns; it is refused here, since the operator meant it as a prompt."""
    data = _parsed(text, name, None, list, "a ShareGPT file is a JSON list of conversations")
    for entry, line in zip(data, _element_lines(text), strict=True):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            raise PromptFileError(f"{name} line {line}: an entry is an object whose 'conversations' list holds "
                                  "at least two turns (the prompt and its reply)")
        for turn in turns[:2]:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise PromptFileError(f"{name} line {line}: each of the first two turns is an object with a "
                                      "'value' string")
        if not turns[0]["value"].strip():
            raise PromptFileError(f"{name} line {line}: the first turn's 'value' (the prompt) is empty")
    return len(data)


_BETWEEN = re.compile(r"[\s,]*")


def _element_lines(text: str) -> list[int]:
    """The line each element of the JSON list ``text`` (already parsed) begins on."""
    decoder = json.JSONDecoder()
    pos = _BETWEEN.match(text, text.index("[") + 1).end()  # type: ignore[union-attr]
    lines, line, seen = [], 1, 0
    while text[pos] != "]":
        line, seen = line + text.count("\n", seen, pos), pos
        lines.append(line)
        _, pos = decoder.raw_decode(text, pos)
        pos = _BETWEEN.match(text, pos).end()  # type: ignore[union-attr]
    return lines


# --------------------------------------------------------------------------- checking a scenario


def _values(value: int | list[int]) -> list[int]:
    return list(value) if isinstance(value, list) else [value]


def check_dataset(key: str, spec: ScenarioBlock) -> list[str]:
    """What is wrong with a scenario's dataset keys (``key``: ``scenarios.<name>``), each problem as
    ``<key>.<field>: <message>``; a prompt file is read here, so a missing or malformed one is named
    with its line before anything runs."""
    dataset = spec.dataset
    errors = _misplaced(key, spec, dataset)
    if dataset == PREFIX_DATASET:
        errors += _check_prefix(key, spec)
    if dataset in FILE_SUFFIX:
        errors += _check_file(key, spec, dataset)
    return errors


def _misplaced(key: str, spec: ScenarioBlock, dataset: str) -> list[str]:
    """Keys given to a dataset that does not read them."""
    errors = []
    if dataset in FILE_SUFFIX and not spec.prompts:
        errors.append(f"{key}.prompts: dataset {dataset} reads the operator's prompt file: name it")
    if dataset not in FILE_SUFFIX and spec.prompts:
        errors.append(f"{key}.prompts: only datasets {' and '.join(FILE_SUFFIX)} read a prompt file "
                      f"(this scenario's dataset is {dataset})")
    if spec.chat_template and dataset != "custom":
        errors.append(f"{key}.chat_template: only dataset custom applies a chat template (this one is {dataset})")
    if spec.range_ratio is not None and dataset != "random":
        errors.append(f"{key}.range_ratio: only dataset random varies its lengths (this one is {dataset})")
    if dataset != PREFIX_DATASET:
        if spec.prefix_len is not None:
            errors.append(f"{key}.prefix_len: only dataset {PREFIX_DATASET} repeats prefixes (this one is {dataset})")
        if spec.num_prefixes != 1:
            errors.append(f"{key}.num_prefixes: only dataset {PREFIX_DATASET} repeats prefixes (this one is {dataset})")
    return errors


def _check_prefix(key: str, spec: ScenarioBlock) -> list[str]:
    prefix, count = spec.prefix_len, spec.num_prefixes
    errors = []
    if prefix is None:
        errors.append(f"{key}.prefix_len: dataset {PREFIX_DATASET} needs the shared prefix's length in tokens")
    elif any(n <= prefix for n in _values(spec.input_len)):
        errors.append(f"{key}.input_len: the whole prompt ({spec.input_len}) must be longer than its shared "
                      f"prefix (prefix_len {prefix}): the rest is each prompt's own suffix")
    if any(n % count for n in _values(spec.num_prompts)):
        errors.append(f"{key}.num_prompts: {spec.num_prompts} is not a multiple of num_prefixes ({count}): "
                      "vLLM sends num_prompts // num_prefixes prompts per prefix")
    return errors


def _check_file(key: str, spec: ScenarioBlock, dataset: str) -> list[str]:
    if not spec.prompts:
        return []
    errors = []
    if isinstance(spec.input_len, list):
        errors.append(f"{key}.input_len: a sweep cannot vary it: the prompts of a {dataset} file have their own lengths")
    try:
        count = count_prompts(spec.prompts, dataset)  # relative: to the working directory, as every trial path
    except PromptFileError as exc:
        return [*errors, f"{key}.prompts: {exc}"]
    most = max(_values(spec.num_prompts))
    if most > count:
        errors.append(f"{key}.num_prompts: {most} is more than the {count} prompts in {spec.prompts}: a pass "
                      "sends each prompt at most once")
    return errors


# --------------------------------------------------------------------------- the benchmark's flags


def length_ratio(range_ratio: float | RangeRatioBlock | Mapping[str, float] | None, part: str = "output") -> float:
    """The range ratio of the output (or ``part``) length in a ``range_ratio`` value: one ratio for both, or
    ``{input, output}`` (the trial file's block, or a record's mapping; 0 when unset)."""
    if isinstance(range_ratio, RangeRatioBlock):
        return float(range_ratio.input if part == "input" else range_ratio.output)
    if isinstance(range_ratio, Mapping):
        return float(range_ratio.get(part, 0.0))
    return float(range_ratio or 0.0)


def _ratio_flag(range_ratio: float | RangeRatioBlock) -> str:
    if isinstance(range_ratio, RangeRatioBlock):
        return json.dumps({"input": float(range_ratio.input), "output": float(range_ratio.output)},
                          separators=(",", ":"))
    return str(float(range_ratio))


def dataset_flags(scenario: JobScenario, load: PassLoad) -> list[str]:
    """vLLM bench's dataset flags for one pass (or sweep step) ``load`` of ``scenario``; a file scenario must
    carry its staged copy (:func:`with_staged`)."""
    spec = scenario.block
    dataset = spec.dataset
    out = ["--dataset-name", dataset]
    if dataset == "random":
        out += ["--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len)]
        if spec.range_ratio is not None:
            out += ["--random-range-ratio", _ratio_flag(spec.range_ratio)]
    elif dataset == PREFIX_DATASET:
        prefix = int(spec.prefix_len or 0)
        out += ["--prefix-repetition-prefix-len", str(prefix),
                "--prefix-repetition-suffix-len", str(load.input_len - prefix),
                "--prefix-repetition-num-prefixes", str(spec.num_prefixes),
                "--prefix-repetition-output-len", str(load.output_len)]
    else:
        if scenario.staged is None:
            raise PromptFileError(f"the {dataset} prompt file {spec.prompts} is not staged")
        out += ["--dataset-path", scenario.staged.staged, f"--{dataset}-output-len", str(load.output_len),
                "--no-oversample"]
        if dataset == "custom" and not spec.chat_template:
            out.append("--skip-chat-template")
    return out


def context(spec: ScenarioBlock, load: PassLoad) -> int | None:
    """The longest context (prompt plus output tokens) one pass ``load`` of ``spec`` reaches, or None where the
    trial cannot know it before the prompts are tokenized (a prompt file)."""
    if spec.dataset in FILE_SUFFIX:
        return None
    if spec.dataset == "random" and spec.range_ratio is not None:
        ratio = spec.range_ratio
        return (math.ceil(load.input_len * (1 + length_ratio(ratio, "input")))
                + math.ceil(load.output_len * (1 + length_ratio(ratio))))
    return load.input_len + load.output_len


# --------------------------------------------------------------------------- staging


def file_scenarios(scenarios: Mapping[str, ScenarioBlock]) -> dict[str, ScenarioBlock]:
    """The scenarios that read a prompt file, by name."""
    return {name: spec for name, spec in scenarios.items() if spec.dataset in FILE_SUFFIX}


def stage_prompts(scenarios: Mapping[str, ScenarioBlock], folder: Path) -> PromptsRecord:
    """Copy each file scenario's prompt file into ``folder`` as ``<scenario>.jsonl`` (or ``.json``), read
    once: the bytes copied are the bytes checked and hashed."""
    staged: dict[str, StagedPrompts] = {}
    for name, spec in file_scenarios(scenarios).items():
        dataset, source = spec.dataset, Path(str(spec.prompts))
        data = source.read_bytes()
        count = read_count(data, dataset, str(source))
        target = Path(folder) / f"{name}{FILE_SUFFIX[dataset]}"
        atomic_write_bytes(target, data)
        staged[name] = StagedPrompts(dataset=dataset, source=str(spec.prompts), staged=str(target),
                                     sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), prompts=count)
    return PromptsRecord(staged_at=time.time(), scenarios=staged)


def with_staged(scenarios: Mapping[str, ScenarioBlock], record: PromptsRecord | None = None) -> dict[str, JobScenario]:
    """The scenarios as a configuration's job runs them: each file scenario with its staged copy (path,
    sha256 and prompt count), once the copy is checked to hold the bytes its record hashed."""
    out = {name: JobScenario(spec) for name, spec in scenarios.items()}
    for name in file_scenarios(scenarios):
        staged = record.scenarios.get(name) if record is not None else None
        if staged is None:
            raise PromptFileError(f"scenario {name}: its prompt file is not staged (the stage_prompts rule)")
        try:
            now = sha256_file(staged.staged)
        except OSError as exc:
            raise PromptFileError(f"{staged.staged}: the staged prompts of scenario {name} cannot be read "
                                  f"({exc.strerror or exc}); stage them again: snakemake --forcerun stage_prompts") from None
        if now != staged.sha256:
            raise PromptFileError(f"{staged.staged}: the staged prompts of scenario {name} changed since they were "
                                  f"staged (sha256 {now}, recorded {staged.sha256}); stage them again: "
                                  "snakemake --forcerun stage_prompts")
        out[name] = JobScenario(scenarios[name], staged)
    return out
