"""Cost and energy in the report, from the records alone: the price comes from the provenance record, the
cost per million output tokens and the energy per output token are ranked with their units (the currency
named), a pass whose GPU energy counter and power integral disagree is marked, and a trial without a GPU
says what it did not measure."""

from __future__ import annotations

import re
import statistics
import time

import pytest

from conftest import NvmlDouble, NvmlPowerDouble, sampled_at
from llmtrial.core.records import load_record, read_record, write_record
from llmtrial.host.telemetry_sources import NvmlSource, RaplSource
from llmtrial.lifecycle.preflight import environment_record
from llmtrial.provenance import collect
from llmtrial.report.render import build_context, render_report
from llmtrial.report.verdicts import NO_DIFFERENCE, UNSTABLE
from llmtrial.serve.telemetry import read_samples, window_figures
from synthetic import DEMO, as_model, demo
from workflow_helpers import default_config

PRICE = {"price": 2.00, "per": "accelerator_hour", "currency": "USD", "note": "example"}


def provenance(tmp_path, cost=PRICE):
    """The provenance record of the default trial with ``cost``, written and read back as the report reads it."""
    config = default_config()
    if cost is not None:
        config["cost"] = dict(cost)
    path = write_record(tmp_path / "provenance.json", collect(config, configfiles=[], command=None, repo=tmp_path),
                        schema="provenance")
    return load_record(path, "provenance")


def rapl_absent(record: dict) -> dict:
    """A configuration record whose job listed the RAPL source as this host has it (no powercap here)."""
    src = RaplSource()
    assert not src.available  # this machine has no /sys/class/powercap
    record["telemetry"]["sources"]["rapl"] = {"status": "absent", "reason": src.reason}
    return record


def ranking(html: str, scenario: str) -> str:
    return html.split(f"<h3>Scenario {scenario} ", 1)[1].split("</table>", 1)[0]


def row_of(table: str, configuration: str) -> str:
    return next(r for r in table.split("<tr") if f"<b>{configuration}</b>" in r)


def test_a_cpu_trial_ranks_cost_in_its_currency_and_says_no_energy_was_measured(tmp_path):
    records = [rapl_absent(read_record(DEMO / f"{n}.json")) for n in ("tp1", "tp2")]
    plans = [demo("plan-tp1", "plan"), demo("plan-tp2", "plan")]
    ctx = build_context(trial="demo", preflight=demo("preflight", "preflight"), manifest=demo("manifest", "manifest"),
                        plans=plans, configurations=[as_model("configuration", r) for r in records],
                        cleanup=demo("cleanup", "cleanup"), provenance=provenance(tmp_path))
    html = render_report(ctx)
    c4 = ranking(html, "c4")
    assert "cost per million output tokens" in c4 and "USD, lower is better" in c4
    assert "energy per output token" not in c4  # no GPU: no energy figure to rank
    [tp2] = [c for c in ctx.tables[1].cells if c.configuration == "tp2"]
    verdict = tp2.figures["cost_per_mtok"].vs_baseline  # against tp1, said of money, not of speed
    assert verdict.word in ("better", "worse", NO_DIFFERENCE, UNSTABLE) and verdict.as_text() in row_of(c4, "tp2")
    by_hand = {}
    for rec, plan in zip(records, plans, strict=True):
        workers = plan.plan["tensor_parallel_size"] * plan.plan["pipeline_parallel_size"]  # CPU workers
        tok_s = [p["summary"]["output_throughput"] for p in rec["scenarios"][1]["pass_results"]]
        by_hand[rec["configuration"]] = statistics.median(2.00 * workers / (t * 3600) * 1e6 for t in tok_s)
        assert f"{by_hand[rec['configuration']]:,.3f}" in row_of(c4, rec["configuration"])
    findings = html.split('<h2 id="findings">', 1)[1].split("</ul>", 1)[0]
    cheap, dear = sorted(by_hand, key=by_hand.get)
    assert (f"At 2.00 USD per accelerator-hour (example), a million output tokens in scenario c4 cost: "
            f"{cheap} {by_hand[cheap]:,.3f} USD; {dear} {by_hand[dear]:,.3f} USD (the median over passes; {cheap} is "
            "the cheapest).") in findings
    gaps = html.split('<h2 id="not-measured">', 1)[1].split("</ul>", 1)[0]
    assert "No GPU energy was measured (no GPU), so no configuration has an energy per output token." in gaps
    assert f"CPU package energy (RAPL) was not measured: {RaplSource().reason} (tp1, tp2)." in gaps
    assert "No cost per million output tokens" not in gaps


