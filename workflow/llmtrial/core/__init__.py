"""The shared core: the ledger, the stage records and their models, the trial's paths, file I/O, the
package's data and job logs. It imports no other package.

- :mod:`llmtrial.core.fileio`: Two file routines the whole library shares: hashing a file and
  writing one atomically.
- :mod:`llmtrial.core.joblog`: Logging for one workflow job or command: everything to one log file,
  with timestamps.
- :mod:`llmtrial.core.ledger`: The trial ledger: an append-only record of every change a trial makes
  to the host.
- :mod:`llmtrial.core.paths`: Every path under ``results/<trial>/``, named once.
- :mod:`llmtrial.core.record_models`: Typed models of the eight record kinds, each paired with its
  JSON schema.
- :mod:`llmtrial.core.records`: Stage records: the JSON files that stages hand to each other and to
  the report.
- :mod:`llmtrial.core.resources`: The files the library ships as package data: record and config
  schemas, the report's templates, and the vLLM patches. Found through ``importlib.resources``, so
  they are there in an installed (not only an editable) package.

Imports from: no other package. (tests/test_structure.py holds the order.)
"""

__all__ = ["fileio", "joblog", "ledger", "paths", "record_models", "records", "resources"]
