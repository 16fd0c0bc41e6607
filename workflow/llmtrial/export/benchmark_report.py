"""One configuration x scenario of a trial as an llm-d Benchmark Report v0.2, from the records alone.

What fills what (nothing is invented: a figure the records do not hold is left out, as the schema allows):

- ``run``: ``uid`` a UUID5 of trial, configuration, scenario, step and the job's start; ``eid`` a UUID5 of the
  trial and when its preflight ran (common to the trial's reports); ``cid`` a UUID5 of the host's name;
  ``time`` the first measured pass's start to the last one's end (the job's start and end where no pass was
  measured); ``description`` ``<model> [<trial>/<configuration>/<scenario>]``, upstream's default label shape.
- ``scenario.stack``: the vLLM server, ``kind: inference_engine``: its model, the vLLM version preflight found,
  the accelerator (the selected GPUs' model from NVML; on a host without GPUs the CPU's model, counting each
  CPU worker, TP x PP x DP, as the report does), tensor, pipeline, data and expert parallel sizes from the
  server's argv, and ``native`` the argv as flags and the environment added for the server (redacted).
- ``scenario.load``: vLLM's serving benchmark (``vllm-benchmark``): the dataset (random, else sampled), the
  input and output lengths of the scenario (or sweep step), its concurrency and request rate, and ``native``
  the first measured pass's argv with every pass's seed and outcome. A sweep's step is a report of its own,
  its ``stage`` the step's number.
- ``results.request_performance.aggregate``: a scenario's measured (ok) passes together, the warm-up left out.
  TTFT and TPOT: every request of those passes (``request_ttft_ms``, ``request_tpot_ms``), in ms and ms/token;
  NTPOT (latency / output tokens): 1000 / each request's output tok/s; ITL: every gap between successive
  output tokens of those requests (``request_itl_ms``, vLLM's ``itls``), in ms/token; request latency: every
  request's (``request_e2el_ms``) with every percentile, or where a pass's record has no per-request latencies
  (its result file had no per-request detail, or the record predates them) the mean and standard deviation
  over every request, pooled exactly from each pass's, and no ITL; ``time_series``: each request's TTFT and
  latency at the time it was sent (``request_start_s``, vLLM's start times on its own monotonic clock),
  placed on the wall clock by taking the pass's last request to end at the pass's recorded end (so each time
  is early by at most what the benchmark did after its last request: computing and saving its figures), left
  out for a pass without start times; throughputs (output, input, total,
  requests): one value per pass (vLLM's figure over that pass), their mean, spread, min, median and max. Input
  and output length: the mean per request. Standard deviations are over the population (numpy's, as vLLM's).
- ``results.observability``: per-pass telemetry pooled over the same passes (sample-weighted mean, min, max):
  KV cache usage, running and waiting requests, host CPU, the server's resident memory, and on GPU hosts the
  selected GPUs' utilisation, memory and power (per GPU); preemptions one value per pass. GPU energy, which
  the schema has no field for, goes under the open ``observability`` as ``llmtrial_cost_energy`` with the cost
  per million output tokens (the trial's ``cost:`` price) and the energy per output token, where known.
- ``results.component_health``: whether the configuration ended ok, and where its server's log is.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import statistics
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from llmd_benchmark_report.base import Units
from llmd_benchmark_report.schema_v0_2 import (
    AggregateLatency,
    AggregateRequestPerformance,
    AggregateRequests,
    AggregateThroughput,
    BenchmarkReportV02,
    Component,
    ComponentHealth,
    ComponentMetadata,
    ComponentNative,
    ComponentObservability,
    Distribution,
    Load,
    LoadMetadata,
    LoadNative,
    LoadSource,
    LoadStandardized,
    Observability,
    ReplicaHealth,
    RequestPerformance,
    ResourceMetrics,
    Results,
    Run,
    RunTime,
    SequenceLength,
    Statistics,
    TimeSeriesData,
    TimeSeriesLatency,
    TimeSeriesPoint,
    TimeSeriesRequestPerformance,
)
from llmd_benchmark_report.schema_v0_2 import Scenario as BrScenario
from llmd_benchmark_report.schema_v0_2_components import (
    HostType,
    InferenceEngine,
    InferenceEngineAccelerator,
    InferenceEngineModel,
    InferenceEngineParallelism,
)
from pydantic import BaseModel, ConfigDict, Field

from llmtrial.compare.trials import TrialResults
from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.cost import energy_disagreements, energy_kind, hosts_of, pass_cost_figures, whole_energy
from llmtrial.core.redact import redact_argv, redact_env
from llmtrial.core.scenario_model import Pass, PassSummary, Scenario, Step, WindowStat
from llmtrial.core.stats import percentile
from llmtrial.export.br_validate import SCHEMA_VERSION, validate_report
from llmtrial.serve.datasets import length_ratio

#: The Statistics percentile fields and the percentile each stands for.
PERCENTILES = {"p0p1": 0.1, "p1": 1, "p5": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90, "p95": 95,
               "p99": 99, "p99p9": 99.9}
LOAD_TOOL = "vllm-benchmark"  # upstream's name for vLLM's serving benchmark (WorkloadGenerator.VLLM_BENCHMARK)

M = TypeVar("M", bound=BaseModel)


def part(model: type[M], **fields: Any) -> M | None:
    """A part of the report holding the fields given a value (what was not measured is absent: None when none
    was), assembled unchecked: :func:`benchmark_report` validates the whole report at once, so a refusal names
    the field by its full path."""
    given = {k: v for k, v in fields.items() if v is not None}
    return model.model_construct(**given) if given else None


@dataclass(frozen=True)
class ReportUnit:
    """What one report covers: a scenario of a configuration, or one step of a sweep (``step``)."""

    record: ConfigurationRecord
    scenario: Scenario
    passes: list[Pass]
    step: int | None = None

    @property
    def measured(self) -> list[Pass]:
        """The passes with a summary (ok), the warm-up never among them."""
        return [p for p in self.passes if p.status == "ok" and p.summary is not None]

    @property
    def sweep_step(self) -> Step | None:
        """The sweep step this report covers (None for a fixed scenario)."""
        step = self.passes[0] if self.step is not None else None
        return step if isinstance(step, Step) else None

    @property
    def label(self) -> str:
        return f"{self.scenario.name}" + (f" step {self.step}" if self.step is not None else "")


def workloads(record: ConfigurationRecord) -> list[ReportUnit]:
    """Every report a configuration record makes: one per fixed scenario, one per sweep step."""
    out = []
    for scenario in record.scenarios:
        if scenario.steps:
            out += [ReportUnit(record, scenario, [s], step=s.step) for s in scenario.steps]
        else:
            out.append(ReportUnit(record, scenario, list(scenario.pass_results)))
    return out


# --------------------------------------------------------------------------- small parts


def _uid(*parts: Any) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, "llmtrial:" + "/".join(map(str, parts))).hex


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _time(t: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC)


def flags(argv: Sequence[str]) -> dict[str, str | None]:
    """A command line's options as ``{"--flag": value}`` (None for a flag without a value), from its first
    option on (the interpreter and module before it are not options)."""
    out: dict[str, str | None] = {}
    key = None
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            out[name] = value if eq else None
            key = None if eq else name
        elif key is not None:
            out[key] = arg
            key = None
    return out


def stats(values: Sequence[float], units: Units, *, percentiles: bool = True, median: bool = False) -> Statistics | None:
    """A Statistics object of ``values``: mean, the population's standard deviation (two values or more),
    min, max and, with ``percentiles``, every percentile the schema names (numpy's linear rule), or with
    ``median`` the median alone; None for none."""
    if not values:
        return None
    quantiles = {name: percentile(values, q) for name, q in PERCENTILES.items()} if percentiles else {}
    if median:
        quantiles["p50"] = statistics.median(values)
    return part(Statistics, units=units, mean=statistics.fmean(values),
                stddev=statistics.pstdev(values) if len(values) > 1 else None, min=min(values), max=max(values),
                **quantiles)


def _pooled(windows: Iterable[WindowStat | None], units: Units) -> Statistics | None:
    """Window statistics pooled: their sample-weighted mean, the least min and the greatest max."""
    parts = [w for w in windows if w is not None and w.n and w.mean is not None]
    if not parts:
        return None
    n = sum(w.n for w in parts)
    bounded = all(w.min is not None and w.max is not None for w in parts)
    return part(Statistics, units=units, mean=sum(w.mean * w.n for w in parts) / n,
                min=float(min(w.min for w in parts)) if bounded else None,
                max=float(max(w.max for w in parts)) if bounded else None)


# --------------------------------------------------------------------------- scenario: the stack and the load


def _model_name(trial: TrialResults, server: dict[str, str | None]) -> str:
    hub = trial.manifest.hub
    return str(hub.repo_id) if hub is not None and hub.repo_id else str(server.get("--served-model-name") or
                                                                        server.get("--model") or "unknown")


def _vllm_version(trial: TrialResults, record: ConfigurationRecord) -> str:
    logged = record.startup.vllm_version
    return trial.vllm_version() or (str(logged.value) if logged is not None else "unknown")


def _sizes(server: dict[str, str | None]) -> InferenceEngineParallelism:
    tp, pp, dp = (int(server.get(f"--{k}-parallel-size") or 1) for k in ("tensor", "pipeline", "data"))
    return InferenceEngineParallelism.model_construct(
        tp=tp, pp=pp, dp=dp, ep=tp * dp if "--enable-expert-parallel" in server else 1)


def accelerator(trial: TrialResults, sizes: InferenceEngineParallelism) -> InferenceEngineAccelerator:
    """The selected GPUs' model (NVML's name) on a GPU host, else the CPU's model with each CPU worker counted;
    ``count`` is TP x PP x DP either way."""
    gpus = trial.preflight.environment.gpus
    devices = gpus.devices or []
    names = sorted({str(devices[i].name) for i in gpus.selected or [] if i < len(devices) and devices[i].name})
    cpu = trial.preflight.environment.cpu
    model = " + ".join(names) if gpus.present and names else (cpu.model if cpu else "") or "unknown"
    return InferenceEngineAccelerator.model_construct(model=model, count=sizes.tp * sizes.pp * sizes.dp,
                                                      parallelism=sizes)


def stack(trial: TrialResults, record: ConfigurationRecord) -> list[Component]:
    """The one component: this configuration's vLLM server."""
    server = flags(redact_argv(record.server.argv))
    envars = redact_env(record.server.env)
    engine = InferenceEngine.model_construct(
        kind="inference_engine", tool="vllm", tool_version=_vllm_version(trial, record), role=HostType.REPLICA,
        replicas=1, model=InferenceEngineModel.model_construct(name=_model_name(trial, server)),
        accelerator=accelerator(trial, _sizes(server)))
    return [Component.model_construct(
        metadata=part(ComponentMetadata, label=record.configuration, cfg_id=_hash({"args": server, "envars": envars}),
                      description=record.description),
        standardized=engine, native=ComponentNative.model_construct(args=server, envars=envars))]


