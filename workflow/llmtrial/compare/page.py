"""The comparison page: one self-contained HTML file from the comparison record (no script, no
network, charts inline as SVG with their numbers), written beside the record under the later
trial's folder (``comparison/<earlier trial>/``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmtrial.core.comparison_model import ComparisonRecord, Row
from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.records import write_record
from llmtrial.core.resources import TEMPLATES
from llmtrial.report.charts import Chart, new_figure, svg_of
from llmtrial.report.conclusions import FIGURES
from llmtrial.report.templates import template_environment

RECORD_NAME, PAGE_NAME = "comparison.json", "comparison.html"
A_COLOUR, B_COLOUR = "#57606a", "#1f6feb"


def comparison_folder(record: ComparisonRecord) -> Path:
    """Where the record and page go: ``<B's folder>/comparison/<A's folder name>`` (``-earlier`` added when
    both folders have one name); against reports, under the trial's folder, named after the reports (their
    file's name without its suffix). ValueError where neither side is a trial."""
    a, b = Path(record.a.folder), Path(record.b.folder)
    if record.a.kind == record.b.kind == "trial":
        return b / "comparison" / (a.name if a.name != b.name else f"{a.name}-earlier")
    if "trial" not in (record.a.kind, record.b.kind):
        raise ValueError("neither side is a trial's results folder: say where the comparison goes (--out)")
    home, other = (b, a) if record.b.kind == "trial" else (a, b)
    return home / "comparison" / (other.stem if other.suffix else other.name)


def figure_chart(rows: Sequence[Row], key: str, label: str, unit: str) -> Chart | None:
    """A against B on one figure: per configuration x scenario, each trial's median with its interval over passes."""
    drawn = [r for r in rows if r.figure == key and r.a.median is not None and r.b.median is not None]
    if not drawn:
        return None
    fig, axes = new_figure(6.4, 0.5 + 0.45 * len(drawn))
    ax = axes[0][0]
    for i, r in enumerate(drawn):
        for side, dy, colour, name in ((r.a, 0.12, A_COLOUR, "A"), (r.b, -0.12, B_COLOUR, "B")):
            lo = side.median - side.low if side.low is not None else 0.0
            hi = side.high - side.median if side.high is not None else 0.0
            ax.errorbar([side.median], [i + dy], xerr=[[lo], [hi]], fmt="o" if name == "A" else "s", color=colour,
                        capsize=3, label=name if i == 0 else None)
    ax.set_yticks(range(len(drawn)), [f"{r.configuration} {r.scenario}" for r in drawn])
    ax.invert_yaxis()
    ax.set_xlabel(f"{label} ({unit})")
    ax.legend(loc="best")
    name = f"compare-{key.replace('_', '-')}"
    return Chart(name=name, title=f"{label}: A against B", caption=(
        "Each trial's median over passes, the bar its interval over passes (none below two passes; never below 0)."),
        svg=svg_of(fig, name), columns=["configuration", "scenario", "A median", "A low", "A high", "B median", "B low",
                                        "B high", "ratio B/A", "verdict"],
        rows=[[r.configuration, r.scenario, r.a.median, r.a.low, r.a.high, r.b.median, r.b.low, r.b.high, r.ratio,
               r.verdict] for r in drawn])


def render_page(record: ComparisonRecord, template_dir: Path = TEMPLATES) -> str:
    env = template_environment(template_dir)
    charts = [c for c in (figure_chart(record.rows, key, label, unit) for key, label, unit, *_ in FIGURES) if c]
    return env.get_template("comparison.html.j2").render(c=record, charts=charts)


def write_comparison(record: ComparisonRecord, folder: Path | None = None) -> tuple[Path, Path]:
    """Write the record (checked against its schema) and the page; their paths."""
    out = Path(folder) if folder is not None else comparison_folder(record)
    out.mkdir(parents=True, exist_ok=True)
    rec = write_record(out / RECORD_NAME, record, schema="comparison")
    return rec, atomic_write_text(out / PAGE_NAME, render_page(record))
