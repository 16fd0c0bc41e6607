"""Trial against trial: two results folders read as records, what must match before they are compared,
each figure's verdict with its interval, the comparison page, and reproducing a trial from its folder.

- :mod:`llmtrial.compare.comparability`: What must match before two trials are compared, and what
  differs.
- :mod:`llmtrial.compare.comparison`: Trial B against trial A: the comparison record.
- :mod:`llmtrial.compare.page`: The comparison page: one self-contained HTML file from the comparison
  record.
- :mod:`llmtrial.compare.reproduce`: Rerun a trial from its results folder's provenance into a new
  results folder, then compare the two.
- :mod:`llmtrial.compare.trials`: A finished trial's results folder read as its records.

Imports from: core, logs, host, plan, weights, patch, lifecycle, serve, report. (tests/test_structure.py
holds the order.)
"""

__all__ = ["comparability", "comparison", "page", "reproduce", "trials"]
