"""The comparison record: one trial (A, the earlier) against another (B), what differs between them
and, per configuration x scenario x figure, B against A with the ratio's interval and the verdict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from llmtrial.core.record_base import RecordModel

Verdict = Literal["faster", "slower", "better", "worse", "no detectable difference", "unstable", "unresolved",
                  "at resolution", "not comparable"]


class TrialRef(RecordModel):
    """One side: a trial's results folder and what produced it, or another tool's Benchmark Reports."""

    folder: str = Field(description="The results folder, or the report file or folder, as given.")
    trial: str = Field(description="The trial's name; for reports, the file's or folder's name.")
    commit: str | None = Field(description="The project's commit that rendered its report (provenance); null unknown.")
    dirty: bool | None = Field(description="Whether the project's tracked files were changed then; null unknown.")
    recorded_at: float | None = Field(description="Unix time its preflight read the host; null for reports.")
    kind: Literal["trial", "benchmark report"] = Field("trial", description=(
        "A trial's results folder, or Benchmark Reports v0.2 (files of that format, or another tool's result "
        "files converted by llm-d's package)."))
    tool: str | None = Field(None, description=(
        "For reports: the tool that measured them, as they state it (scenario.load.standardized.tool and version), "
        "and the converter where llmtrial converted a result file; null for a trial."))


class Difference(RecordModel):
    """One thing that differs between the trials, with its value in each (null where a trial has none)."""

    aspect: Literal["model", "workload", "server", "vllm", "patches", "hardware", "measurement"] = Field(description=(
        "What differs: the model, the workload asked or served, a configuration's server arguments or "
        "environment, vLLM's version, the patches applied, the host's hardware, or how the passes were counted."))
    key: str = Field(description="The key that differs (scenarios.c1.output_len, configurations.tp1.args.max_num_seqs).")
    a: Any = Field(description="Its value in A.")
    b: Any = Field(description="Its value in B.")
    effect: Literal["not comparable", "under test", "noted"] = Field(description=(
        "not comparable: the workload differs, so no verdict is given where it applies; under test: the change "
        "the comparison measures; noted: listed, no verdict depends on it."))
    scope: str | None = Field(description=(
        "The scenario or configuration/scenario it applies to; null where it applies to the whole trial."))


class Side(RecordModel):
    """One trial's figure: median over passes, its interval over passes, the pass values."""

    median: float | None = Field(description="Median over passes; null without a completed pass.")
    low: float | None = Field(description="Low end of the interval over passes (llmtrial.core.stats.pass_interval); null below two passes.")
    high: float | None = Field(description="High end of that interval.")
    values: list[float] = Field(description="The figure of each completed pass.")


class Row(RecordModel):
    """B against A on one figure of one configuration in one scenario."""

    configuration: str = Field(description="Configuration name (matched by name).")
    scenario: str = Field(description="Scenario name (matched by name).")
    figure: str = Field(description="Figure key (output_tok_s, ttft_median_ms, ...).")
    label: str = Field(description="The figure as words.")
    unit: str = Field(description="Its unit.")
    higher_is_better: bool = Field(description="Whether a higher value is better.")
    a: Side = Field(description="A's figure.")
    b: Side = Field(description="B's figure.")
    ratio: float | None = Field(description="B over A: the ratio of geometric means over passes; null where not comparable.")
    low: float | None = Field(description="Low end of the ratio's interval at the level; null where it has none.")
    high: float | None = Field(description="High end of the ratio's interval.")
    verdict: Verdict = Field(description="B against A.")
    reason: str | None = Field(description="Why it is unstable or not comparable; null otherwise.")
    against: str | None = Field(None, description=(
        "Where the sides are not matched by name (a trial against reports): B's runs this row compares A's "
        "configuration and scenario with, as its reports state them; null otherwise."))
    test: str | None = Field(None, description=(
        "Where the sides are a trial and reports: which test gave the verdict and how far to trust it (over runs "
        "on both sides; one run against the other side's runs; none with one run a side); null for two trials "
        "(the method line says)."))


class AnswersRow(RecordModel):
    """One configuration's answers to the task set in B against A (the passes' servers)."""

    configuration: str = Field(description="The configuration both trials ran.")
    identical: int | None = Field(description="Tasks answered identically, character for character; null when not compared.")
    of: int | None = Field(description="Tasks compared; null when not compared.")
    differing: list[int] = Field(description="The tasks answered differently, by id.")
    right_a: int | None = Field(description="A's right answers; null without answers.")
    right_b: int | None = Field(description="B's right answers; null without answers.")
    reason: str | None = Field(description="Why the answers were not compared (no set in one trial, other tasks), or null.")


class ComparisonRecord(RecordModel):
    """Trial B against trial A (results/<B>/comparison/<A>/comparison.json): the comparability check first (every
    difference, each marked not comparable, under test or noted), then per configuration x scenario x figure the
    ratio B / A with its interval and the verdict. Written by llmtrial.compare; read by its page."""

    model_config = ConfigDict(title="comparison record")

    a: TrialRef = Field(description="The earlier trial.")
    b: TrialRef = Field(description="The later trial, the one compared with A.")
    level: float = Field(description="The confidence level of every interval and verdict.")
    method: str = Field(description="The level and the tests used, in one line.")
    workloads_match: bool = Field(description="No difference made a verdict not comparable.")
    differences: list[Difference] = Field(description="Every difference found, in the order checked.")
    changes: list[str] = Field(description="The changes being measured (differences under test), as sentences.")
    only_in_a: list[str] = Field(description="Configurations only A has.")
    only_in_b: list[str] = Field(description="Configurations only B has.")
    rows: list[Row] = Field(description="Per configuration in both x scenario in both x figure.")
    answers: list[AnswersRow] = Field(default_factory=list, description=(
        "Per configuration in both that was asked a task set: B's answers against A's."))
    sentences: list[str] = Field(description="What the comparison found, generated from the rows.")
