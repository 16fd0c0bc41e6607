"""The report's charts: matplotlib drawn to inline SVG (text kept as text, no font or script
fetched), each with the table of the numbers it draws so a figure can be copied.

Charts are built from what :mod:`llmtrial.report.conclusions` works out of the records and from each
configuration's telemetry samples (its ``telemetry.csv``). SVG ids are salted per chart, so
several charts share one page without clashing, and the output is the same for the same data.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.units import GiB
from llmtrial.report.cells import Cell, ScenarioTable
from llmtrial.report.sweeps import StepRow, SweepCell, SweepTable

COLOURS = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7e8c", "#57606a")
STYLE = {"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "svg.fonttype": "none",
         "font.family": "sans-serif", "axes.grid": True, "grid.color": "#e1e4e8", "grid.linewidth": 0.6,
         "legend.frameon": False}


@dataclass
class Chart:
    """One chart: its SVG, a caption, and the numbers it draws as a table."""

    name: str
    title: str
    caption: str
    svg: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


def svg_of(fig: Figure, name: str) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog), ids salted with ``name``."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"llmtrial-{name}", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # matplotlib numbers its groups (figure_1, axes_1, ...) the same in every chart: prefix each
    # id, and every reference to one, with the chart's name so that charts can share a page
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{name}-{m[1]}"', text)
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{name}-{m[1]})", text)
    return re.sub(r'href="#([^"]+)"', lambda m: f'href="#{name}-{m[1]}"', text)


#: The room between panels, in inches: a panel's title and the tick labels above it, a y label and its ticks
#: beside it. Fixed rather than worked out by matplotlib's constrained layout, which measures every text on
#: every draw (a quarter of a trial's report time); ``bbox_inches="tight"`` crops the outer margins.
PANEL_GAP_IN = (0.55, 0.75)


def new_figure(width: float, height: float, rows: int = 1, cols: int = 1) -> tuple[Figure, Any]:
    """A figure of ``rows`` x ``cols`` panels, :data:`PANEL_GAP_IN` apart."""
    left, right, bottom, top = 0.08, 0.98, 0.12, 0.94
    panel_h = (top - bottom) * height / rows
    panel_w = (right - left) * width / cols
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height))
        fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top,
                            hspace=PANEL_GAP_IN[0] / max(panel_h - PANEL_GAP_IN[0], 0.1),
                            wspace=PANEL_GAP_IN[1] / max(panel_w - PANEL_GAP_IN[1], 0.1))
        axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _colour(names: Sequence[str], name: str) -> str:
    return COLOURS[names.index(name) % len(COLOURS)] if name in names else COLOURS[-1]


def latency_chart(tables: Sequence[ScenarioTable], names: Sequence[str]) -> Chart | None:
    """TTFT and TPOT (median solid, p99 dashed) against concurrency, a line per configuration."""
    points: dict[str, list[tuple[int, Cell, str]]] = {}
    for t in tables:
        for c in t.ok():
            points.setdefault(c.configuration, []).append((int(t.spec.concurrency), c, t.name))
    if not points:
        return None
    with matplotlib.rc_context(STYLE):
        fig, axes = new_figure(9.5, 3.4, 1, 2)
        for ax, metric, label in ((axes[0][0], "ttft", "TTFT (ms)"), (axes[0][1], "tpot", "TPOT (ms)")):
            for name, pts in points.items():
                pts = sorted(pts, key=lambda p: p[0])
                xs = [p[0] for p in pts]
                colour = _colour(names, name)
                ax.plot(xs, [p[1].median(f"{metric}_median_ms") for p in pts], "o-", color=colour,
                        label=f"{name} median")
                ax.plot(xs, [p[1].median(f"{metric}_p99_ms") for p in pts], "s--", color=colour, alpha=0.7,
                        label=f"{name} p99")
            ax.set_xlabel("concurrency")
            ax.set_ylabel(label)
            ax.set_xticks(sorted({x for pts in points.values() for x, _, _ in pts}))
        axes[0][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    rows = [[name, sc, conc] + [c.median(k) for k in ("ttft_median_ms", "ttft_p99_ms", "tpot_median_ms", "tpot_p99_ms")]
            for name, pts in points.items() for conc, c, sc in sorted(pts, key=lambda p: p[0])]
    return Chart("latency", "Latency against concurrency",
                 "Median over passes of each pass's median and p99, per configuration.", svg_of(fig, "latency"),
                 ["configuration", "scenario", "concurrency", "TTFT median (ms)", "TTFT p99 (ms)",
                  "TPOT median (ms)", "TPOT p99 (ms)"], rows)


def pareto_front(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes (higher is better on both), by x."""
    pts = sorted(set(points), key=lambda p: (-p[0], -p[1]))
    front, best_y = [], float("-inf")
    for x, y in pts:
        if y > best_y:
            front.append((x, y))
            best_y = y
    return sorted(front)


