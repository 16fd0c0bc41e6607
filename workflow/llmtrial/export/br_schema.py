"""llm-d's Benchmark Report v0.2, as pydantic models: the validator of what :mod:`llmtrial.export` writes.

Written from the published schema, not copied: the v0.2 line of llm-d/llm-d-benchmark's
``benchmark_report`` package (``schema_v0_2.py``, ``schema_v0_2_components.py``, ``base.py``) as PyPI's
``llmd-benchmark-report`` 0.2.1 ships it (wheel sha256
8690b8432e4872cd928edc6755d82ee95096d52064b80afc3bb35c2afdbf657e, schema_v0_2.py sha256
6dabeb2d9b11eb90286a919e2b1f81b04627f571b94ee5f337ff00e7ffc9f61d). That module implements the whole
0.2 line: reports declaring ``0.2`` and ``0.2.1`` validate against it alike, 0.2.1 having only added
optional fields. Every field the export writes is already in the v0.2 revision that llm-d-benchmark
commit 2c1e326e22c47c0e53028914d72ff360a8ce2e79 holds (llmdbenchmark/analysis/benchmark_report/, the
copy kubernetes-sigs/inference-perf vendors), so the exports say ``version: "0.2"``.

The older layout in benchmark_report/schema_v0_2.py at commit 318f519791d086200be99cfcb7e9bcb0331c3903
(a component's ``kind`` under ``metadata``, ``requests_rate``) is not this one: the current line moved
``kind`` into ``standardized`` and renamed the rate ``request_rate``, and refuses the old keys.

As upstream: every object refuses keys it does not name (``extra="forbid"``) except a ``generic``
component's standardized part and ``results.observability`` (both open by design), and each
statistic's ``units`` must be one its field allows (milliseconds or seconds for a latency, ms/token or
s/token for a per-token latency, tokens/s for a token rate, ...). A refusal names the field:
:func:`validate_report` raises :class:`ReportInvalid` with one ``path: message`` line per fault.
"""

from __future__ import annotations

import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, model_validator

SCHEMA_VERSION = "0.2"
#: Where the schema was read (module docstring): the release, the wheel's hash, the commit of the v0.2 revision.
SCHEMA_SOURCE = ("llm-d/llm-d-benchmark benchmark_report (v0.2 line) as released in llmd-benchmark-report 0.2.1 "
                 "(wheel sha256 8690b8432e4872cd928edc6755d82ee95096d52064b80afc3bb35c2afdbf657e); v0.2 revision "
                 "at commit 2c1e326e22c47c0e53028914d72ff360a8ce2e79")


class Units(StrEnum):
    """Every unit the schema knows, spelled as it spells them."""

    COUNT = "count"
    PIXELS = "pixels"
    PERCENT = "percent"
    FRACTION = "fraction"
    RATIO = "ratio"
    MS = "ms"
    S = "s"
    BYTES = "bytes"
    MB = "MB"
    GB = "GB"
    TB = "TB"
    MIB = "MiB"
    GIB = "GiB"
    TIB = "TiB"
    MBIT_PER_S = "Mbit/s"
    GBIT_PER_S = "Gbit/s"
    TBIT_PER_S = "Tbit/s"
    GIB_PER_S = "GiB/s"
    MB_PER_S = "MB/s"
    GB_PER_S = "GB/s"
    TB_PER_S = "TB/s"
    MS_PER_TOKEN = "ms/token"
    S_PER_TOKEN = "s/token"
    TOKEN_PER_S = "tokens/s"
    QUERY_PER_S = "queries/s"
    IMAGE_PER_S = "images/s"
    VIDEO_PER_S = "videos/s"
    AUDIO_PER_S = "audios/s"
    WATTS = "Watts"


U = Units
QUANTITY = (U.COUNT, U.PIXELS)
PORTION = (U.PERCENT, U.FRACTION)
RATIO = (U.RATIO,)
TIME = (U.MS, U.S)
MEMORY = (U.BYTES, U.MB, U.GB, U.TB, U.MIB, U.GIB, U.TIB)
GEN_LATENCY = (U.MS_PER_TOKEN, U.S_PER_TOKEN)
GEN_THROUGHPUT = (U.TOKEN_PER_S,)
REQUEST_THROUGHPUT = (U.QUERY_PER_S,)
MEDIA_THROUGHPUT = (U.IMAGE_PER_S, U.VIDEO_PER_S, U.AUDIO_PER_S)
POWER = (U.WATTS,)


class ReportInvalid(ValueError):
    """A report that breaks the schema; the message has one ``field.path: what is wrong`` line per fault."""


class Strict(BaseModel):
    """An object of the schema: it refuses keys it does not name."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Open(BaseModel):
    """An object the schema leaves open: keys it does not name are kept unchecked."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)


Num = float | int


class Statistics(BaseModel):
    """Statistical information about a property: its units, mean, spread and percentiles. As upstream, the
    one object that ignores keys it does not name (they are dropped, not refused)."""

    units: Units
    mean: float
    mode: Num | None = None
    stddev: float | None = Field(None, ge=0)
    min: Num | None = None
    p0p1: Num | None = None
    p1: Num | None = None
    p5: Num | None = None
    p10: Num | None = None
    p25: Num | None = None
    p50: Num | None = None
    p75: Num | None = None
    p90: Num | None = None
    p95: Num | None = None
    p99: Num | None = None
    p99p9: Num | None = None
    max: Num | None = None


