"""The last lines of a workflow run on the terminal: where the report is, what its first screen
found (a few lines of ``findings.txt``), and whether the host was given back, with the residues."""

from __future__ import annotations

from pathlib import Path

from llmtrial.core.cleanup_model import CleanupRecord
from llmtrial.core.paths import TrialPaths
from llmtrial.lifecycle.cleanup import host_lines

#: Findings quoted on the terminal; the rest are in the report.
SHOWN = 6


def run_summary(results_dir: Path, *, since: float, cleanup: CleanupRecord | None = None) -> list[str]:
    """The run's closing lines. The report is named only when this run (started at ``since``,
    Unix time) rendered it; the host's state comes from ``cleanup`` or the trial's latest
    cleanup record and its ledger (:func:`llmtrial.lifecycle.cleanup.host_lines`)."""
    paths = TrialPaths(Path(results_dir))
    lines: list[str] = []
    if paths.report.exists() and paths.report.stat().st_mtime >= since:
        lines.append(f"report: {paths.report.resolve()}")
        found = paths.findings.read_text(encoding="utf-8").splitlines() if paths.findings.exists() else []
        lines += [f"  {line}" for line in found[: SHOWN + 1]]
        if len(found) > SHOWN + 1:
            lines.append(f"  ... {len(found) - SHOWN - 1} more finding(s) in the report")
    return [*lines, *host_lines(paths.root, cleanup)]