def _length(distribution: Distribution, value: float, ratio: float) -> SequenceLength:
    """A length asked for: ``value`` alone, or with a range ratio the uniform range around it."""
    if ratio <= 0:
        return SequenceLength.model_construct(distribution=distribution, value=value)
    return SequenceLength.model_construct(distribution=Distribution.UNIFORM, value=value,
                                          min=math.floor(value * (1 - ratio)), max=math.ceil(value * (1 + ratio)))


def _lengths(w: ReportUnit, bench: dict[str, str | None], random: bool) -> tuple[SequenceLength, SequenceLength | None]:
    """The input and output sequence lengths the benchmark asked for (``random``: of the random dataset)."""
    step = w.sweep_step
    input_len = (step.input_len if step else None) or w.scenario.spec.input_len
    output_len = (step.output_len if step else None) or w.scenario.spec.output_len
    # the spec's ratio, as the argv was built from it (one ratio for both lengths, or {input, output})
    ratios = w.scenario.spec.range_ratio if random else None
    if random and isinstance(input_len, int):
        isl = _length(Distribution.FIXED, input_len, length_ratio(ratios, "input"))
    else:  # prompts from a file: their lengths vary; the mean sent
        sent = [(p.summary.total_input_tokens, p.summary.completed) for p in w.measured]
        tokens, done = sum(t or 0 for t, _ in sent), sum(c or 0 for _, c in sent)
        isl = SequenceLength.model_construct(distribution=Distribution.OTHER, value=tokens / done if done else 0)
    # --ignore-eos: every request made to produce output_len tokens
    osl = _length(Distribution.FIXED, output_len, length_ratio(ratios)) \
        if "--ignore-eos" in bench and isinstance(output_len, int) else None
    return isl, osl


