"""A window's energy from what telemetry sampled: each GPU's from NVML's energy counter, checked against the
trapezoid integral of its sampled power, and the CPU packages' from the kernel's RAPL counters.

NVML's total-energy counter and the integral of sampled power have been seen to disagree
(kokkos/kokkos-tools#295), so the energy figure does not rest on one source: per GPU, the change of
``gpu<i>.energy_mj`` over the window is set beside the integral of ``gpu<i>.power_w`` over the same
samples, and the window is marked where they differ by more than :data:`ENERGY_TOLERANCE` of the counter
(or where the counter did not move while power was drawn). A GPU without a counter gets the integral as
its energy, and the window's energy is then ``estimated``. CPU package energy (RAPL) is kept apart, under
its own name: it is the CPUs', never the GPUs'.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llmtrial.core.scenario_model import EnergyCheck, GpuEnergy, WindowFigures
from llmtrial.host.telemetry_sources import RAPL_SOURCE

__all__ = ["ENERGY_TOLERANCE", "GPU_METRIC", "gpu_energy", "trapezoid_j", "window_energy"]

#: The share of a GPU's counter its power integral may differ by before the window is marked.
ENERGY_TOLERANCE = 0.10
#: A GPU's power or energy metric, as NVML's source names it: ``gpu0.power_w``, ``gpu0.energy_mj``.
GPU_METRIC = re.compile(r"^(gpu\d+)\.(power_w|energy_mj)$")

#: (times, values) of one ``source.metric`` inside a window, in time order.
Series = Callable[[str, str], tuple[Any, Any]]


def trapezoid_j(times: Any, watts: Any) -> float | None:
    """The trapezoid integral of power samples (W at Unix seconds) in joules; None below two samples."""
    if len(times) < 2:
        return None
    return float(sum((times[i + 1] - times[i]) * (watts[i + 1] + watts[i]) / 2.0 for i in range(len(times) - 1)))


def gpu_energy(counter_j: float | None, integral_j: float | None, samples: int,
               tolerance: float = ENERGY_TOLERANCE) -> GpuEnergy:
    """One GPU's two figures and whether they disagree: by more than ``tolerance`` of the counter, or a counter
    that did not move while power was drawn; None where one of them is missing."""
    difference = (integral_j - counter_j) / counter_j if counter_j and integral_j is not None else None
    if difference is not None:
        disagrees: bool | None = abs(difference) > tolerance
    elif counter_j is not None and integral_j is not None:  # the counter stood still
        disagrees = integral_j > 0
    else:
        disagrees = None
    return GpuEnergy(counter_j=counter_j, integral_j=integral_j, power_samples=samples, difference=difference,
                     disagrees=disagrees)


def window_energy(series: Series, keys: Iterable[tuple[str, str]], deltas: Mapping[str, float],
                  tolerance: float = ENERGY_TOLERANCE) -> WindowFigures:
    """The energy figures of a window for :func:`llmtrial.serve.telemetry.window_figures`: ``energy_j`` (GPUs,
    J) with ``energy_kind``, ``energy_check`` per GPU and ``cpu_package_energy_j``, each only where sampled
    (the window's other figures unset).
    ``keys`` are the ``(source, metric)`` pairs sampled in the window, ``deltas`` the counters' changes."""
    gpus = sorted({(source, m.group(1)) for source, metric in keys if (m := GPU_METRIC.match(metric))})
    checks: dict[str, GpuEnergy] = {}
    total, estimated = 0.0, False
    for source, gpu in gpus:
        counter_mj = deltas.get(f"{source}.{gpu}.energy_mj")
        counter_j = counter_mj / 1000.0 if counter_mj is not None else None
        times, watts = series(source, f"{gpu}.power_w")
        integral_j = trapezoid_j(times, watts)
        checks[f"{source}.{gpu}"] = gpu_energy(counter_j, integral_j, len(times), tolerance)
        if counter_j is not None:
            total += counter_j
        elif integral_j is not None:
            total, estimated = total + integral_j, True
    out = WindowFigures()
    if total > 0:
        out.energy_j, out.energy_kind = total, "estimated" if estimated else "measured"
    if checks:
        out.energy_check = EnergyCheck(tolerance=tolerance, gpus=checks,
                                       disagrees=any(c.disagrees for c in checks.values()))
    package = [d for k, d in deltas.items() if k.startswith(f"{RAPL_SOURCE}.") and k.endswith(".energy_uj")]
    if package:
        out.cpu_package_energy_j = sum(package) / 1e6
    return out
