"""The parts of the trial report's context (:func:`llmtrial.report.render.build_context`): the rows and
sections the template reads by attribute, and the context itself."""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from llmtrial.core.cleanup_model import CleanupRecord, QuietRecord
from llmtrial.core.configuration_model import (
    ConfigurationRecord,
    GpuCensus,
    GpuHealth,
    SamplerStats,
    StartupPhase,
    TelemetrySource,
    ThroughputBound,
)
from llmtrial.core.cost import Cost
from llmtrial.core.preflight_model import Environment, PreflightRecord
from llmtrial.core.record_base import Fact, HeldGpu
from llmtrial.core.record_models import ManifestRecord, ModelShape, PatchesRecord, PlanRecord, ProvenanceRecord
from llmtrial.core.scenario_model import Agreement, Pass, PassSummary, ScenarioSpec, ServerMetrics
from llmtrial.report.answers import AnswersSection
from llmtrial.report.cells import FigureSpec, ScenarioTable, Settings
from llmtrial.report.charts import Chart
from llmtrial.report.conclusions import ColdWarm, Stream
from llmtrial.report.costs import EnergyRow
from llmtrial.report.multinode import NodesSection
from llmtrial.report.sweeps import SweepTable
from llmtrial.report.why_failed import WhyFailed


@dataclass(frozen=True)
class GpuWindow:
    """What NVML sampled of one GPU in one window (:data:`GPU_FIGURES`)."""

    configuration: str
    window: str
    gpu: str
    util: float | None = None
    mem_util: float | None = None
    power: float | None = None
    power_limit: float | None = None
    mem_used: float | None = None
    pcie_tx: float | None = None
    pcie_rx: float | None = None
    temp: float | None = None


@dataclass(frozen=True)
class HostWindow:
    """What the host source sampled in one window (:data:`HOST_FIGURES`)."""

    configuration: str
    window: str
    cpu: float | None = None
    tree_cpu: float | None = None
    tree_rss: float | None = None
    mem_used: float | None = None
    samples: float | None = None


@dataclass(frozen=True)
class SourceRow:
    """One telemetry source of one configuration: its status and the sampler's own figures for it."""

    configuration: str
    name: str
    source: TelemetrySource
    stats: SamplerStats


@dataclass(frozen=True)
class Sampling:
    """The report's telemetry section: each source, the energy per pass, how often the host source sampled,
    the host's and the GPUs' figures per window."""

    sources: list[SourceRow]
    energy: list[EnergyRow]
    host_interval_s: float
    hosts: list[HostWindow]
    gpus: list[GpuWindow]


@dataclass(frozen=True)
class BoundRows:
    """A plan's decode throughput bound and its configuration's passes measured beside it."""

    configuration: str
    bound: Fact
    rows: list[ThroughputBound]


@dataclass(frozen=True)
class PassRow:
    """One pass (``run``) of one configuration in a scenario's detailed table, the warm-up marked."""

    configuration: str
    run: Pass
    warmup: bool
    agreement: Agreement
    summary: PassSummary
    server_metrics: ServerMetrics


@dataclass(frozen=True)
class RepetitionNote:
    """Why a configuration's passes of a scenario stopped where they did, where that is worth saying."""

    configuration: str
    note: str


@dataclass(frozen=True)
class ScenarioPasses:
    """A scenario's detailed table: every pass of every configuration, the notes on repetition, what the
    trial file asked for and where prefix caching was on."""

    name: str
    spec: ScenarioSpec
    rows: list[PassRow]
    notes: list[RepetitionNote]
    passes_asked: str
    caching: str | None


@dataclass(frozen=True)
class GpuLook:
    """What one configuration's GPUs showed: the census before launch, the health check after a failure."""

    configuration: str
    census: GpuCensus | None
    health: GpuHealth | None


@dataclass(frozen=True)
class GpuSection:
    """The report's GPUs section: each configuration's look, the finding sentences, the GPUs still held."""

    rows: list[GpuLook]
    sentences: list[str]
    held: list[HeldGpu]


@dataclass(frozen=True)
class Finding:
    """One sentence of the report's first screen, and whether it quotes a figure."""

    text: str
    figure: bool


@dataclass(frozen=True)
class PhaseRow:
    """One configuration's start-up phases, one cell per phase name the report shows (None where its log has
    no such phase), their total, and what the start-up did with vLLM's compile cache."""

    configuration: str
    phases: list[StartupPhase | None]
    total: float | None
    compile_cache: str | None


@dataclass(frozen=True)
class ReportContext:
    """What the template sees: the records, the conclusions worked out of them, the charts and every
    section's rows (its fields are the template's names)."""

    trial: str
    generated: str
    environment: Environment
    preflight: PreflightRecord
    plans: list[PlanRecord]
    bounds: list[BoundRows]
    model: ModelShape | None
    skipped: list[ConfigurationRecord]
    manifest: ManifestRecord
    configurations: list[ConfigurationRecord]
    scenarios: list[ScenarioPasses]
    failures: list[ConfigurationRecord]
    cleanup: CleanupRecord
    left_behind: int
    patches: PatchesRecord | None
    quiet: QuietRecord | None
    n_ok: int
    settings: Settings
    per: str
    tables: list[ScenarioTable]
    sweeps: list[tuple[SweepTable, Chart | None]]
    any_warmup: bool
    outcomes: list[str]
    warnings: list[str]
    warned: list[ConfigurationRecord]
    phase_names: list[str]
    phase_rows: list[PhaseRow]
    unstable: dict[tuple[str, str], float | None]
    figures: tuple[FigureSpec, ...]
    charts: list[Chart]
    cold_warm: list[ColdWarm]
    streams: list[Stream]
    sampling: Sampling
    not_measured: list[str]
    cost: Cost | None
    energy_method: str
    energy_tolerance: float
    answers: AnswersSection | None
    notes: Markup
    provenance: ProvenanceRecord | None
    nodes: NodesSection | None
    gpus: GpuSection | None
    why_failed: WhyFailed | None