def load(trial: TrialResults, w: ReportUnit) -> Load:
    """vLLM's serving benchmark as this scenario (or sweep step) ran it."""
    first = (w.measured or w.passes or [None])[0]
    bench = flags(redact_argv(first.argv)) if first is not None and isinstance(first.argv, list) else {}
    dataset = bench.get("--dataset-name")
    isl, osl = _lengths(w, bench, dataset == "random")
    spec = w.scenario.spec
    step = w.sweep_step
    concurrency = (step.concurrency if step else None) or spec.concurrency
    rate = spec.request_rate
    config = {"scenario": w.scenario.name, **({"step": w.step} if w.step is not None else {}),
              "spec": spec.model_dump(mode="json", exclude_none=True),
              "passes": [{"pass": p.pass_, "seed": p.seed, "status": p.status, "result_file": p.result_file}
                         for p in w.passes]}
    source = LoadSource.RANDOM if dataset == "random" else LoadSource.SAMPLED if dataset else LoadSource.UNKNOWN
    return Load.model_construct(
        metadata=LoadMetadata.model_construct(cfg_id=_hash({"args": bench, "config": config}),
                                              description=f"scenario {w.label} of trial {trial.trial}"),
        standardized=part(
            LoadStandardized, tool=LOAD_TOOL, tool_version=_vllm_version(trial, w.record), source=source,
            stage=w.step or 0, input_seq_len=isl, output_seq_len=osl,
            rate_qps=float(rate) if isinstance(rate, int | float) and math.isfinite(rate) and rate > 0 else None,
            concurrency=concurrency if isinstance(concurrency, int) else None),
        native=LoadNative.model_construct(args=bench, config=config))


