"""What the trial concludes, worked out from the records alone (no log is read again).

Per scenario the configurations are ranked on the figures that matter, each figure the
median over the scenario's passes with its min and max, each with its difference from a
baseline configuration; a configuration whose passes disagree more than the trial's
threshold is marked unstable. Sentences are generated from these numbers, never written by
hand. Also: cold against warm, the per-request throughput inside concurrent passes, and
what the records say was not measured.

A scenario with a latency target (``spec.slo``) is also ranked on goodput (requests per second
meeting every target, vLLM's ``--goodput`` rule) and the share of requests meeting it; its
order is by goodput. Sweeps (``kind: sweep``, a ``steps`` list) are not ranked here: they have
steps, not passes, and :mod:`llmtrial.report.sweeps` reads them. Records written before scenarios had
a ``kind``, ``warmup`` or ``repetition`` read as fixed scenarios without a warm-up.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmtrial.serve.bench import agreement, headline
from llmtrial.serve.scenarios import is_sweep, passes_asked, repetition_of

#: The ranked figures: key, label, unit, whether higher is better, digits shown.
FIGURES: tuple[tuple[str, str, str, bool, int], ...] = (
    ("output_tok_s", "output tok/s", "tok/s", True, 1),
    ("tok_s_per_accelerator", "tok/s per accelerator", "tok/s", True, 1),
    ("tok_s_per_user", "tok/s per user", "tok/s", True, 2),
    ("ttft_median_ms", "TTFT median", "ms", False, 1),
    ("ttft_p99_ms", "TTFT p99", "ms", False, 1),
    ("tpot_median_ms", "TPOT median", "ms", False, 2),
    ("tpot_p99_ms", "TPOT p99", "ms", False, 2),
)
#: The goodput figures of a scenario with a latency target (``spec.slo``), ranked first.
GOODPUT_FIGURES: tuple[tuple[str, str, str, bool, int], ...] = (
    ("goodput", "goodput", "req/s", True, 2),
    ("slo_share", "SLO share", "%", True, 1),
)
#: The figure pass agreement is judged on (the record's own agreement figure).
AGREEMENT_FIGURE = "output_tok_s"
#: The spread of that figure between passes above which a configuration is unstable (``report.max_disagreement``).
DEFAULT_MAX_DISAGREEMENT = 0.10


@dataclass(frozen=True)
class Settings:
    """The trial file's ``report`` block: the baseline configuration and the agreement threshold."""

    baseline: str | None = None
    max_disagreement: float = DEFAULT_MAX_DISAGREEMENT

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | None) -> Settings:
        block = block or {}
        return cls(baseline=block.get("baseline"),
                   max_disagreement=float(block.get("max_disagreement", DEFAULT_MAX_DISAGREEMENT)))


