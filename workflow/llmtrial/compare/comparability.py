"""What must match before two trials are compared, and what differs.

Checked in this order, each difference kept with its value in each trial:

- the model: its source, the staged files' sha256 (one fingerprint of every file), the Hub commit;
- the workload: per scenario in both trials its spec (concurrency, prompts, input and output
  lengths, request rate, latency target, warm-up, dataset and its keys) and the sha256 of its
  prompt file as staged, the benchmark's base seed, and what vLLM's benchmark was run with
  (dataset, ``--ignore-eos``, from the first pass's argv); then per pass the output tokens served
  against completed requests x output length;
- each configuration's server arguments and environment (serving plus its own);
- vLLM's version and the patches applied (name and mode);
- the hardware: host, CPU, NUMA nodes, GPU count and names, driver;
- how passes were counted and the confidence level (noted only).

A workload difference makes the verdicts it touches "not comparable" (its scope: a scenario, a
configuration's scenario, or the whole trial); a difference in the model, the server, vLLM, the
patches or the hardware is what the comparison measures ("under test").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from llmtrial.compare.trials import TrialResults
from llmtrial.core.comparison_model import Difference
from llmtrial.report.conclusions import fixed_scenarios
from llmtrial.serve.datasets import DEFAULTS as DATASET_DEFAULTS
from llmtrial.serve.datasets import length_ratio

#: The scenario keys that define the work a pass asks for.
WORKLOAD_KEYS = ("concurrency", "num_prompts", "input_len", "output_len", "request_rate", "slo", "warmup",
                 "dataset", "chat_template", "range_ratio", "prefix_len", "num_prefixes")
#: Benchmark flags that define the work, read from a pass's argv (flag -> key); a flag with no value is True.
BENCH_FLAGS = {"--dataset-name": "dataset", "--ignore-eos": "ignore_eos"}


def _diff(aspect: str, key: str, a: Any, b: Any, effect: str, scope: str | None = None) -> list[Difference]:
    return [] if a == b else [Difference(aspect=aspect, key=key, a=a, b=b, effect=effect, scope=scope)]


def _fingerprint(trial: TrialResults) -> str:
    """sha256 over every staged file's path and sha256, sorted: equal exactly when the weights are."""
    lines = sorted(f"{f.path} {f.sha256}" for f in trial.manifest.files)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def model_differences(a: TrialResults, b: TrialResults) -> list[Difference]:
    ma, mb = a.config["model"], b.config["model"]
    out = _diff("model", "model.source", ma["source"], mb["source"], "under test")
    out += _diff("model", "model.files_sha256", _fingerprint(a), _fingerprint(b), "under test")
    ca, cb = (t.manifest.hub.commit if t.manifest.hub else None for t in (a, b))
    return out + _diff("model", "model.commit", ca, cb, "under test")


def bench_flags(trial: TrialResults) -> dict[str, str | bool | None]:
    """The work-defining flags of the first recorded pass's benchmark argv (empty without a pass)."""
    for rec in trial.configurations.values():
        for sc in fixed_scenarios(rec):
            for p in sc.pass_results:
                argv = [str(x) for x in p.argv or []]
                return {key: (argv[argv.index(flag) + 1] if flag != "--ignore-eos" else True) if flag in argv else None
                        for flag, key in BENCH_FLAGS.items()}
    return {}


def workload_differences(a: TrialResults, b: TrialResults) -> list[Difference]:
    out = _diff("workload", "bench.seed", a.config["bench"]["seed"], b.config["bench"]["seed"], "not comparable")
    fa, fb = bench_flags(a), bench_flags(b)
    for key in sorted(set(fa) & set(fb)):
        out += _diff("workload", f"benchmark.{key}", fa[key], fb[key], "not comparable")
    sa, sb = a.config["scenarios"], b.config["scenarios"]
    pa, pb = a.provenance.prompt_files or {}, b.provenance.prompt_files or {}
    for name in [n for n in sa if n in sb]:
        for key in WORKLOAD_KEYS:  # a key the trial file had no default for yet reads as its default now
            va, vb = (s[name].get(key, DATASET_DEFAULTS.get(key)) for s in (sa, sb))
            out += _diff("workload", f"scenarios.{name}.{key}", va, vb, "not comparable", name)
        out += _diff("workload", f"scenarios.{name}.prompts_sha256", pa[name].sha256 if name in pa else None,
                     pb[name].sha256 if name in pb else None, "not comparable", name)
        out += _diff("measurement", f"scenarios.{name}.passes", sa[name].get("passes"), sb[name].get("passes"), "noted", name)
    return out + served_differences(a, "A") + served_differences(b, "B")