# --------------------------------------------------------------------------- results


def _pooled_e2el(passes: list[Pass]) -> Statistics | None:
    """The requests' end-to-end latency over every pass, pooled exactly from each pass's mean, standard
    deviation (population) and completed requests."""
    parts = [(p.summary.completed, p.summary.mean_e2el_ms, p.summary.std_e2el_ms) for p in passes]
    if not parts or any(n is None or m is None or s is None for n, m, s in parts) or not sum(n for n, _, _ in parts):
        return None
    n = sum(n for n, _, _ in parts)
    mean = sum(k * m for k, m, _ in parts) / n
    var = sum(k * (s * s + m * m) for k, m, s in parts) / n - mean * mean
    return Statistics.model_construct(units=Units.MS, mean=mean, stddev=math.sqrt(max(var, 0.0)))


def _samples(passes: list[Pass], figure: Callable[[PassSummary], list[float] | None]) -> list[float]:
    """Every pass's per-request samples of one figure together; none when a pass lacks them (its result file
    had no per-request detail, or its record predates them): a figure of some passes would pass for all."""
    lists = [figure(p.summary) for p in passes]
    return [] if any(v is None for v in lists) else [v for values in lists for v in values]


def _per_pass(passes: list[Pass], figure: Callable[[PassSummary], float | None], units: Units) -> Statistics | None:
    values = [v for v in (figure(p.summary) for p in passes) if v is not None]
    return stats(values, units, percentiles=False, median=True)


def _input_rate(summary: PassSummary) -> float | None:
    if summary.total_input_tokens is None or not summary.duration:
        return None
    return summary.total_input_tokens / summary.duration


def _mean_per_request(total: int | None, done: int) -> Statistics | None:
    return Statistics.model_construct(units=Units.COUNT, mean=total / done) if done and total is not None else None


def _request_times(p: Pass) -> list[tuple[datetime.datetime, float, float]] | None:
    """(when it was sent, TTFT ms, latency ms) of each successful request of a pass, on the wall clock (module
    docstring); None without start times."""
    s = p.summary
    starts, ttft, e2el = s.request_start_s, s.request_ttft_ms, s.request_e2el_ms
    if not starts or ttft is None or e2el is None or not len(starts) == len(ttft) == len(e2el):
        return None
    last_end = max(t + lat / 1000.0 for t, lat in zip(starts, e2el, strict=True))
    return [(_time(p.end - (last_end - t)), f, lat) for t, f, lat in zip(starts, ttft, e2el, strict=True)]


def time_series(passes: list[Pass]) -> TimeSeriesRequestPerformance | None:
    """Each request's TTFT and latency at the time it was sent, over the measured passes that have start times."""
    points = sorted(x for p in passes if (times := _request_times(p)) for x in times)
    if not points:
        return None

    def series(i: int) -> TimeSeriesData:
        return TimeSeriesData.model_construct(units=Units.MS, series=[
            TimeSeriesPoint.model_construct(ts=pt[0], value=pt[i]) for pt in points])

    return TimeSeriesRequestPerformance.model_construct(latency=TimeSeriesLatency.model_construct(
        time_to_first_token=series(1), request_latency=series(2)))


