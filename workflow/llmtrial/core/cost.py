"""Cost and energy per output token: what a configuration's throughput costs at the operator's price, and what
each output token took in GPU energy where that was measured. Pure arithmetic over records.

The trial file's ``cost`` block is :class:`Cost`; the provenance record carries it validated
(:class:`llmtrial.core.record_models.ProvenanceRecord`), so the report and an exporter read it from the
records alone, never from the trial file::

    cost per million output tokens = price x units / (output tok/s x 3600) x 10^6

The units are the accelerators a configuration occupies (DP x TP x PP ranks,
:attr:`llmtrial.core.record_models.PlanRecord.accelerators`) for a price per accelerator-hour, or the hosts it
spans (:func:`hosts_of`) for a price per host-hour. The tok/s is each pass's output throughput as vLLM's
benchmark measured it (output tokens over the pass's duration, ``summary.output_throughput``); a scenario's
figure is the median, over the passes that succeeded, of each pass's cost, the way every ranked figure is a
median over passes (with an odd number of passes that is the cost at the median tok/s).

Energy per output token is a pass's GPU energy (``telemetry.energy_j``: NVML's counter, or where a GPU has none
the integral of its sampled power, marked estimated) over the output tokens the benchmark counted
(``summary.total_output_tokens``). It is None where no GPU energy was sampled, and for a configuration across
nodes (only the GPUs of the host that ran the job are sampled). MLCommons' worked example: 1,045,212 J over
4,800,915 tokens is 0.2177 J per token.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.record_base import RecordModel
from llmtrial.core.scenario_model import Pass

#: Seconds in the hour a price is quoted for, and the tokens a cost figure is quoted per.
HOUR_S, PER_TOKENS = 3600.0, 1_000_000

#: What one unit of a price is: an accelerator (a GPU, or a CPU worker) or a host, for an hour.
PER_WORDS = {"accelerator_hour": "accelerator-hour", "host_hour": "host-hour"}


class Cost(RecordModel):
    """The trial file's ``cost`` block: a price per accelerator-hour or per host-hour, in a currency."""

    price: float = Field(gt=0, description="The price of one unit for one hour.")
    per: Literal["accelerator_hour", "host_hour"] = Field(description=(
        "accelerator_hour: the price of one accelerator (a GPU, or a CPU worker on a CPU host) for an hour, "
        "times the DP x TP x PP ranks of a configuration; host_hour: of one host, times the hosts it spans."))
    currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")] = Field(description="ISO 4217 code (USD, EUR).")
    note: str = Field("", description="Where the price comes from (a list price, a contract, an example).")

    @property
    def unit(self) -> str:
        """The unit of every cost figure: ``USD per million output tokens``."""
        return f"{self.currency} per million output tokens"

    @property
    def rate(self) -> str:
        """The price as words: ``2.00 USD per accelerator-hour``, with its note."""
        note = f" ({self.note})" if self.note else ""
        return f"{self.price:,.2f} {self.currency} per {PER_WORDS[self.per]}{note}"

    def units(self, accelerators: int | None, hosts: int) -> int | None:
        """How many units of the price one configuration occupies; None where its accelerators are unknown."""
        return hosts if self.per == "host_hour" else accelerators


def cost_per_million_output_tokens(price_per_hour: float, units: int | None, tok_s: float | None) -> float | None:
    """``price_per_hour x units / (tok_s x 3600) x 10^6``: what a million output tokens cost at ``tok_s`` on
    ``units`` units of the price; None without units or throughput."""
    if not units or tok_s is None or tok_s <= 0:
        return None
    return price_per_hour * units / (tok_s * HOUR_S) * PER_TOKENS


def energy_per_output_token(joules: float | None, tokens: float | None) -> float | None:
    """Joules per output token; None without energy or tokens."""
    if joules is None or not tokens or tokens <= 0:
        return None
    return joules / tokens


def hosts_of(record: ConfigurationRecord) -> int:
    """The hosts a configuration spans: its nodes across hosts, else the one host that ran its job."""
    return len(record.nodes) if record.nodes else 1


def whole_energy(record: ConfigurationRecord) -> bool:
    """Whether the job's sampler saw every GPU of the configuration (not so across nodes: it samples its own host)."""
    return hosts_of(record) == 1


def pass_energy_j(p: Pass, whole: bool = True) -> float | None:
    """A pass's GPU energy, J, where it was sampled and covers the configuration (``whole``)."""
    return p.telemetry.energy_j if whole and p.telemetry is not None else None


def pass_cost_figures(p: Pass, cost: Cost | None, units: int | None, whole: bool = True) -> dict[str, float | None]:
    """A pass's cost per million output tokens (None without ``cost``) and its energy per output token."""
    summary = p.summary
    tok_s = summary.output_throughput if summary else None
    tokens = summary.total_output_tokens if summary else None
    return {"cost_per_mtok": cost_per_million_output_tokens(cost.price, units, tok_s) if cost else None,
            "energy_per_token_j": energy_per_output_token(pass_energy_j(p, whole), tokens)}


def energy_kind(passes: list[Pass]) -> Literal["measured", "estimated"] | None:
    """How the passes' GPU energy was had: measured (every counter), estimated (some integral), None (none)."""
    kinds = {p.telemetry.energy_kind or "measured" for p in passes if p.telemetry and p.telemetry.energy_j}
    return "estimated" if "estimated" in kinds else ("measured" if kinds else None)


def energy_disagreements(passes: list[Pass]) -> list[tuple[Any, float]]:
    """(pass, the largest counter-to-integral difference of its GPUs) for each pass whose energy check failed."""
    out = []
    for p in passes:
        check = p.telemetry.energy_check if p.telemetry else None
        if check is not None and check.disagrees:
            out.append((p.pass_, max((abs(g.difference) for g in check.gpus.values() if g.difference is not None),
                                     default=0.0)))
    return out


@dataclass(frozen=True)
class ScenarioCost:
    """One configuration in one scenario: its cost per million output tokens and its energy per output token,
    each the median over the scenario's passes that succeeded (None where it has none)."""

    configuration: str
    scenario: str
    passes: int
    units: int | None
    cost_per_million_output_tokens: float | None
    currency: str | None
    energy_per_output_token_j: float | None
    energy_kind: Literal["measured", "estimated"] | None
    energy_disagrees: bool


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def scenario_cost(record: ConfigurationRecord, scenario: str, cost: Cost | None,
                  accelerators: int | None) -> ScenarioCost:
    """The cost and energy figures of ``record`` in the scenario named ``scenario`` (a configuration that did
    not run it, or failed, has none); ``accelerators`` is its plan's :attr:`PlanRecord.accelerators`."""
    entry = next((sc for sc in record.scenarios if sc.name == scenario), None)
    ok = entry.ok_passes() if entry is not None and record.status == "ok" else []
    units = cost.units(accelerators, hosts_of(record)) if cost else None
    per_pass = [pass_cost_figures(p, cost, units, whole_energy(record)) for p in ok]
    measured = [p for p, f in zip(ok, per_pass, strict=True) if f["energy_per_token_j"] is not None]
    return ScenarioCost(configuration=record.configuration, scenario=scenario, passes=len(ok), units=units,
                        cost_per_million_output_tokens=_median([f["cost_per_mtok"] for f in per_pass]),
                        currency=cost.currency if cost else None,
                        energy_per_output_token_j=_median([f["energy_per_token_j"] for f in per_pass]),
                        energy_kind=energy_kind(measured), energy_disagrees=bool(energy_disagreements(measured)))
