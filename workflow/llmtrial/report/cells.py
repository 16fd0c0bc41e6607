"""What the report works out per scenario from the records: each figure over passes, each configuration's
cell (its figures, its passes and why they stopped, its stability) and each scenario's table of cells.

:mod:`llmtrial.report.conclusions` builds them; the template, the charts, the cost sentences and
``llmtrial compare`` read them by attribute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llmtrial.core.cost import Cost
from llmtrial.core.scenario_model import Repetition, ScenarioSpec
from llmtrial.core.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, Interval
from llmtrial.core.trial_config import ReportBlock, StatisticsBlock
from llmtrial.report.verdicts import Verdict, method_line

#: A ranked figure: key, label, unit, whether higher is better, digits shown.
FigureSpec = tuple[str, str, str, bool, int]


@dataclass(frozen=True)
class Settings:
    """The trial file's ``report`` block (the baseline configuration, the agreement threshold and the
    operator's notes) and its ``statistics`` block (the confidence level, the bootstrap's resamples and seed)."""

    baseline: str | None = None
    max_disagreement: float = ReportBlock().max_disagreement  # the spread of AGREEMENT_FIGURE that makes a configuration unstable
    notes: str | None = None
    level: float = DEFAULT_LEVEL
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED

    @classmethod
    def from_config(cls, report: ReportBlock | None = None, statistics: StatisticsBlock | None = None) -> Settings:
        """The settings of the trial file's ``report`` and ``statistics`` blocks (their defaults where not given)."""
        report, st = report or ReportBlock(), statistics or StatisticsBlock()
        return cls(baseline=report.baseline, notes=report.notes or None, max_disagreement=float(report.max_disagreement),
                   level=float(st.level), resamples=st.bootstrap_resamples, seed=st.bootstrap_seed)

    def method_line(self) -> str:
        """The confidence level and the tests behind every interval and verdict, in one line."""
        return method_line(self.level, self.resamples, self.seed)


@dataclass
class FigureOverPasses:
    """One figure over a scenario's passes: the pass ``values``, their median, min, max and count, the spread
    ((max - min) / mean), the interval over passes ``ci`` (:func:`llmtrial.core.stats.pass_interval`) and the coefficient of variation ``cv`` (None
    below two passes); ``bootstrap``, a latency figure's interval over requests; ``best``, ``tied`` and
    ``vs_baseline`` (the verdict against the baseline) once the configurations are compared."""

    values: list[float]
    median: float
    min: float
    max: float
    n: int
    spread: float | None
    ci: Interval | None
    cv: float | None
    bootstrap: Interval | None = None
    best: bool = False
    tied: bool = False
    vs_baseline: Verdict | None = None


@dataclass(frozen=True)
class SloPasses:
    """How many passes met the scenario's latency target at its percentile."""

    met: int
    n: int
    percentile: float | None


@dataclass(frozen=True)
class Stall:
    """A pass whose mean TTFT is far above its median."""

    pass_: int
    mean_ttft_ms: float | None
    median_ttft_ms: float | None


@dataclass(frozen=True)
class EnergyDisagreement:
    """A pass whose GPUs' energy counter and power integral differ beyond the tolerance: the largest
    difference, as a share of the counter."""

    pass_: int
    difference: float


@dataclass(frozen=True)
class CellEnergy:
    """How a cell's energy was had (measured, estimated, None) and the passes whose energy check failed."""

    kind: Literal["measured", "estimated"] | None = None
    disagree: list[EnergyDisagreement] = field(default_factory=list)


@dataclass
class Cell:
    """One configuration in one scenario: its ``figures`` (None where it has none), how many passes ran and
    why they stopped, its stalls and stability, its rank among the configurations that completed, and how its
    energy was had (``energy``: kind, and the passes whose energy check failed)."""

    configuration: str
    figures: dict[str, FigureOverPasses | None]
    energy: CellEnergy
    status: str = "ok"
    passes: int = 0
    stalls: list[Stall] = field(default_factory=list)
    unstable: bool = False
    diagnosis: str | None = None
    slo: SloPasses | None = None
    spread: float | None = None
    rank: int | None = None
    repetition: Repetition | None = None
    repetition_note: str | None = None
    repetition_shown: bool = False

    def median(self, key: str) -> float | None:
        """The median over passes of one figure, None where it has none."""
        fig = self.figures.get(key)
        return fig.median if fig else None


@dataclass
class ScenarioTable:
    """One scenario: every configuration's cell, ranked, with what the scenario asked for and how it is judged."""

    name: str
    spec: ScenarioSpec
    cells: list[Cell]
    baseline: str | None
    figures: tuple[FigureSpec, ...]
    ranked_by: str
    passes_asked: str
    slo_text: str | None
    unstable: list[str]
    single_pass: list[str]
    settings: Settings
    cost: Cost | None
    energy: bool
    sentences: list[str] = field(default_factory=list)

    def ok(self) -> list[Cell]:
        """The cells of the configurations that completed the scenario."""
        return [c for c in self.cells if c.status == "ok"]
