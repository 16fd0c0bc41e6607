"""Another tool's runs read as Benchmark Reports v0.2, and a trial's configurations x scenarios in the same
terms: what each states about its work and its stack, and what it measured (:mod:`llmtrial.export.against`
compares them).

A side of reports is read from (:func:`read_reports`):

- a Benchmark Report v0.2 file (JSON or YAML), validated with llm-d's package (``load_benchmark_report``);
- a folder of them (each ``*.json``, ``*.yaml`` and ``*.yml`` in it); the runs that state the same work on the
  same stack are that side's runs of it, as a trial's passes are of a scenario;
- a result file of vLLM's serving benchmark, GuideLLM, AIPerf or inference-perf, converted by the package's
  own converter (:data:`CONVERTERS`); the tool is recognised from the file's keys (:func:`tool_of`), or named.
  The converters read llm-d-benchmark's environment (``LLMDBENCH_*``, its ``run_metadata.yaml``) for what the
  result file does not hold, such as the model and the lengths asked for; what no source states stays unstated.

A trial's side (:func:`trial_measured`) is each fixed scenario of each configuration as its own export states
it (:func:`llmtrial.export.benchmark_report.benchmark_report`), one value per measured pass.

What a side states (:func:`stated_of`), null where it does not: the model; the input and output length with
their distribution; concurrency and request rate; the output tokens served per request; the accelerator, its
count and the parallel sizes; the engine and its version; the tool that measured
(:data:`llmtrial.export.against.RULES` says what each must be). The figures
(:data:`FIGURES`) are each run's: output tok/s (the mean rate over the run), and the median and p99 of the
requests' latencies, in ms.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from llmd_benchmark_report.core import load_benchmark_report
from llmd_benchmark_report.native_to_br0_2 import (
    import_aiperf,
    import_guidellm_all,
    import_inference_perf,
    import_vllm_benchmark,
)
from llmd_benchmark_report.schema_v0_2 import BenchmarkReportV02, SequenceLength, Statistics
from llmd_benchmark_report.schema_v0_2_components import InferenceEngine
from pydantic import ValidationError

from llmtrial.compare.trials import TrialResults
from llmtrial.core.scenario_model import PassSummary
from llmtrial.export.benchmark_report import benchmark_report, workloads
from llmtrial.report.conclusions import is_sweep_entry

#: Figures compared: key, words, unit, whether higher is better, digits; each pass's figure in a trial; and the
#: report's field (latency or throughput, the statistic, which value of it).
FIGURES: tuple[tuple[str, str, str, bool, int, Callable[[PassSummary], float | None], tuple[str, str, str]], ...] = (
    ("output_tok_s", "output tok/s", "tok/s", True, 1, lambda s: s.output_throughput,
     ("throughput", "output_token_rate", "mean")),
    ("ttft_median_ms", "TTFT median", "ms", False, 1, lambda s: s.median_ttft_ms,
     ("latency", "time_to_first_token", "p50")),
    ("ttft_p99_ms", "TTFT p99", "ms", False, 1, lambda s: s.p99_ttft_ms, ("latency", "time_to_first_token", "p99")),
    ("tpot_median_ms", "TPOT median", "ms", False, 2, lambda s: s.median_tpot_ms,
     ("latency", "time_per_output_token", "p50")),
    ("tpot_p99_ms", "TPOT p99", "ms", False, 2, lambda s: s.p99_tpot_ms, ("latency", "time_per_output_token", "p99")),
    ("itl_median_ms", "ITL median", "ms", False, 2, lambda s: s.median_itl_ms,
     ("latency", "inter_token_latency", "p50")),
    ("e2el_median_ms", "request latency median", "ms", False, 1, lambda s: s.median_e2el_ms,
     ("latency", "request_latency", "p50")),
)
#: The package's converter of each tool's result file (the name is the package's WorkloadGenerator value).
CONVERTERS: dict[str, Callable[[str], list[BenchmarkReportV02]]] = {
    "vllm-benchmark": lambda f: [import_vllm_benchmark(f)],
    "guidellm": import_guidellm_all,
    "aiperf": lambda f: [import_aiperf(f)],
    "inference-perf": lambda f: [import_inference_perf(f)],
}
REPORT_SUFFIXES = (".json", ".yaml", ".yml")


class ReportsError(Exception):
    """Reports that cannot be read; the message names the file at fault and why."""


@dataclass(frozen=True)
class Measured:
    """One workload on one stack as a side states it, and its figures: one value per pass (a trial) or per run
    (reports)."""

    configuration: str
    scenario: str
    stated: dict[str, Any]
    values: dict[str, list[float]]
    sources: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.configuration}/{self.scenario}"


# --------------------------------------------------------------------------- what a report states


def _length(seq: SequenceLength | None) -> dict[str, Any] | None:
    if seq is None:
        return None
    out = {"distribution": str(seq.distribution.value), "value": float(seq.value)}
    return out | ({"min": seq.min, "max": seq.max} if seq.min is not None or seq.max is not None else {})


def _engine(report: BenchmarkReportV02) -> InferenceEngine | None:
    stack = report.scenario.stack if report.scenario else None
    return next((c.standardized for c in stack or [] if isinstance(c.standardized, InferenceEngine)), None)


def _rate(value: float | None) -> float | None:
    """A request rate; as fast as possible (infinite) reads as unstated-by-rate, i.e. None, on both sides."""
    return None if value is None or not math.isfinite(value) or value <= 0 else float(value)


def stated_of(report: BenchmarkReportV02) -> dict[str, Any]:
    """What a report states about its work and its stack (module docstring), None where it does not."""
    load = report.scenario.load.standardized if report.scenario and report.scenario.load else None
    engine = _engine(report)
    acc = engine.accelerator if engine else None
    sizes = acc.parallelism if acc else None
    requests = report.results.request_performance.aggregate.requests if report.results.request_performance else None
    served = requests.output_length.mean if requests and requests.output_length else None
    concurrency = load.concurrency if load else None
    return {
        "model": (engine.model.name or None) if engine else None,
        "input_seq_len": _length(load.input_seq_len) if load else None,
        "output_seq_len": _length(load.output_seq_len) if load else None,
        "concurrency": int(concurrency) if concurrency is not None and math.isfinite(concurrency) else None,
        "rate_qps": _rate(load.rate_qps) if load else None,
        "output_served": round(float(served), 3) if served is not None else None,
        "accelerator": {"model": acc.model, "count": acc.count} if acc and acc.model and acc.count else None,
        "parallelism": {"tp": sizes.tp, "pp": sizes.pp, "dp": sizes.dp} if sizes and acc and acc.count else None,
        "engine": f"{engine.tool} {engine.tool_version}".strip() if engine and engine.tool_version else None,
        "load_tool": f"{load.tool} {load.tool_version}".strip() if load and load.tool else None,
    }


def _ms(stat: Statistics | None, which: str) -> float | None:
    value = getattr(stat, which) if stat is not None else None
    if value is None:
        return None
    return float(value) * (1000.0 if str(stat.units.value).startswith("s") else 1.0)


def figures_of_report(report: BenchmarkReportV02) -> dict[str, float | None]:
    """One run's figures from its report's aggregate (latencies converted to ms)."""
    perf = report.results.request_performance
    aggregate = perf.aggregate if perf else None
    out: dict[str, float | None] = {}
    for key, *_rest, (group, field, which) in FIGURES:
        part = getattr(aggregate, group) if aggregate is not None else None
        out[key] = _ms(getattr(part, field) if part is not None else None, which)
    return out


# --------------------------------------------------------------------------- reading files


def _data(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise ReportsError(f"{path}: cannot be read as JSON or YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ReportsError(f"{path}: holds no mapping (a Benchmark Report, or a benchmark tool's result file)")
    return data


def tool_of(data: dict[str, Any]) -> str | None:
    """Which tool's file ``data`` is: ``report`` for a Benchmark Report, a :data:`CONVERTERS` key, or None."""
    if {"version", "scenario", "results"} <= data.keys():
        return "report"
    if {"completed", "output_throughput", "date"} <= data.keys():
        return "vllm-benchmark"
    if isinstance(data.get("benchmarks"), list):
        return "guidellm"
    if "input_config" in data and "output_sequence_length" in data:
        return "aiperf"
    if "load_summary" in data:
        return "inference-perf"
    return None


