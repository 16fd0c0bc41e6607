"""Benchmark Report v0.2's results, run and root (the rest of :mod:`llmtrial.export.br_schema`, whose
docstring names the published schema these follow), and :func:`validate_report`."""

from __future__ import annotations

import datetime
import re
from typing import Any

from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from llmtrial.export.br_schema import (
    SCHEMA_VERSION,
    Component,
    GenLatencySeries,
    GenLatencyStat,
    GenThroughputSeries,
    GenThroughputStat,
    Load,
    MediaThroughputStat,
    MemorySeries,
    MemoryStat,
    Open,
    PortionSeries,
    PortionStat,
    PowerSeries,
    PowerStat,
    QuantitySeries,
    QuantityStat,
    RatioStat,
    ReportInvalid,
    RequestThroughputSeries,
    RequestThroughputStat,
    Statistics,
    Strict,
    TimeSeries,
    TimeStat,
    Units,
)

# --------------------------------------------------------------------------- results.request_performance


class ImagePayloadStats(Strict):
    count: QuantityStat = None
    filesize: MemoryStat = None
    pixels: QuantityStat = None
    aspect_ratio: RatioStat = None


class VideoPayloadStats(ImagePayloadStats):
    frames: QuantityStat = None


class AudioPayloadStats(Strict):
    count: QuantityStat = None
    filesize: MemoryStat = None
    duration: TimeStat = None


class MultiModalRequests(Strict):
    image: ImagePayloadStats | None = None
    video: VideoPayloadStats | None = None
    audio: AudioPayloadStats | None = None


class AggregateRequests(Strict):
    total: int = Field(ge=0, description="Requests sent.")
    failures: int | None = Field(None, ge=0, description="Requests that responded with an error.")
    incomplete: int | None = Field(None, ge=0, description="Requests that did not complete.")
    input_length: QuantityStat = None
    output_length: QuantityStat = None
    request_size: MemoryStat = None
    multimodal: MultiModalRequests | None = None


class AggregateLatency(Strict):
    time_to_first_token: TimeStat = None
    normalized_time_per_output_token: GenLatencyStat = None
    time_per_output_token: GenLatencyStat = None
    inter_token_latency: GenLatencyStat = None
    request_latency: TimeStat = None


class AggregateThroughput(Strict):
    input_token_rate: GenThroughputStat = None
    output_token_rate: GenThroughputStat = None
    total_token_rate: GenThroughputStat = None
    request_rate: RequestThroughputStat = None
    image_rate: MediaThroughputStat = None
    video_rate: MediaThroughputStat = None
    audio_rate: MediaThroughputStat = None


class AggregateRequestPerformance(Strict):
    requests: AggregateRequests | None = None
    latency: AggregateLatency | None = None
    throughput: AggregateThroughput | None = None


class TimeSeriesLatency(Strict):
    time_to_first_token: TimeSeries = None
    normalized_time_per_output_token: GenLatencySeries = None
    time_per_output_token: GenLatencySeries = None
    inter_token_latency: GenLatencySeries = None
    request_latency: TimeSeries = None


class TimeSeriesThroughput(Strict):
    units: Units = Units.TOKEN_PER_S
    input_token_rate: GenThroughputSeries = None
    output_token_rate: GenThroughputSeries = None
    total_token_rate: GenThroughputSeries = None
    request_rate: RequestThroughputSeries = None


class TimeSeriesRequestPerformance(Strict):
    latency: TimeSeriesLatency | None = None
    throughput: TimeSeriesThroughput | None = None


class RequestPerformance(Strict):
    aggregate: AggregateRequestPerformance | None = None
    time_series: TimeSeriesRequestPerformance | None = None


# --------------------------------------------------------------------------- results.observability


class ResourceMetrics(Strict):
    kv_cache_usage: PortionStat = None
    cache_hit_rate: PortionStat = None
    gpu_cache_usage: PortionStat = None
    cpu_cache_usage: PortionStat = None
    gpu_memory_usage: MemoryStat = None
    cpu_memory_usage: MemoryStat = None
    storage_usage: MemoryStat = None
    gpu_utilization: PortionStat = None
    cpu_utilization: PortionStat = None
    power_consumption: PowerStat = None
    running_requests: QuantityStat = None
    waiting_requests: QuantityStat = None
    swapped_requests: QuantityStat = None
    preemptions: QuantityStat = None


class TimeSeriesResourceMetrics(Strict):
    kv_cache_usage: PortionSeries = None
    gpu_cache_usage: PortionSeries = None
    cpu_cache_usage: PortionSeries = None
    gpu_memory_usage: MemorySeries = None
    cpu_memory_usage: MemorySeries = None
    storage_usage: MemorySeries = None
    gpu_utilization: PortionSeries = None
    cpu_utilization: PortionSeries = None
    power_consumption: PowerSeries = None
    num_requests_running: QuantitySeries = None
    num_requests_waiting: QuantitySeries = None
    num_preemptions: QuantitySeries = None
    prefix_cache_queries: QuantitySeries = None
    prefix_cache_hits: QuantitySeries = None
    prefix_cache_hit_rate: PortionSeries = None
    external_prefix_cache_queries: QuantitySeries = None
    external_prefix_cache_hits: QuantitySeries = None
    external_prefix_cache_hit_rate: PortionSeries = None
    prompt_tokens: QuantitySeries = None
    generation_tokens: QuantitySeries = None
    kv_offload_store_bytes: MemorySeries = None
    kv_offload_load_bytes: MemorySeries = None
    kv_offload_store_time: TimeSeries = None
    kv_offload_load_time: TimeSeries = None
    pool_avg_kv_cache_utilization: PortionSeries = None
    pool_avg_queue_size: QuantitySeries = None
    pool_avg_running_requests: QuantitySeries = None
    pool_ready_pods: QuantitySeries = None


