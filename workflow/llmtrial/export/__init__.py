"""A trial's records in other tools' formats, from the records alone: llm-d's Benchmark Report v0.2
(the format llm-d-benchmark and kubernetes-sigs inference-perf write), one per configuration x scenario;
and other tools' runs in that format read back, to compare a trial with them.

- :mod:`llmtrial.export.br_validate`: A report checked against llm-d's published package
  (``llmd-benchmark-report``, its v0.2 models): ReportInvalid naming the report and each field at fault.
- :mod:`llmtrial.export.benchmark_report`: One configuration x scenario (or sweep step) of a trial as a
  report: what fills each field, and what is left out.
- :mod:`llmtrial.export.exports`: A results folder's reports written under exports/ (the workflow's rule
  export and ``llmtrial export``).
- :mod:`llmtrial.export.reports`: Another tool's runs read as Benchmark Reports v0.2 (report files, or a
  tool's result files converted by llm-d's package), and a trial's workloads in the same terms.
- :mod:`llmtrial.export.against`: A trial against another tool's runs: what both state, and each figure's
  verdict by the test the runs allow.

Imports from: core, compare (its results folder reader). (tests/test_structure.py holds the order.)
"""

__all__ = ["against", "benchmark_report", "br_validate", "exports", "reports"]
