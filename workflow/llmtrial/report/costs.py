"""What the report says about cost and energy, from the records alone: the cost per million output tokens and
the energy per output token as ranked figures, each pass's energy check, and what was not measured.

The price is the provenance record's ``cost`` (:class:`llmtrial.core.cost.Cost`); the arithmetic is
:mod:`llmtrial.core.cost`'s, the one an exporter uses too. The cost figure is ranked in every scenario
when a price is given, the energy figure where some configuration's passes have GPU energy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.cost import (
    Cost,
    energy_disagreements,
    energy_kind,
    energy_per_output_token,
    hosts_of,
    pass_energy_j,
    whole_energy,
)
from llmtrial.core.preflight_model import PreflightRecord
from llmtrial.core.scenario_model import GpuEnergy, Pass, WindowFigures
from llmtrial.host.telemetry_sources import RAPL_LABEL, RAPL_SOURCE
from llmtrial.report.cells import CellEnergy, EnergyDisagreement, ScenarioTable
from llmtrial.serve.energy import ENERGY_TOLERANCE

#: The energy figure (key, label, unit, higher is better, digits), ranked where GPU energy was measured.
ENERGY_FIGURE = ("energy_per_token_j", "energy per output token", "J (GPUs)", False, 4)


def cost_figure(cost: Cost) -> tuple[str, str, str, bool, int]:
    """The cost figure, its unit naming the currency: ``cost per million output tokens``, ``USD``."""
    return ("cost_per_mtok", "cost per million output tokens", cost.currency, False, 3)


def ok_entries(configurations: Iterable[ConfigurationRecord], scenario: str) -> list[tuple[ConfigurationRecord, list[Pass]]]:
    """Each configuration that completed, with its passes that succeeded in the scenario named."""
    return [(rec, sc.ok_passes()) for rec in configurations if rec.status == "ok"
            for sc in rec.scenarios if sc.name == scenario]


def has_energy(configurations: Iterable[ConfigurationRecord], scenario: str) -> bool:
    """Whether some configuration's passes in the scenario have GPU energy that covers it."""
    return any(pass_energy_j(p, whole_energy(rec)) for rec, ok in ok_entries(configurations, scenario) for p in ok)


def cell_energy(ok: list[Pass]) -> CellEnergy:
    """How a cell's energy was had (measured, estimated, None) and the passes whose energy check failed, with
    the largest difference of their GPUs' counter and power integral (a share of the counter)."""
    return CellEnergy(kind=energy_kind(ok),
                      disagree=[EnergyDisagreement(pass_=n, difference=d) for n, d in energy_disagreements(ok)])


def cost_sentence(table: ScenarioTable, cost: Cost | None) -> str | None:
    """Each configuration's cost per million output tokens in a scenario, cheapest first, at the price given."""
    priced = sorted(((m, c.configuration) for c in table.ok() if (m := c.median("cost_per_mtok")) is not None),
                    key=lambda x: x[0])
    if cost is None or not priced:
        return None
    listed = "; ".join(f"{name} {value:,.3f} {cost.currency}" for value, name in priced)
    cheapest = f"; {priced[0][1]} is the cheapest" if len(priced) > 1 else ""
    return (f"At {cost.rate}, a million output tokens in scenario {table.name} cost: {listed} "
            f"(the median over passes{cheapest}).")


def _energy_sentences(preflight: PreflightRecord, configurations: Sequence[ConfigurationRecord]) -> list[str]:
    out = []
    served = [r for r in configurations if r.status == "ok"]
    if not preflight.environment.gpus.present:
        if served:
            out.append("No GPU energy was measured (no GPU), so no configuration has an energy per output token.")
        return out
    for r in served:
        ok = [p for sc in r.scenarios for p in sc.ok_passes()]
        if hosts_of(r) > 1:
            out.append(f"{r.configuration} spans {hosts_of(r)} hosts: only the GPUs of the host that ran its job are "
                       "sampled, so it has no energy per output token.")
        elif ok and not any(pass_energy_j(p) for p in ok):
            out.append(f"{r.configuration}: no GPU energy was sampled in its passes (NVML gave neither an energy "
                       "counter nor power), so it has no energy per output token.")
    return out


def _rapl_sentences(configurations: Sequence[ConfigurationRecord]) -> list[str]:
    seen: dict[str, list[str]] = {}
    for r in configurations:
        src = (r.telemetry.sources or {}).get(RAPL_SOURCE)
        if src is not None and src.status == "absent":
            seen.setdefault(src.reason or "absent", []).append(r.configuration)
    return [f"{RAPL_LABEL} was not measured: {why} ({', '.join(names)})." for why, names in seen.items()]


def cost_gaps(*, preflight: PreflightRecord, configurations: Sequence[ConfigurationRecord], cost: Cost | None,
              tables: Iterable[ScenarioTable]) -> list[str]:
    """What the records say about cost and energy that was not measured or not given, one sentence each."""
    out = _energy_sentences(preflight, configurations) + _rapl_sentences(configurations)
    if cost is None and list(tables):
        out.append("No cost per million output tokens: the trial file gives no price (its cost block, per "
                   "accelerator-hour or per host-hour, with the currency).")
    return out


@dataclass(frozen=True)
class EnergyRow:
    """One pass with GPU or CPU package energy: its window's figures, each GPU's energy check and the energy
    per output token (GPU, CPU package)."""

    configuration: str
    window: str
    figures: WindowFigures
    checks: dict[str, GpuEnergy]
    per_token_j: float | None
    cpu_per_token_j: float | None


def energy_rows(configurations: Sequence[ConfigurationRecord]) -> list[EnergyRow]:
    """Per pass with GPU or CPU package energy: its figures, its energy check and its energy per output token."""
    rows = []
    for r in configurations:
        for sc in r.scenarios:
            for p in sc.pass_results:
                t = p.telemetry
                if t is None or not (t.energy_j or t.energy_check or t.cpu_package_energy_j is not None):
                    continue
                tokens = p.summary.total_output_tokens if p.summary else None
                rows.append(EnergyRow(
                    configuration=r.configuration, window=f"{sc.name} pass {p.pass_}", figures=t,
                    checks=t.energy_check.gpus if t.energy_check else {},
                    per_token_j=energy_per_output_token(pass_energy_j(p, whole_energy(r)), tokens),
                    cpu_per_token_j=energy_per_output_token(t.cpu_package_energy_j, tokens)))
    return rows


def energy_method() -> str:
    """How the energy figures are had, in one paragraph's words."""
    return (f"A pass's GPU energy is the change of NVML's energy counter over its window, summed over the "
            f"configuration's GPUs; each GPU's counter is checked against the trapezoid integral of its sampled "
            f"power over the same window and the pass is marked where they differ by more than "
            f"{100 * ENERGY_TOLERANCE:g} % of the counter. A GPU without a counter gets the integral, marked "
            f"estimated. Energy per output token divides by the output tokens the benchmark counted. "
            f"{RAPL_LABEL} is the CPUs' energy, never counted as the GPUs'.")