def pareto_chart(tables: Sequence[ScenarioTable], names: Sequence[str], per: str) -> Chart | None:
    """Output tok/s per accelerator against tok/s per user over every configuration and scenario."""
    rows = []
    for t in tables:
        for c in t.ok():
            x, y = c.median("tok_s_per_user"), c.median("tok_s_per_accelerator")
            if x is not None and y is not None:
                rows.append([c.configuration, t.name, t.spec.concurrency, x, y])
    if not rows:
        return None
    front = pareto_front((r[3], r[4]) for r in rows)
    with matplotlib.rc_context(STYLE):
        fig, axes = new_figure(6.5, 3.8)
        ax = axes[0][0]
        ax.plot([p[0] for p in front], [p[1] for p in front], "-", color="#8c959f", lw=1, label="Pareto front")
        for name in dict.fromkeys(r[0] for r in rows):
            mine = [r for r in rows if r[0] == name]
            ax.plot([r[3] for r in mine], [r[4] for r in mine], "o", color=_colour(names, name), label=name)
            for r in mine:
                ax.annotate(r[1], (r[3], r[4]), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel("output tok/s per user")
        ax.set_ylabel(f"output tok/s per {per}")
        ax.legend(fontsize=7)
    on_front = {(p[0], p[1]) for p in front}
    return Chart("pareto", "Throughput Pareto",
                 f"Each point a configuration in a scenario: output tok/s per {per} (TP x PP) against output tok/s "
                 "per user (÷ concurrency); medians over passes.", svg_of(fig, "pareto"),
                 ["configuration", "scenario", "concurrency", "tok/s per user", f"tok/s per {per}", "on the front"],
                 [r + ["yes" if (r[3], r[4]) in on_front else ""] for r in rows])


def prediction_chart(configurations: Sequence[ConfigurationRecord], names: Sequence[str]) -> Chart | None:
    """Every planner figure the log also reports: predicted against measured, on log axes."""
    rows = [[r.configuration, p.name, p.predicted, p.measured, p.relative_error, p.predicted_kind, p.measured_source]
            for r in configurations for p in r.prediction
            if isinstance(p.predicted, (int, float)) and isinstance(p.measured, (int, float))
            and p.predicted > 0 and p.measured > 0]
    if not rows:
        return None
    with matplotlib.rc_context(STYLE):
        fig, axes = new_figure(6.5, 3.8)
        ax = axes[0][0]
        lo = min(min(r[2], r[3]) for r in rows) / 1.5
        hi = max(max(r[2], r[3]) for r in rows) * 1.5
        ax.plot([lo, hi], [lo, hi], "-", color="#8c959f", lw=1, label="measured = predicted")
        for r in rows:
            ax.plot(r[2], r[3], "o", color=_colour(names, r[0]))
            ax.annotate(f"{r[0]}: {r[1]}", (r[2], r[3]), fontsize=6.5, xytext=(4, -3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.minorticks_off()  # nine unlabelled ticks a decade on each axis: most of the chart's drawing time
        ax.set_xlabel("predicted before launch")
        ax.set_ylabel("measured (server log)")
        ax.legend(fontsize=7)
    return Chart("prediction", "Predicted against measured",
                 "Each planner figure vLLM also reports; points on the diagonal were predicted exactly.",
                 svg_of(fig, "prediction"),
                 ["configuration", "figure", "predicted", "measured", "relative error", "kind", "measured at"], rows)


#: Time-series panels: (title, [(source, metric pattern, label, scale)]); a pattern with
#: ``gpu*`` is drawn once per GPU, one of the form ``a/b`` as the ratio of two metrics.
SERIES = (
    ("GPU (NVML)", [("nvml", "gpu*.util_percent", "utilisation %", 1.0),
                    ("nvml", "gpu*.power_w/power_limit_w", "power % of limit", 100.0),
                    ("nvml", "gpu*.mem_used_bytes/mem_total_bytes", "memory % used", 100.0)]),
    ("Server (/metrics)", [("metrics", "kv_cache_usage", "KV cache usage %", 100.0),
                           ("metrics", "running", "running requests", 1.0),
                           ("metrics", "waiting", "waiting requests", 1.0),
                           ("metrics", "preemptions_total", "preemptions (cumulative)", 1.0)]),
    ("Host CPU", [("host", "cpu_percent", "system CPU % (all CPUs)", 1.0),
                  ("host", "tree_cpu_percent", "server CPU % (100 = one core)", 1.0)]),
    ("Host memory (GiB)", [("host", "tree_rss_bytes", "server RSS", 1 / GiB),
                           ("host", "mem_used_bytes", "system memory used", 1 / GiB)]),
)


#: One sampled metric: (seconds since launch, values).
Series = tuple[list[float], list[float]]


def series(frame: Any, t0: float) -> dict[str, Series]:
    """Every sampled ``source.metric`` as (seconds since ``t0``, values), NaN and error rows left out."""
    df = frame[(frame["source"] != "window") & (frame["metric"] != "error") & frame["value"].notna()]
    out: dict[str, Series] = {}
    for (src, met), g in df.sort_values("t").groupby(["source", "metric"], sort=True):
        out[f"{src}.{met}"] = ((g["t"] - t0).round(3).tolist(), g["value"].tolist())
    return out


def _expand(sampled: Mapping[str, Series], source: str, pattern: str) -> list[tuple[str, Series]]:
    """The series a panel line names: one per GPU for ``gpu*``, a ratio for ``a/b``."""
    num, _, den = pattern.partition("/")
    gpus = sorted({k.split(".")[1] for k in sampled if k.startswith(f"{source}.gpu")}) if "gpu*" in num else [""]
    out = []
    for g in gpus:
        key = f"{source}.{num.replace('gpu*', g)}"
        if key not in sampled:
            continue
        xs, ys = sampled[key]
        if den:
            dkey = f"{source}.{g}.{den}" if g else f"{source}.{den}"
            if dkey not in sampled:
                continue
            dx = dict(zip(*sampled[dkey], strict=True))
            pairs = [(x, y / dx[x]) for x, y in zip(xs, ys, strict=True) if x in dx and dx[x]]
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        out.append((g, (xs, ys)))
    return out


def _panel_lines(sampled: Mapping[str, Series], lines: Sequence[tuple[str, str, str, float]]) -> list[tuple[str, str, Series]]:
    """(label, GPU or "", (xs, scaled ys)) for each line of a panel that was sampled."""
    out = []
    for source, pattern, label, scale in lines:
        for gpu, (xs, ys) in _expand(sampled, source, pattern):
            out.append((label, gpu, (xs, [v * scale for v in ys])))
    return out


@dataclass(frozen=True)
class Shade:
    """A shaded span of a timeline: the start-up, or a pass (its label), in seconds since the epoch."""

    label: str
    start: float
    end: float


def _shade(ax: Any, windows: Sequence[Shade], t0: float) -> None:
    for i, w in enumerate(windows):
        colour = "#d0d7de" if w.label == "start-up" else ("#ddf4ff" if i % 2 else "#fff8c5")
        ax.axvspan(w.start - t0, w.end - t0, color=colour, alpha=0.6, lw=0)


def windows_of(record: ConfigurationRecord) -> list[Shade]:
    """The cold start and each pass (warm-up and sweep steps too) window, as the configuration record gives them."""
    server = record.server
    out = []
    if server.launched_at and server.ready_at:
        out.append(Shade("start-up", server.launched_at, server.ready_at))
    for sc in record.scenarios:
        for label, p in sc.runs():
            if p.window and p.window.start and p.window.end:
                out.append(Shade(label, p.window.start, p.window.end))
    return out


def timeseries_chart(record: ConfigurationRecord, frame: Any) -> Chart | None:
    """What telemetry sampled during one configuration's job, start-up and pass windows shaded."""
    name = record.configuration
    t0 = record.server.launched_at or (frame["t"].min() if len(frame) else None)
    if t0 is None or not len(frame):
        return None
    sampled = series(frame, float(t0))
    panels = [(title, _panel_lines(sampled, lines)) for title, lines in SERIES]
    panels = [(t, lines) for t, lines in panels if lines]
    if not panels:
        return None
    windows = windows_of(record)
    with matplotlib.rc_context(STYLE):
        fig, axes = new_figure(9.5, 2.1 * len(panels), len(panels), 1)
        for (title, lines), row in zip(panels, axes, strict=True):
            ax = row[0]
            _shade(ax, windows, float(t0))
            for i, (label, gpu, (xs, ys)) in enumerate(lines):
                ax.plot(xs, ys, "-", lw=1.1, color=COLOURS[i % len(COLOURS)], label=f"{gpu} {label}".strip())
            ax.set_title(title, fontsize=9, loc="left")
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        axes[-1][0].set_xlabel("seconds since launch (grey: start-up; yellow and blue: benchmark passes)")
    columns = ["t (s)"] + [f"{g} {label}".strip() for _t, lines in panels for label, g, _xy in lines]
    by_t: dict[float, list[Any]] = {}
    flat = [xy for _t, lines in panels for _l, _g, xy in lines]
    for j, (xs, ys) in enumerate(flat):
        for x, y in zip(xs, ys, strict=True):
            by_t.setdefault(round(x), [None] * len(flat))[j] = y
    rows = [[t, *vals] for t, vals in sorted(by_t.items())]
    return Chart(f"timeline-{name}", f"{name}: telemetry over time",
                 "Each sampled figure, one point per sample; shaded windows as the record gives them: "
                 + "; ".join(f"{w.label} {w.start - t0:.0f}-{w.end - t0:.0f} s" for w in windows) + ".",
                 svg_of(fig, f"timeline-{name}"), columns, rows)


#: The step figures a sweep's chart may be drawn against, in the order tried: name, the figure of a step row.
SWEEP_AXES: dict[str, Callable[[StepRow], int | None]] = {
    "concurrency": lambda r: r.concurrency, "input_len": lambda r: r.input_len,
    "output_len": lambda r: r.output_len, "num_prompts": lambda r: r.num_prompts, "step": lambda r: r.step}
#: A sweep chart's panels: step row figure, axis label.
SWEEP_PANELS: tuple[tuple[str, str, Callable[[StepRow], float | None]], ...] = (
    ("preemptions", "preemptions", lambda r: r.preemptions),
    ("kv_peak_pct", "KV cache usage peak (%)", lambda r: r.kv_peak_pct),
    ("output_tok_s", "output tok/s", lambda r: r.output_tok_s))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def sweep_axis(cells: Sequence[SweepCell]) -> str:
    """The step figure a sweep's chart is drawn against: concurrency, or the first that varies
    when concurrency does not (a sweep over lengths), else the step number."""
    for key in ("concurrency", "input_len", "output_len", "num_prompts"):
        if len({SWEEP_AXES[key](r) for c in cells for r in c.rows}) > 1:
            return key
    return "step"


def _onset_marks(axes: Any, cell: SweepCell, colour: str, at: Callable[[StepRow], int | None]) -> None:
    """The predicted preemption onset as a dashed line on every panel; the observed one ringed."""
    cmp = cell.preemption
    name = cell.configuration
    pred = next((r for r in cell.rows if r.step == cmp.predicted_step), None)
    if pred is not None:
        for i, row in enumerate(axes):
            row[0].axvline(at(pred), color=colour, ls="--", lw=1.1, alpha=0.8,
                           label=f"{name} predicted onset" if i == 0 else None)
    obs = next((r for r in cell.rows if r.step == cmp.observed_step), None)
    if obs is not None and obs.preemptions is not None:
        axes[0][0].plot([at(obs)], [obs.preemptions], "o", ms=11, mfc="none", mec=colour, mew=1.6,
                        label=f"{name} observed onset")


def sweep_chart(table: SweepTable, names: Sequence[str]) -> Chart | None:
    """One sweep: preemptions, KV cache usage peak and output tok/s against concurrency (or the
    length the sweep varies), a line per configuration; the predicted onset of preemption dashed,
    the observed one ringed."""
    cells = [c for c in table.cells if any(r.status == "ok" for r in c.rows)]
    if not cells:
        return None
    x = sweep_axis(cells)
    at = SWEEP_AXES[x]
    xs_all = sorted({at(r) for c in cells for r in c.rows if at(r) is not None})
    with matplotlib.rc_context(STYLE):
        fig, axes = new_figure(9.5, 6.2, len(SWEEP_PANELS), 1)
        for cell in cells:
            colour = _colour(names, cell.configuration)
            ok = [r for r in cell.rows if r.status == "ok"]
            for (_key, _label, figure), row in zip(SWEEP_PANELS, axes, strict=True):
                row[0].plot([at(r) for r in ok], [figure(r) for r in ok], "o-", color=colour, label=cell.configuration)
            _onset_marks(axes, cell, colour, at)
        for (key, label, _figure), row in zip(SWEEP_PANELS, axes, strict=True):
            ax = row[0]
            if xs_all and xs_all[0] > 0 and xs_all[-1] / xs_all[0] >= 4:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs_all, [str(v) for v in xs_all])
            ax.minorticks_off()
            if key == "kv_peak_pct":
                ax.set_ylim(0, 105)
            else:
                ax.set_ylim(bottom=0)
            ax.set_ylabel(label, fontsize=8)
        axes[0][0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        axes[-1][0].set_xlabel(f"{x.replace('_', ' ')} (one step each)")
    name = f"sweep-{_slug(table.name)}"
    rows = [[c.configuration, r.step, at(r) if x != "step" else r.concurrency, r.preemptions,
             r.kv_peak_pct, r.output_tok_s, _yes(r.predicted_preempts), _yes(r.step == c.preemption.observed_step)]
            for c in cells for r in c.rows]
    return Chart(name, f"Sweep {table.name}",
                 f"Each step one pass at its {x.replace('_', ' ') if x != 'step' else 'settings'}; KV cache usage peak "
                 "and preemptions from the server's /metrics over the step's window; dashed: the planner's predicted "
                 "onset of preemption; ringed: the first step that preempted.", svg_of(fig, name),
                 ["configuration", "step", x.replace("_", " ") if x != "step" else "concurrency", "preemptions",
                  "KV usage peak (%)", "output tok/s", "predicted to preempt", "observed onset"], rows)


def _yes(flag: Any) -> str:
    return "—" if flag is None else ("yes" if flag else "")