def request_performance(w: ReportUnit) -> RequestPerformance | None:
    """The measured passes' requests, latencies and throughputs (module docstring)."""
    passes = w.measured
    if not passes:
        return None
    s = [p.summary for p in passes]
    done = sum(x.completed or 0 for x in s)
    ttft = [v for x in s for v in x.request_ttft_ms or []]
    tpot = [v for x in s for v in x.request_tpot_ms or []]
    ntpot = [1000.0 / v for x in s for v in x.request_output_tok_s or [] if v > 0]
    tokens_in = None if any(x.total_input_tokens is None for x in s) else sum(x.total_input_tokens for x in s)
    tokens_out = None if any(x.total_output_tokens is None for x in s) else sum(x.total_output_tokens for x in s)
    failed = sum(x.failed or 0 for x in s)
    return RequestPerformance.model_construct(aggregate=AggregateRequestPerformance.model_construct(
        requests=part(AggregateRequests, total=done + failed, failures=failed,
                      input_length=_mean_per_request(tokens_in, done), output_length=_mean_per_request(tokens_out, done)),
        latency=part(AggregateLatency, time_to_first_token=stats(ttft, Units.MS),
                     time_per_output_token=stats(tpot, Units.MS_PER_TOKEN),
                     normalized_time_per_output_token=stats(ntpot, Units.MS_PER_TOKEN),
                     inter_token_latency=stats(_samples(passes, lambda x: x.request_itl_ms), Units.MS_PER_TOKEN),
                     request_latency=stats(_samples(passes, lambda x: x.request_e2el_ms), Units.MS)
                     or _pooled_e2el(passes)),
        throughput=part(
            AggregateThroughput,
            output_token_rate=_per_pass(passes, lambda x: x.output_throughput, Units.TOKEN_PER_S),
            input_token_rate=_per_pass(passes, _input_rate, Units.TOKEN_PER_S),
            total_token_rate=_per_pass(passes, lambda x: x.total_token_throughput, Units.TOKEN_PER_S),
            request_rate=_per_pass(passes, lambda x: x.request_throughput, Units.QUERY_PER_S))),
        **({"time_series": ts} if (ts := time_series(passes)) is not None else {}))


#: Resource metrics from the per-pass telemetry windows: field -> (the summary's key, units).
RESOURCES = {
    "kv_cache_usage": ("metrics.kv_cache_usage", Units.FRACTION),
    "running_requests": ("metrics.running", Units.COUNT),
    "waiting_requests": ("metrics.waiting", Units.COUNT),
    "cpu_utilization": ("host.cpu_percent", Units.PERCENT),
    "cpu_memory_usage": ("host.tree_rss_bytes", Units.BYTES),
}
#: The same from each selected GPU's NVML samples: field -> (the metric after ``nvml.gpu<i>.``, units).
GPU_RESOURCES = {
    "gpu_utilization": ("util_percent", Units.PERCENT),
    "gpu_memory_usage": ("mem_used_bytes", Units.BYTES),
    "power_consumption": ("power_w", Units.WATTS),
}


def observability(trial: TrialResults, w: ReportUnit) -> Observability | None:
    """The measured passes' telemetry as the component's resource metrics, and the GPU energy where measured."""
    windows = [p.telemetry.summary or {} for p in w.measured if p.telemetry is not None]
    aggregate = {field: _pooled((win.get(key) for win in windows), units) for field, (key, units) in RESOURCES.items()}
    for field, (metric, units) in GPU_RESOURCES.items():
        aggregate[field] = _pooled((stat for win in windows for key, stat in win.items()
                                    if key.startswith("nvml.gpu") and key.endswith("." + metric)), units)
    preempted = [p.server_metrics.preemptions for p in w.measured
                 if p.server_metrics is not None and p.server_metrics.preemptions is not None]
    metrics = part(ResourceMetrics, **aggregate, preemptions=stats(preempted, Units.COUNT, percentiles=False))
    figures = cost_and_energy(trial, w)
    if metrics is None and figures is None:
        return None
    component = part(ComponentObservability, component_label=w.record.configuration, aggregate=metrics,
                     raw_data_path=f"configs/{w.record.configuration}/telemetry.csv")
    energy = {} if figures is None else {"llmtrial_cost_energy": figures.model_dump(mode="json", exclude_none=True)}
    return Observability.model_construct(components=[component], **energy)