def _report(path: Path, data: dict[str, Any]) -> BenchmarkReportV02:
    if str(data.get("version")) not in ("0.2", "0.2.1"):
        raise ReportsError(f"{path}: a Benchmark Report of version {data.get('version')!r}; only v0.2 is compared")
    try:
        report = load_benchmark_report(data)
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[:3]
        raise ReportsError(f"{path}: not a valid Benchmark Report v0.2: {' '.join(first)}") from None
    assert isinstance(report, BenchmarkReportV02)
    return report


def _converted(path: Path, tool: str) -> list[BenchmarkReportV02]:
    """The package's converter on ``path``; what it writes to stderr (llm-d-benchmark's environment missing)
    is not an error here."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return CONVERTERS[tool](str(path))
    except SystemExit:
        raise ReportsError(f"{path}: the package's {tool} converter refused the file") from None
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise ReportsError(f"{path}: not a {tool} result file the package converts ({type(exc).__name__}: {exc})") from None


def read_file(path: Path, tool: str | None = None) -> tuple[list[BenchmarkReportV02], str | None]:
    """The reports one file holds, and the converter used (None for a report)."""
    data = _data(path)
    found = tool or tool_of(data)
    if found is None:
        raise ReportsError(f"{path}: neither a Benchmark Report nor a result file of {', '.join(CONVERTERS)} "
                           "(name the tool with --tool)")
    if found == "report":
        return [_report(path, data)], None
    if found not in CONVERTERS:
        raise ReportsError(f"--tool {found}: not one of {', '.join(CONVERTERS)}")
    return _converted(path, found), found


def read_reports(path: str | Path, tool: str | None = None) -> tuple[list[tuple[str, BenchmarkReportV02]], list[str]]:
    """Every report of a file or a folder (module docstring), each with its source, and the converters used."""
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in REPORT_SUFFIXES)
        if not files:
            raise ReportsError(f"{root}: no report in it (*.json, *.yaml, *.yml)")
    elif root.is_file():
        files = [root]
    else:
        raise ReportsError(f"{root}: no such file or folder")
    out, converters = [], []
    for f in files:
        reports, converter = read_file(f, tool)
        out += [(f"{f.name}#{i}" if len(reports) > 1 else f.name, r) for i, r in enumerate(reports)]
        converters += [converter] if converter and converter not in converters else []
    return out, converters


def _key(stated: dict[str, Any]) -> str:
    return json.dumps(stated, sort_keys=True)


def _unit_names(stated: dict[str, Any], report: BenchmarkReportV02, name: str) -> tuple[str, str]:
    """A report's runs named as a trial's workloads: the engine's label, else its tensor parallel size, else
    ``name`` (the folder's or the file's); and the load (``c4``, ``2 req/s``)."""
    stack = report.scenario.stack if report.scenario else None
    label = stack[0].metadata.label if stack and _engine(report) is not None else ""
    sizes = stated["parallelism"]
    configuration = label or (f"tp{sizes['tp']}" if sizes else name)
    rate = stated["rate_qps"]
    scenario = (f"c{stated['concurrency']}" if stated["concurrency"] is not None else f"{rate:g} req/s" if rate
                else "load unstated")
    return configuration, scenario


def report_measured(path: str | Path, tool: str | None = None) -> tuple[list[Measured], list[str]]:
    """The reports of ``path`` grouped into runs of one workload on one stack (same statement), and the
    converters used."""
    reports, converters = read_reports(path, tool)
    groups: dict[str, list[tuple[str, BenchmarkReportV02]]] = {}
    for source, report in reports:
        groups.setdefault(_key(stated_of(report)), []).append((source, report))
    out = []
    for runs in groups.values():
        stated = stated_of(runs[0][1])
        figures = [figures_of_report(r) for _, r in runs]
        values = {key: [v for f in figures if (v := f[key]) is not None] for key, *_ in FIGURES}
        name = Path(path).name if Path(path).is_dir() else Path(path).stem
        out.append(Measured(*_unit_names(stated, runs[0][1], name), stated=stated, values=values,
                            sources=tuple(s for s, _ in runs)))
    return out, converters


def trial_measured(trial: TrialResults) -> list[Measured]:
    """Each fixed scenario of each configuration that measured a pass, as its export states it, one value per
    measured pass."""
    out = []
    for name, record in trial.configurations.items():
        for w in workloads(record):
            if w.step is not None or is_sweep_entry(w.scenario) or not w.measured:
                continue
            stated = stated_of(benchmark_report(trial, w))
            values = {key: [v for p in w.measured if p.summary is not None and (v := get(p.summary)) is not None]
                      for key, _label, _unit, _higher, _digits, get, _field in FIGURES}
            out.append(Measured(name, w.scenario.name, stated=stated, values=values,
                                sources=tuple(f"{name}/{w.scenario.name} pass {p.pass_}" for p in w.measured)))
    return out
