"""A window's GPU energy checked two ways (llmtrial.serve.energy through window_figures): NVML's counter
against the trapezoid integral of sampled power, on worked samples and through the NVML double."""

from __future__ import annotations

import time

import pytest

from conftest import NvmlPowerDouble, sampled_at
from llmtrial.core.scenario_model import WindowFigures
from llmtrial.host.telemetry_sources import NvmlSource
from llmtrial.serve.energy import ENERGY_TOLERANCE, trapezoid_j
from llmtrial.serve.telemetry import read_samples, window_figures


def samples(points: list[tuple[float, dict[str, float]]], source: str = "nvml") -> dict[str, list]:
    """Long-format rows of ``(t, {metric: value})`` points, as the samples CSV holds them."""
    rows: dict[str, list] = {"t": [], "source": [], "metric": [], "value": []}
    for t, values in points:
        for metric, value in values.items():
            rows["t"].append(t), rows["source"].append(source), rows["metric"].append(metric), rows["value"].append(value)
    return rows


def test_the_trapezoid_of_a_power_ramp():
    # 100 W, 200 W, 300 W a second apart: (100 + 200) / 2 + (200 + 300) / 2 = 150 + 250 = 400 J
    assert trapezoid_j([0.0, 1.0, 2.0], [100.0, 200.0, 300.0]) == 400.0
    assert trapezoid_j([0.0], [100.0]) is None


def ramp(counter_mj: list[float]) -> dict[str, list]:
    """GPU 0 drawing 100, 200, 300 W at t 10, 11, 12 (400 J by the trapezoid) with its counter as given."""
    return samples([(10.0 + i, {"gpu0.power_w": w, "gpu0.energy_mj": e})
                    for i, (w, e) in enumerate(zip([100.0, 200.0, 300.0], counter_mj, strict=True))])


def test_a_counter_that_agrees_with_the_integral_is_not_marked():
    # 420 J: 5 % above 400 J
    fig = window_figures(ramp([5_000_000, 5_150_000, 5_420_000]), 10.0, 12.0).model_dump(exclude_unset=True)
    gpu = fig["energy_check"]["gpus"]["nvml.gpu0"]
    assert gpu["counter_j"] == 420.0 and gpu["integral_j"] == 400.0 and gpu["power_samples"] == 3
    assert gpu["difference"] == pytest.approx((400.0 - 420.0) / 420.0) and gpu["disagrees"] is False
    assert fig["energy_check"]["disagrees"] is False and fig["energy_check"]["tolerance"] == ENERGY_TOLERANCE
    assert fig["energy_j"] == 420.0 and fig["energy_kind"] == "measured"  # the counter is the figure


def test_a_counter_more_than_10_percent_off_the_integral_is_marked():
    # 500 J against 400 J: 20 %
    fig = window_figures(ramp([5_000_000, 5_200_000, 5_500_000]), 10.0, 12.0).model_dump(exclude_unset=True)
    gpu = fig["energy_check"]["gpus"]["nvml.gpu0"]
    assert gpu["difference"] == pytest.approx(-0.2) and gpu["disagrees"] is True
    assert fig["energy_check"]["disagrees"] is True and fig["energy_j"] == 500.0


def test_a_counter_that_stood_still_while_power_was_drawn_is_marked():
    fig = window_figures(ramp([5_000_000] * 3), 10.0, 12.0).model_dump(exclude_unset=True)
    gpu = fig["energy_check"]["gpus"]["nvml.gpu0"]
    assert gpu["counter_j"] == 0.0 and gpu["difference"] is None and gpu["disagrees"] is True
    assert "energy_j" not in fig  # no energy figure rests on a counter that did not move


def test_without_a_counter_the_integral_is_the_energy_named_an_estimate():
    rows = samples([(10.0 + i, {"gpu0.power_w": w}) for i, w in enumerate([100.0, 200.0, 300.0])])
    rows["t"] += [10.0, 12.0]
    rows["source"] += ["metrics", "metrics"]
    rows["metric"] += ["generation_tokens_total"] * 2
    rows["value"] += [0.0, 800.0]
    fig = window_figures(rows, 10.0, 12.0).model_dump(exclude_unset=True)
    assert fig["energy_j"] == 400.0 and fig["energy_kind"] == "estimated"
    assert fig["energy_check"]["gpus"]["nvml.gpu0"]["disagrees"] is None  # nothing to check against
    assert fig["tokens_per_joule"] == 800.0 / 400.0
    WindowFigures.model_validate(fig)


@pytest.mark.parametrize("scale, flagged", [(1.05, False), (1.3, True)])
def test_the_nvml_doubles_counter_is_checked_against_its_sampled_power(tmp_path, scale, flagged):
    # NVML is a test double (no GPU here): 300 W on each of two GPUs, its counter running at `scale` x that;
    # sampled through the sampler at times 0.05 s apart that the double's clock shares
    base = float(int(time.time()) + 10)
    times = [base + i * 0.05 for i in range(11)]
    df = read_samples(sampled_at(tmp_path / "telemetry.csv", NvmlSource(NvmlPowerDouble(counter_scale=scale)), times))
    fig = window_figures(df, times[0], times[-1]).model_dump(exclude_unset=True)
    check = fig["energy_check"]
    assert sorted(check["gpus"]) == ["nvml.gpu0", "nvml.gpu1"] and check["disagrees"] is flagged
    for name, gpu in check["gpus"].items():
        power = df[(df.source == "nvml") & (df.metric == f"{name.split('.')[1]}.power_w") & (df.t >= times[0])].t
        assert gpu["power_samples"] == len(power) == len(times)
        assert gpu["integral_j"] == pytest.approx(300.0 * (power.max() - power.min()))  # 300 W held throughout
        assert gpu["counter_j"] == pytest.approx(scale * gpu["integral_j"], rel=1e-4)
        assert gpu["difference"] == pytest.approx(1 / scale - 1, abs=1e-3) and gpu["disagrees"] is flagged
    assert fig["energy_j"] == pytest.approx(sum(g["counter_j"] for g in check["gpus"].values()))
    WindowFigures.model_validate(fig)  # the record's part