class CostEnergy(BaseModel):
    """Cost per million output tokens and energy per output token of a report's passes, under the open
    ``observability`` (the schema has no field for either)."""

    model_config = ConfigDict(extra="forbid")

    cost_per_million_output_tokens: float | None
    cost_unit: str | None
    price: str | None = Field(description="The price as words (Cost.rate).")
    price_units: int | None = Field(description="The units of the price one configuration occupies.")
    energy_per_output_token_j: float | None
    energy_kind: Literal["measured", "estimated"] | None
    energy_disagrees: bool | None
    passes: int
    source: str


def cost_and_energy(trial: TrialResults, w: ReportUnit) -> CostEnergy | None:
    """Cost per million output tokens (the provenance record's price) and energy per output token over the
    measured passes, as the report ranks them (:mod:`llmtrial.core.cost`: each pass's figure, their median);
    None when the trial has no price and no pass measured its energy. The schema has no field for either."""
    cost, record = trial.provenance.cost, w.record
    plan = trial.plans.get(record.configuration)
    units = cost.units(plan.accelerators if plan else None, hosts_of(record)) if cost else None
    per_pass = [pass_cost_figures(p, cost, units, whole_energy(record)) for p in w.measured]
    mtok = [f["cost_per_mtok"] for f in per_pass if f["cost_per_mtok"] is not None]
    joules = [f["energy_per_token_j"] for f in per_pass if f["energy_per_token_j"] is not None]
    if not mtok and not joules:
        return None
    metered = [p for p, f in zip(w.measured, per_pass, strict=True) if f["energy_per_token_j"] is not None]
    return CostEnergy(
        cost_per_million_output_tokens=statistics.median(mtok) if mtok else None,
        cost_unit=cost.unit if cost and mtok else None, price=cost.rate if cost and mtok else None,
        price_units=units if mtok else None,
        energy_per_output_token_j=statistics.median(joules) if joules else None,
        energy_kind=energy_kind(metered), energy_disagrees=bool(energy_disagreements(metered)) if joules else None,
        passes=len(per_pass),
        source="each measured pass's figure (output tok/s and output tokens from vLLM's benchmark, GPU energy "
               "from NVML over the pass), their median; llmtrial.core.cost")


def health(w: ReportUnit) -> list[ComponentHealth]:
    """Whether the configuration ended ok, and where its server's log is."""
    name = w.record.configuration
    ok = w.record.status == "ok"
    replica = ReplicaHealth.model_construct(replica_id=name, healthy=ok, logs=f"configs/{name}/{w.record.server.log}")
    return [ComponentHealth.model_construct(component_label=name, failed_replicas=0 if ok else 1,
                                            replica_health=[replica])]


def run(trial: TrialResults, w: ReportUnit, model: str) -> Run:
    """Who and when: the report's IDs and its time span."""
    record = w.record
    spans = [(p.start, p.end) for p in w.measured] or [(record.timing.job_start, record.timing.job_end)]
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    return Run.model_construct(
        uid=_uid(trial.trial, record.configuration, w.scenario.name, w.step, record.timing.job_start),
        eid=_uid(trial.trial, trial.recorded_at),
        cid=uuid.uuid5(uuid.NAMESPACE_DNS, trial.preflight.environment.host).hex,
        time=RunTime.model_construct(start=_time(start), end=_time(end), duration=f"PT{end - start:.3f}S"),
        description=f"{model} [{trial.trial}/{record.configuration}/{w.label.replace(' ', '-')}]")


def benchmark_report(trial: TrialResults, w: ReportUnit) -> BenchmarkReportV02:
    """The report of ``w``, validated against the package's schema (:class:`~llmtrial.export.br_validate.ReportInvalid`
    naming the field at fault): its parts are assembled as the package's models, then checked as a whole."""
    components = stack(trial, w.record)
    report = BenchmarkReportV02.model_construct(
        version=SCHEMA_VERSION, run=run(trial, w, components[0].standardized.model.name),
        scenario=BrScenario.model_construct(stack=components, load=load(trial, w)),
        results=part(Results, request_performance=request_performance(w), observability=observability(trial, w),
                     component_health=health(w)))
    return validate_report(report.model_dump(mode="json", exclude_unset=True),
                           source=f"of {w.record.configuration} x {w.label}")