def served_differences(trial: TrialResults, side: str) -> list[Difference]:
    """Each pass whose served output tokens are not its completed requests x output length (``--ignore-eos``
    makes them equal where the output length is fixed, as it is but under a random range ratio for output): that
    pass did not do the work asked, so its configuration's scenario is not comparable."""
    out = []
    for name, rec in trial.configurations.items():
        for sc in fixed_scenarios(rec):
            length = sc.spec.output_len
            if length_ratio(sc.spec.range_ratio):
                continue
            for p in sc.pass_results:
                s = p.summary
                if p.status != "ok" or s is None or s.total_output_tokens is None or s.completed is None:
                    continue
                asked = s.completed * int(length)
                if s.total_output_tokens != asked:
                    a, b = ((s.total_output_tokens, asked) if side == "A" else (asked, s.total_output_tokens))
                    out.append(Difference(aspect="workload", key=f"{side}.configs.{name}.{sc.name}.pass{p.pass_}."
                                          "total_output_tokens", a=a, b=b, effect="not comparable", scope=f"{name}/{sc.name}"))
    return out


def _merged(config: Mapping[str, Any], name: str, block: str) -> dict[str, Any]:
    return {**(config["serving"].get(block) or {}), **(config["configurations"][name].get(block) or {})}


def server_differences(a: TrialResults, b: TrialResults, names: Iterable[str]) -> list[Difference]:
    out = []
    for name in names:
        for block in ("args", "env"):
            ma, mb = _merged(a.config, name, block), _merged(b.config, name, block)
            for key in sorted(set(ma) | set(mb)):
                out += _diff("server", f"configurations.{name}.{block}.{key}", ma.get(key), mb.get(key), "under test", name)
    return out


def _patches(trial: TrialResults) -> list[str]:
    return sorted(f"{p.name} ({p.mode})" for p in (trial.patches.patches if trial.patches else []))


def _hardware(trial: TrialResults) -> dict[str, str | int | list[str] | None]:
    env = trial.preflight.environment
    cpu = env.cpu
    return {"host": env.host, "cpu": cpu.model if cpu else None, "cpu_cores": cpu.cores_logical if cpu else None,
            "numa_nodes": len(env.numa.nodes) if env.numa else len(cpu.numa_nodes if cpu else {}) or None,
            "gpu_count": env.gpus.count, "gpus": sorted(d.name or "unnamed" for d in env.gpus.devices or []),
            "driver": env.gpus.driver_version}


def environment_differences(a: TrialResults, b: TrialResults) -> list[Difference]:
    out = _diff("vllm", "vllm.version", a.vllm_version(), b.vllm_version(), "under test")
    out += _diff("patches", "patches", _patches(a), _patches(b), "under test")
    ha, hb = _hardware(a), _hardware(b)
    for key in ha:
        out += _diff("hardware", f"hardware.{key}", ha[key], hb[key], "under test")
    return out + _diff("measurement", "statistics.level", a.settings().level, b.settings().level, "noted")


def differences(a: TrialResults, b: TrialResults, names: Iterable[str]) -> list[Difference]:
    """Every difference between A and B, in the order of the module docstring; ``names``: the configurations in both."""
    return [*model_differences(a, b), *workload_differences(a, b), *server_differences(a, b, names),
            *environment_differences(a, b)]


def blocking(diffs: Iterable[Difference], configuration: str, scenario: str) -> list[Difference]:
    """The workload differences that make one configuration's scenario not comparable."""
    return [d for d in diffs if d.effect == "not comparable"
            and d.scope in (None, scenario, f"{configuration}/{scenario}")]


def change_sentence(d: Difference) -> str:
    """A difference under test, as the change being measured."""
    return f"{d.key}: {_value(d.a)} in A, {_value(d.b)} in B"


def _value(v: Any) -> str:
    return "unset" if v is None else ", ".join(map(str, v)) if isinstance(v, list) else str(v)