def test_without_a_price_there_is_no_cost_figure_and_the_report_says_so(tmp_path):
    ctx = build_context(trial="demo", preflight=demo("preflight", "preflight"), manifest=demo("manifest", "manifest"),
                        plans=[demo("plan-tp1", "plan")], configurations=[demo("tp1", "configuration")],
                        cleanup=demo("cleanup", "cleanup"), provenance=provenance(tmp_path, cost=None))
    html = render_report(ctx)
    assert "cost per million output tokens" not in ranking(html, "c1")
    assert "No cost per million output tokens: the trial file gives no price" in html.split('<h2 id="not-measured">', 1)[1]


def gpu_trial(tmp_path, scale: float):
    """The default trial's tp1 records with each pass's telemetry sampled from the NVML double (NVML is a
    test double here: no GPU on this machine), its counter running at ``scale`` x its power's energy."""
    tp1 = read_record(DEMO / "tp1.json")
    passes = [p for sc in tp1["scenarios"] for p in sc["pass_results"]]
    base = float(int(time.time()) + 10)  # sampled 0.05 s apart at times the double's clock shares
    times = [base + i * 0.05 for i in range(4 * len(passes) + 1)]
    df = read_samples(sampled_at(tmp_path / "telemetry.csv", NvmlSource(NvmlPowerDouble(counter_scale=scale)), times))
    for i, p in enumerate(passes):  # each pass a window of its own: 5 samples, 0.2 s
        p["telemetry"] = window_figures(df, times[4 * i], times[4 * i + 4]).model_dump(exclude_unset=True)
    preflight = as_model("preflight", {**read_record(DEMO / "preflight.json"), "environment": environment_record(nvml=NvmlDouble())})
    ctx = build_context(trial="demo", preflight=preflight, manifest=demo("manifest", "manifest"),
                        plans=[demo("plan-tp1", "plan")], configurations=[as_model("configuration", tp1)],
                        cleanup=demo("cleanup", "cleanup"), provenance=provenance(tmp_path), telemetry={"tp1": df})
    return tp1, df, render_report(ctx)


@pytest.mark.parametrize("scale, flagged", [(1.0, False), (1.3, True)])
def test_energy_per_output_token_from_the_nvml_double_is_ranked_and_a_disagreeing_counter_marked(tmp_path, scale, flagged):
    tp1, df, html = gpu_trial(tmp_path, scale)
    for sc in tp1["scenarios"]:
        for p in sc["pass_results"]:
            fig = p["telemetry"]
            assert fig["energy_kind"] == "measured" and fig["energy_check"]["disagrees"] is flagged
            # two GPUs at 300 W, each counter running at `scale` x the energy that power delivers
            gpus = fig["energy_check"]["gpus"]
            for gpu in gpus.values():
                assert gpu["power_samples"] == 5 and gpu["integral_j"] == pytest.approx(300.0 * 0.2)
                assert gpu["counter_j"] == pytest.approx(scale * gpu["integral_j"], rel=1e-4)
            assert fig["energy_j"] == pytest.approx(sum(g["counter_j"] for g in gpus.values()))
        table = ranking(html, sc["name"])
        assert "energy per output token" in table and "J (GPUs), lower is better" in table
        by_hand = statistics.median(p["telemetry"]["energy_j"] / p["summary"]["total_output_tokens"]
                                    for p in sc["pass_results"])
        row = row_of(table, "tp1")
        assert f"{by_hand:,.4f}" in row
        assert ("⚠ counter and power integral differ by more than 10 %" in row) is flagged
        worst = max(abs(g["difference"]) for g in sc["pass_results"][0]["telemetry"]["energy_check"]["gpus"].values())
        said = f"energy check, pass 1: NVML's energy counter and the integral of sampled power differ by {100 * worst:,.1f} %"
        assert (said in row) is flagged
    energy = html.split("<h3>Energy per pass</h3>", 1)[1].split("</table>", 1)[0]
    assert energy.count("nvml.gpu0:") == 4 and energy.count("nvml.gpu1:") == 4
    assert ("⚠ differ by more than 10 %" in energy) is flagged
    assert re.search(r"more than 10 % of the counter", html)
    assert "No GPU energy was measured" not in html