def fixed_scenarios(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A configuration record's scenario entries that have passes (not sweeps), in order."""
    return [sc for sc in record.get("scenarios", []) if not is_sweep(sc.get("spec") or {})]


def figures_of(spec: Mapping[str, Any]) -> tuple[tuple[str, str, str, bool, int], ...]:
    """The figures a scenario is ranked on: goodput first when it has a latency target."""
    return GOODPUT_FIGURES + FIGURES if spec.get("slo") else FIGURES


def ranks(plan: Mapping[str, Any] | None) -> int | None:
    """Accelerators (GPUs, or CPU workers) one configuration uses: TP x PP from its plan."""
    d = (plan or {}).get("plan") or {}
    tp, pp = d.get("tensor_parallel_size"), d.get("pipeline_parallel_size")
    return int(tp) * int(pp) if tp and pp else None


def pass_figures(summary: Mapping[str, Any], concurrency: int, n_ranks: int | None) -> dict[str, float | None]:
    """The ranked figures of one pass, from vLLM's result summary as recorded."""
    figures = headline(summary)
    tok_s = figures["output_tok_s"]
    return {
        **figures,
        "tok_s_per_accelerator": tok_s / n_ranks if tok_s is not None and n_ranks else None,
        "tok_s_per_user": tok_s / concurrency if tok_s is not None and concurrency else None,
        **goodput_figures(summary.get("goodput")),
    }


def goodput_figures(goodput: Mapping[str, Any] | None) -> dict[str, float | None]:
    """A pass's goodput (req/s meeting every target) and SLO share (%), when it had a target."""
    if not goodput:
        return {}
    share = goodput.get("share")
    return {"goodput": goodput.get("request_goodput"), "slo_share": 100.0 * share if share is not None else None}


def over_passes(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Median, min, max, spread ((max - min) / mean) and count of one figure over passes."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals),
            "spread": agreement(vals)}


def diagnosis(record: Mapping[str, Any]) -> str:
    """One line on why a configuration has no figures."""
    if record.get("status") == "skipped":
        plan = record.get("plan") or {}
        reasons = plan.get("reasons") or []
        return f"not launched: the planner said {plan.get('verdict', 'no')}" + (f" ({reasons[0].rstrip('.')})" if reasons else "")
    failure = record.get("failure") or {}
    line = (failure.get("error_line") or {}).get("diagnosis") or failure.get("message") or "no diagnosis recorded"
    return f"failed in {failure.get('phase', 'an unknown phase')}: {line.rstrip('.')}"



def _pct(x: float | None) -> str:
    return f"{100 * x:.1f} %" if x is not None else "unknown"


def repetition_note(rep: Mapping[str, Any], warmup: Mapping[str, Any] | None = None) -> str:
    """One line: how many passes ran, why they stopped, and whether a warm-up pass came first."""
    n, stopped = rep["passes_run"], rep.get("stopped")
    passes = f"{n} pass{'es' if n != 1 else ''}"
    if stopped == "agreed":
        text = f"{passes}: stopped once they agreed within {_pct(rep.get('agreement'))} (spread {_pct(rep.get('spread'))})"
    elif stopped == "max_reached":
        text = (f"{passes}, the most allowed: they never agreed within {_pct(rep.get('agreement'))} "
                f"(spread {_pct(rep.get('spread'))})")
    elif stopped == "failed":
        text = f"{passes}: stopped when pass {n} failed"
    else:
        text = f"{passes}, a fixed count"
    note = warmup_note(warmup)
    return f"{text}; {note}" if note else text


def repetition_noteworthy(entry: Mapping[str, Any] | None) -> bool:
    """Whether the passes' count says more than the trial file's fixed count: a warm-up ran, passes
    ran until they agreed, or the run stopped early. Records without ``repetition`` never do."""
    rep = (entry or {}).get("repetition")
    return bool((entry or {}).get("warmup")) or bool(rep and (rep.get("agreement") is not None or rep.get("stopped") != "fixed"))


def warmup_note(warmup: Mapping[str, Any] | None) -> str | None:
    """Whether a warm-up pass ran before the figures' passes (it is never counted in them)."""
    if not warmup:
        return None
    return ("a warm-up pass ran first, kept out of the figures" if warmup.get("status") == "ok"
            else "a warm-up pass ran first and failed, kept out of the figures")


def _slo_passes(ok: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How many passes met the scenario's SLO at its percentile."""
    judged = [p["summary"]["goodput"] for p in ok if p["summary"].get("goodput")]
    if not judged:
        return None
    return {"met": sum(1 for g in judged if g.get("met")), "n": len(judged), "percentile": judged[0].get("percentile")}


def scenario_cell(record: Mapping[str, Any], scenario: Mapping[str, Any] | None, n_ranks: int | None,
                  settings: Settings) -> dict[str, Any]:
    """One configuration in one scenario: its figures over passes, stall flags and stability,
    how many passes ran and why they stopped (the warm-up pass is never among them)."""
    cell: dict[str, Any] = {"configuration": record["configuration"], "figures": {}, "stalls": [], "passes": 0,
                            "unstable": False, "diagnosis": None, "slo": None}
    ok = [p for p in (scenario or {}).get("pass_results", []) if p.get("status") == "ok" and p.get("summary")]
    if scenario is not None:
        cell["repetition"] = repetition_of(scenario)
        cell["repetition_note"] = repetition_note(cell["repetition"], scenario.get("warmup"))
        cell["repetition_shown"] = repetition_noteworthy(scenario)
    if record.get("status") != "ok" or not ok:
        cell["status"] = record.get("status") if record.get("status") != "ok" else "no passes"
        cell["diagnosis"] = diagnosis(record) if record.get("status") != "ok" else "no pass of this scenario completed"
        return cell
    cell["status"] = "ok"
    concurrency = int(scenario["spec"]["concurrency"])
    per_pass = [pass_figures(p["summary"], concurrency, n_ranks) for p in ok]
    for key, *_ in figures_of(scenario["spec"]):
        cell["figures"][key] = over_passes(f.get(key) for f in per_pass)
    cell["passes"] = len(ok)
    cell["slo"] = _slo_passes(ok)
    cell["stalls"] = [{"pass": p["pass"], "mean_ttft_ms": p["summary"].get("mean_ttft_ms"),
                       "median_ttft_ms": p["summary"].get("median_ttft_ms")} for p in ok if p.get("stall")]
    spread = (cell["figures"].get(AGREEMENT_FIGURE) or {}).get("spread")
    cell["spread"] = spread
    cell["unstable"] = spread is not None and spread > settings.max_disagreement
    return cell


def _baseline(names: list[str], settings: Settings) -> str | None:
    if settings.baseline is not None:
        return settings.baseline
    return names[0] if names else None


def compare(cells: list[dict[str, Any]], baseline: str | None,
            figures: Iterable[tuple[str, str, str, bool, int]] = FIGURES) -> None:
    """Mark in place each figure's difference from the baseline (percent) and the best value."""
    ok = [c for c in cells if c["status"] == "ok"]
    base = next((c for c in ok if c["configuration"] == baseline), None)
    for key, _label, _unit, higher, _digits in figures:
        values = [(c["figures"][key]["median"], c) for c in ok if c["figures"].get(key)]
        best = (max if higher else min)(values, key=lambda vc: vc[0])[1] if values else None
        base_fig = (base or {}).get("figures", {}).get(key) if base else None
        for c in ok:
            fig = c["figures"].get(key)
            if not fig:
                continue
            fig["best"] = c is best and len(values) > 1
            fig["delta_pct"] = (100.0 * (fig["median"] - base_fig["median"]) / base_fig["median"]
                                if base_fig and base_fig["median"] and c is not base else None)


def scenario_specs(configurations: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Every scenario with passes (sweeps left out) the configurations ran, in the trial's order, with its spec."""
    specs: dict[str, Mapping[str, Any]] = {}
    for rec in configurations:
        for sc in fixed_scenarios(rec):
            specs.setdefault(sc["name"], sc["spec"])
    return specs


def scenario_tables(configurations: list[Mapping[str, Any]], plans: Mapping[str, Mapping[str, Any]],
                    settings: Settings) -> list[dict[str, Any]]:
    """Per scenario (in the trial's order): every configuration's cell, ranked by output tok/s
    (by goodput where the scenario has a latency target), configurations without figures last,
    with their one-line diagnosis. Sweeps are not here (:func:`llmtrial.report.sweeps.sweep_tables`)."""
    names = [r["configuration"] for r in configurations]
    baseline = _baseline(names, settings)
    tables = []
    for name, spec in scenario_specs(configurations).items():
        cells = []
        for rec in configurations:
            sc = next((s for s in fixed_scenarios(rec) if s["name"] == name), None)
            cells.append(scenario_cell(rec, sc, ranks(plans.get(rec["configuration"])), settings))
        figures = figures_of(spec)
        compare(cells, baseline, figures)
        ranked_by = "goodput" if spec.get("slo") else "output_tok_s"
        cells.sort(key=lambda c: (c["status"] != "ok", -((c["figures"].get(ranked_by) or {}).get("median") or 0)))
        for i, c in enumerate(c for c in cells if c["status"] == "ok"):
            c["rank"] = i + 1
        tables.append({"name": name, "spec": dict(spec), "cells": cells, "baseline": baseline,
                       "figures": figures, "ranked_by": ranked_by, "passes_asked": passes_asked(spec),
                       "slo_text": slo_text(spec["slo"]) if spec.get("slo") else None,
                       "unstable": [c["configuration"] for c in cells if c["unstable"]],
                       "single_pass": [c["configuration"] for c in cells if c["status"] == "ok" and c["passes"] < 2]})
    return tables



def _ratio_sentence(lead: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    a, b = lead["figures"]["output_tok_s"]["median"], other["figures"]["output_tok_s"]["median"]
    if b and a / b >= 1.1:
        return (f"{lead['configuration']} delivers {a / b:.1f}x the output tok/s of {other['configuration']} "
                f"({a:,.1f} against {b:,.1f} tok/s)")
    return (f"{lead['configuration']} and {other['configuration']} deliver output tok/s within "
            f"{100 * (a - b) / b:.0f} % of each other ({a:,.1f} against {b:,.1f} tok/s)")


def _ttft_sentence(cells: list[Mapping[str, Any]]) -> str | None:
    timed = [c for c in cells if c["figures"].get("ttft_median_ms")]
    if len(timed) < 2:
        return None
    timed = sorted(timed, key=lambda c: c["figures"]["ttft_median_ms"]["median"])
    fast, slow = timed[0], timed[-1]
    a, b = fast["figures"]["ttft_median_ms"]["median"], slow["figures"]["ttft_median_ms"]["median"]
    if not b:
        return None
    ms = f"(median TTFT {a:,.1f} against {b:,.1f} ms)"
    if (b - a) / b < 0.02:
        return f"{fast['configuration']} and {slow['configuration']} reach the first token within 2 % of each other {ms}"
    return f"{fast['configuration']} is {100 * (b - a) / b:.0f} % faster to first token than {slow['configuration']} {ms}"


def _unstable_note(cells: Iterable[Mapping[str, Any]]) -> str:
    shaky = [f"{c['configuration']} {100 * c['spread']:.1f} %" for c in cells if c["unstable"]]
    return f" Unstable: passes disagree on output tok/s by {', '.join(shaky)}." if shaky else ""


def slo_text(slo: Mapping[str, Any]) -> str:
    """The target as words: ``TTFT ≤ 500 ms, TPOT ≤ 50 ms at p90``."""
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2el_ms": "end-to-end latency"}
    targets = ", ".join(f"{label} ≤ {slo[k]:g} ms" for k, label in names.items() if slo.get(k) is not None)
    return f"{targets} at p{float(slo.get('percentile', 90)):g}"


def _goodput_sentence(table: Mapping[str, Any], lead: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    a = (lead["figures"].get("goodput") or {}).get("median")
    b = (other["figures"].get("goodput") or {}).get("median")
    if a is None or b is None:
        return f"no goodput figure for {(other if a is not None else lead)['configuration']}"
    verb = "the same goodput as" if a == b else "a higher goodput than"
    return (f"under the target ({slo_text(table['spec']['slo'])}), {lead['configuration']} has {verb} "
            f"{other['configuration']} ({a:,.2f} against {b:,.2f} req/s meeting every target); ranked by goodput")


def slo_sentence(table: Mapping[str, Any]) -> str | None:
    """Which configurations meet the scenario's SLO (their share at least its percentile), pass by pass."""
    judged = [c for c in table["cells"] if c["status"] == "ok" and c.get("slo")]
    if not judged:
        return None
    parts = []
    for c in judged:
        met, n = c["slo"]["met"], c["slo"]["n"]
        share = (c["figures"].get("slo_share") or {}).get("median")
        verdict = ("meets it" + (" in every pass" if n > 1 else "") if met == n
                   else "misses it" + (" in every pass" if n > 1 else "") if met == 0 else f"meets it in {met} of {n} passes")
        parts.append(f"{c['configuration']} {verdict} ({share:.1f} % of requests within target)" if share is not None
                     else f"{c['configuration']} {verdict}")
    pct = float(table["spec"]["slo"].get("percentile", 90))
    return f"The SLO asks for at least {pct:g} % of requests within the target: {'; '.join(parts)}."


def scenario_sentences(table: Mapping[str, Any]) -> list[str]:
    """Sentences for one scenario, generated from its cells."""
    spec = table["spec"]
    where = f"In scenario {table['name']} (concurrency {spec['concurrency']}), "
    ok = [c for c in table["cells"] if c["status"] == "ok"]
    slo = slo_sentence(table) if spec.get("slo") else None
    if not ok:
        return [f"No configuration completed scenario {table['name']}."]
    if len(ok) == 1:
        only = ok[0]
        return [f"Only {only['configuration']} completed scenario {table['name']}: "
                f"{only['figures']['output_tok_s']['median']:,.1f} output tok/s.{_unstable_note(ok)}"] + ([slo] if slo else [])
    lead = ok[0]
    other = next((c for c in ok if c["configuration"] == table["baseline"] and c is not lead), ok[1])
    if spec.get("slo"):
        by_tok_s = sorted((lead, other), key=lambda c: -c["figures"]["output_tok_s"]["median"])
        out = [where + _goodput_sentence(table, lead, other) + ".",
               "On output tok/s alone, " + _ratio_sentence(*by_tok_s) + "."]
    else:
        out = [where + _ratio_sentence(lead, other) + "."]
    ttft = _ttft_sentence(ok)
    if ttft:
        out.append(ttft + ".")
    out[-1] += _unstable_note(ok)
    return out + ([slo] if slo else [])


def outcome_sentences(configurations: Iterable[Mapping[str, Any]]) -> list[str]:
    """One sentence per configuration that gave no figures."""
    return [f"{r['configuration']} {diagnosis(r)}." for r in configurations if r.get("status") != "ok"]


def warning_sentences(configurations: Iterable[Mapping[str, Any]]) -> list[str]:
    """One sentence per warning the engine printed that the seeds acted on, with its log line."""
    out = []
    for r in configurations:
        for w in r.get("engine_warnings") or []:
            more = f", {w['count']} lines" if w.get("count", 1) > 1 else ""
            out.append(f"{r['configuration']}: {w['summary']} ({w['source']}{more}).")
    return out


def _fact_value(facts: Mapping[str, Any], key: str) -> float | None:
    f = facts.get(key)
    return f.get("value") if isinstance(f, Mapping) else None


def cold_warm(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """Launch to ready, the cold first request, the warm median at concurrency 1 and their ratio."""
    if record.get("status") != "ok":
        return None
    cold = record.get("cold_start") or {}
    warm_sc = next((s for s in fixed_scenarios(record) if int(s["spec"]["concurrency"]) == 1), None)
    ok = [p["summary"] for p in (warm_sc or {}).get("pass_results", []) if p.get("status") == "ok" and p.get("summary")]
    warm_tok_s = over_passes(s.get("output_throughput") for s in ok)
    warm_ttft = over_passes(s.get("median_ttft_ms") for s in ok)
    cold_tok_s = _fact_value(cold, "first_output_tok_s")
    cold_ttft = _fact_value(cold, "first_ttft_s")
    return {
        "configuration": record["configuration"],
        "ready_s": cold.get("ready_seconds"), "first_ttft_s": cold.get("first_ttft_s"),
        "first_output_tok_s": cold.get("first_output_tok_s"),
        "warm_scenario": warm_sc["name"] if warm_sc else None,
        "warm_tok_s": warm_tok_s, "warm_ttft_ms": warm_ttft,
        "tok_s_ratio": warm_tok_s["median"] / cold_tok_s if warm_tok_s and cold_tok_s else None,
        "ttft_ratio": cold_ttft * 1000.0 / warm_ttft["median"] if warm_ttft and cold_ttft and warm_ttft["median"] else None,
    }


def streams(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per concurrent pass: the output tok/s of each request, as vLLM's per-request detail gives it."""
    out = []
    for sc in fixed_scenarios(record):
        if int(sc["spec"]["concurrency"]) < 2:
            continue
        for p in sc.get("pass_results", []):
            s = p.get("summary") or {}
            if p.get("status") == "ok" and s.get("request_output_tok_s"):
                out.append({"configuration": record["configuration"], "scenario": sc["name"], "pass": p["pass"],
                            "concurrency": sc["spec"]["concurrency"], "aggregate": s.get("output_throughput"),
                            "requests": s["request_output_tok_s"], "summary": s.get("request_output_tok_s_summary")})
    return out


def _telemetry_gaps(configurations: Iterable[Mapping[str, Any]]) -> list[str]:
    """A telemetry source absent, or failing at times, in any configuration's job."""
    seen: dict[tuple[str, str], list[str]] = {}
    for r in configurations:
        for name, src in ((r.get("telemetry") or {}).get("sources") or {}).items():
            if src.get("status") in ("absent", "failed at times", "failed"):
                why = src.get("reason") or src["status"]
                seen.setdefault((name, why), []).append(r["configuration"])
    out = []
    for (name, why), names in seen.items():
        what = "no power, energy, GPU utilisation or GPU memory over time" if name == "nvml" else "gaps in its series"
        out.append(f"Telemetry source {name}: {why} ({', '.join(names)}): {what}.")
    return out


def not_measured(*, preflight: Mapping[str, Any], configurations: list[Mapping[str, Any]],
                 plans: Iterable[Mapping[str, Any]], tables: Iterable[Mapping[str, Any]]) -> list[str]:
    """What the records say was not measured, one sentence each."""
    out = []
    gpus = (preflight.get("environment") or {}).get("gpus") or {}
    if not gpus.get("present"):
        out.append(f"No GPU: {gpus.get('reason') or 'none found'}. No GPU power, energy, utilisation or PCIe "
                   "figures exist for this trial; throughput per accelerator counts CPU workers (TP x PP).")
    out += _telemetry_gaps(configurations)
    for t in tables:
        if t["single_pass"]:
            out.append(f"Scenario {t['name']}: one pass only for {', '.join(t['single_pass'])}, so no agreement figure.")
    for r in configurations:
        if r.get("status") != "ok":
            out.append(f"{r['configuration']}: no serving figures ({diagnosis(r)}).")
    for p in plans:
        w = (p.get("facts") or {}).get("weights_bytes") or {}
        if w.get("kind") == "estimated":
            out.append(f"{p['configuration']}: the weights' size is estimated ({w.get('source')}), not measured.")
    for r in configurations:
        missing = [row["name"] for row in r.get("prediction", []) if row.get("measured") is None]
        if missing:
            out.append(f"{r['configuration']}: predicted but not measured: {', '.join(missing)}.")
    if not preflight.get("probes"):
        out.append("No host probes are recorded (memory bandwidth, collective all-reduce): the trial does not "
                   "measure the fabric or the cards' links under load.")
    return out
