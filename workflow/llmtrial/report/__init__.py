"""The report, from records only: conclusions, sweeps, multi-node spans, charts and the rendered HTML.

- :mod:`llmtrial.report.answers`: The report's Answers section: what each configuration answered to
  the trial's task set, the agreement matrix and whether a patch changed answers.
- :mod:`llmtrial.report.cells`: What the report works out per scenario from the records: each figure
  over passes, each configuration's cell and each scenario's table of cells.
- :mod:`llmtrial.report.charts`: The report's charts: matplotlib drawn to inline SVG (text kept as
  text, no font or script fetched), each with the table of the numbers it draws so a figure can be
  copied.
- :mod:`llmtrial.report.conclusions`: What the trial concludes, worked out from the records alone
  (no log is read again).
- :mod:`llmtrial.report.costs`: What the report says about cost and energy: the cost per million
  output tokens and the energy per output token as ranked figures, each pass's energy check, and
  what was not measured.
- :mod:`llmtrial.report.multinode`: What the report says about configurations that span several nodes,
  from the records only.
- :mod:`llmtrial.report.render`: The trial report: one self-contained HTML file rendered from the
  stage records only.
- :mod:`llmtrial.report.run_summary`: The last lines of a workflow run on the terminal: where the
  report is, what its first screen found, and whether the host was given back.
- :mod:`llmtrial.report.sections`: The parts of the trial report's context: the rows and sections the
  template reads by attribute, and the context itself.
- :mod:`llmtrial.report.sweeps`: What the trial's sweeps show, worked out from the configuration
  records alone.
- :mod:`llmtrial.report.templates`: The Jinja environment the report and the comparison page render with,
  its compiled templates kept in the user's cache folder.
- :mod:`llmtrial.report.verdicts`: Verdicts between two sets of pass values, in the words the report
  and the comparison page use.
- :mod:`llmtrial.report.why_failed`: The report's "Why it failed" section: the failed configurations
  read together in sentences, and the one sentence of the first screen.

Imports from: core, answers, logs, host, plan, weights, patch, lifecycle, serve. (tests/test_structure.py holds
the order.)
"""

__all__ = ["answers", "cells", "charts", "conclusions", "costs", "multinode", "render", "run_summary", "sections", "sweeps",
           "templates", "verdicts", "why_failed"]