class ComponentObservability(Strict):
    component_label: str = Field(description="A label of scenario.stack[].metadata.label.")
    replica_id: str | None = None
    aggregate: ResourceMetrics | None = None
    time_series: TimeSeriesResourceMetrics | None = None
    raw_data_path: str | None = None
    graph_path: str | None = None


class PodStartupInfo(Strict):
    name: str
    model: str | None = None
    role: str | None = None
    node: str | None = None
    creation_timestamp: datetime.datetime | None = None
    ready_timestamp: datetime.datetime | None = None
    startup_seconds: float | None = Field(None, ge=0)


class PodStartupTimes(Strict):
    collected_at: datetime.datetime | None = None
    pods: list[PodStartupInfo] | None = None
    aggregate: Statistics | None = None
    graph_path: str | None = None


class ControllerReplicaStatus(Strict):
    kind: str
    name: str
    model: str | None = None
    role: str | None = None
    desired_replicas: int = Field(ge=0)
    available_replicas: int = Field(ge=0)
    ready_replicas: int = Field(ge=0)
    updated_replicas: int | None = Field(None, ge=0)


class ReplicaStatusSnapshot(Strict):
    timestamp: datetime.datetime | None = None
    namespace: str | None = None
    controllers: list[ControllerReplicaStatus] | None = None


class ReplicaStatus(Strict):
    namespace: str | None = None
    timestamp: datetime.datetime | None = None
    controllers: list[ControllerReplicaStatus] | None = None
    time_series: list[ReplicaStatusSnapshot] | None = None
    aggregate_ready_replicas: Statistics | None = None
    graph_path: str | None = None


class Observability(Open):
    """Open by design: ad-hoc metric keys beside the ones named here are kept unchecked."""

    components: list[ComponentObservability] | None = None
    drop_rate: PortionStat = None
    pod_startup_times: PodStartupTimes | None = None
    replica_status: ReplicaStatus | None = None


# --------------------------------------------------------------------------- results: health, sessions


class ReplicaHealth(Strict):
    replica_id: str
    restarts: int | None = Field(None, ge=0)
    healthy: bool | None = Field(None, description="Healthy at the end of the benchmark.")
    logs: str | None = Field(None, description="Where this replica's logs are.")


class ComponentHealth(Strict):
    component_label: str
    total_restarts: int | None = Field(None, ge=0)
    failed_replicas: int | None = Field(None, ge=0)
    replica_health: list[ReplicaHealth] | None = None


class SessionRequests(Strict):
    total: int = Field(ge=0)
    succeeded: int | None = Field(None, ge=0)
    failed: int | None = Field(None, ge=0)
    total_events: int | None = Field(None, ge=0)
    total_events_completed: int | None = Field(None, ge=0)
    total_events_cancelled: int | None = Field(None, ge=0)
    session_rate: RequestThroughputStat = None
    session_duration: TimeStat = None
    events_per_session: QuantityStat = None
    events_cancelled_per_session: QuantityStat = None
    input_tokens_per_session: QuantityStat = None
    output_tokens_per_session: QuantityStat = None


class SessionPerformance(Strict):
    sessions: SessionRequests | None = None


# --------------------------------------------------------------------------- the report


class RunTime(Strict):
    start: datetime.datetime | None = None
    end: datetime.datetime | None = None
    duration: str | None = Field(None, description="ISO 8601 duration.")


class Run(Strict):
    uid: str = Field(description="Unique ID of this benchmark report.")
    eid: str | None = Field(None, description="Experiment ID, common to the reports of one experiment.")
    cid: str | None = Field(None, description="Cluster ID.")
    pid: str | None = Field(None, description="Pod ID.")
    time: RunTime | None = None
    user: str | None = None
    description: str | None = None
    keywords: list[str] | None = None


class BrScenario(Strict):
    stack: list[Component] | None = None
    load: Load | None = None


class Results(Strict):
    request_performance: RequestPerformance | None = None
    session_performance: SessionPerformance | None = None
    observability: Observability | None = None
    profiling: Any | None = None
    component_health: list[ComponentHealth] | None = None


class BenchmarkReport(Strict):
    """A Benchmark Report of the v0.2 line (``version`` 0.2 or a later 0.2 revision)."""

    version: str = SCHEMA_VERSION
    run: Run
    scenario: BrScenario | None = None
    results: Results


def _where(error: ErrorDetails) -> str:
    # pydantic names a union member or a validator in the path ("inference_engine", "function-after[...]"): drop them
    return ".".join(str(p) for p in error["loc"] if not str(p).startswith(("function-", "inference_engine", "generic"))
                    or isinstance(p, int)) or "(top level)"


def validate_report(data: Any, *, source: str | None = None) -> BenchmarkReport:
    """``data`` (a report as JSON data) as a :class:`BenchmarkReport`; :class:`ReportInvalid` naming each
    field at fault (and ``source``, the file or the configuration x scenario it is about) when it breaks the
    schema."""
    try:
        report = BenchmarkReport.model_validate(data)
    except ValidationError as exc:
        where = f" {source}" if source else ""
        lines = [f"{_where(e)}: {e['msg']}" for e in exc.errors()]
        raise ReportInvalid(f"Benchmark Report{where} does not match the v0.2 schema:\n  " + "\n  ".join(lines)) from None
    if not re.fullmatch(r"0\.2(\.\d+)?", report.version):
        raise ReportInvalid(f"Benchmark Report{' ' + source if source else ''}: version: {report.version!r} is not "
                            f"of the {SCHEMA_VERSION} line")
    return report
