"""Exports of a trial's records to other tools' formats, from the records alone.

- :mod:`~llmtrial.export.br_schema`, :mod:`~llmtrial.export.br_results`: llm-d's Benchmark Report v0.2 as
  pydantic models (the validator; the published schema they follow is named in br_schema's docstring)
- :mod:`~llmtrial.export.benchmark_report`: one configuration x scenario of a trial as a Benchmark Report
- :mod:`~llmtrial.export.exports`: a results folder's reports written under ``exports/`` (``llmtrial export``)
"""