class TimeSeriesPoint(Strict):
    """One point of a time series: an ISO 8601 time and a value or statistics."""

    ts: datetime.datetime
    value: str | float | int | bool | None = None
    mean: float | None = None
    mode: Num | None = None
    stddev: float | None = Field(None, ge=0)
    min: Num | None = None
    p0p1: Num | None = None
    p1: Num | None = None
    p5: Num | None = None
    p10: Num | None = None
    p25: Num | None = None
    p50: Num | None = None
    p75: Num | None = None
    p90: Num | None = None
    p95: Num | None = None
    p99: Num | None = None
    p99p9: Num | None = None
    max: Num | None = None


class TimeSeriesData(Strict):
    """A time series in one unit."""

    units: Units
    series: list[TimeSeriesPoint]


def _units_in(allowed: tuple[Units, ...]):
    def check(value: Statistics | TimeSeriesData | None):
        if value is not None and value.units not in allowed:
            raise ValueError(f'units "{value.units}" not allowed here, must be one of: {", ".join(allowed)}')
        return value
    return AfterValidator(check)


def _stat(allowed: tuple[Units, ...]) -> Any:
    return Annotated[Statistics | None, _units_in(allowed)]


def _series(allowed: tuple[Units, ...]) -> Any:
    return Annotated[TimeSeriesData | None, _units_in(allowed)]


#: Optional statistics (and time series) whose units must be of one family.
QuantityStat = _stat(QUANTITY)
PortionStat = _stat(PORTION)
RatioStat = _stat(RATIO)
TimeStat = _stat(TIME)
MemoryStat = _stat(MEMORY)
GenLatencyStat = _stat(GEN_LATENCY)
GenThroughputStat = _stat(GEN_THROUGHPUT)
RequestThroughputStat = _stat(REQUEST_THROUGHPUT)
MediaThroughputStat = _stat(MEDIA_THROUGHPUT)
PowerStat = _stat(POWER)
QuantitySeries = _series(QUANTITY)
PortionSeries = _series(PORTION)
TimeSeries = _series(TIME)
MemorySeries = _series(MEMORY)
GenLatencySeries = _series(GEN_LATENCY)
GenThroughputSeries = _series(GEN_THROUGHPUT)
RequestThroughputSeries = _series(REQUEST_THROUGHPUT)
PowerSeries = _series(POWER)


# --------------------------------------------------------------------------- scenario.stack


class ComponentMetadata(Strict):
    schema_version: str = "0.0.1"
    label: str = Field(description="Unique name of this component.")
    cfg_id: str = Field(description="A hash of this component's configuration.")
    description: str | None = None


class ComponentNative(Strict):
    args: dict[str, Any] | None = None
    envars: dict[str, Any] | None = None
    config: Any | None = None


class Generic(Open):
    """A component with no standardized schema of its own: ``kind``, ``tool`` and ``tool_version``, then anything."""

    kind: Literal["generic"]
    tool: str
    tool_version: str


class HostType(StrEnum):
    REPLICA = "replica"
    PREFILL = "prefill"
    DECODE = "decode"


class InferenceEngineModel(Strict):
    name: str


class InferenceEngineParallelism(Strict):
    tp: int = Field(1, ge=0)
    dp: int = Field(1, ge=0)
    dp_local: int = Field(1, ge=0)
    workers: int = Field(1, ge=0)
    ep: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)


class InferenceEngineAccelerator(Strict):
    model: str = Field(description="Hardware model name.")
    count: int = Field(ge=0, description="Total utilized accelerator count.")
    parallelism: InferenceEngineParallelism


class InferenceEngine(Strict):
    kind: Literal["inference_engine"]
    tool: str
    tool_version: str
    role: HostType
    replicas: int = Field(ge=1)
    model: InferenceEngineModel
    accelerator: InferenceEngineAccelerator


class Component(Strict):
    metadata: ComponentMetadata
    standardized: Annotated[Generic | InferenceEngine, Discriminator("kind")]
    native: ComponentNative


# --------------------------------------------------------------------------- scenario.load


class LoadMetadata(Strict):
    schema_version: str = "0.0.1"
    cfg_id: str | None = None
    description: str | None = None
    treatment: str | None = None
    treatment_group: str | None = None
    concurrent_with: list[str] | None = None


class Distribution(StrEnum):
    FIXED = "fixed"
    GAUSSIAN = "gaussian"
    UNIFORM = "uniform"
    OTHER = "other"


class SequenceLength(Strict):
    distribution: Distribution
    value: int | float = Field(ge=0)
    std_dev: float | None = Field(None, ge=0)
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=1)


class LoadPrefix(Strict):
    prefix_len: SequenceLength
    num_groups: int = Field(ge=1)
    num_users_per_group: int = Field(ge=1)
    num_prefixes: int = Field(ge=1)


class MultiTurn(Strict):
    enabled: bool = True
    max_turns: SequenceLength | None = None


class LoadSource(StrEnum):
    RANDOM = "random"
    SAMPLED = "sampled"
    UNKNOWN = "unknown"


class LoadStandardized(Strict):
    tool: str
    tool_version: str
    parallelism: int = Field(1, ge=1)
    source: LoadSource
    stage: int = Field(0, ge=0)
    input_seq_len: SequenceLength
    output_seq_len: SequenceLength | None = None
    prefix: LoadPrefix | None = None
    multi_turn: MultiTurn | None = None
    rate_qps: float | None = Field(None, gt=0)
    concurrency: int | float | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _concurrency_integer_or_infinite(self) -> LoadStandardized:
        if isinstance(self.concurrency, float) and self.concurrency != float("inf"):
            raise ValueError("concurrency must be an integer or .inf")
        return self


class LoadNative(Strict):
    args: dict[str, Any] | None = None
    envars: dict[str, Any] | None = None
    config: Any | None = None


class Load(Strict):
    metadata: LoadMetadata
    standardized: LoadStandardized
    native: LoadNative
