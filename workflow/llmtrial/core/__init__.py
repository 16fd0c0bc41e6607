"""The shared core: the ledger, the host lock, the stage records and their models, the trial's paths, file I/O, the
package's data and job logs. It imports no other package.

- :mod:`llmtrial.core.answers_model`: The answers part of a configuration record: the task set,
  each answer and its grade, each run.
- :mod:`llmtrial.core.cleanup_model`: The cleanup record's model and the quiet record's: what a trial
  gave back, read from the ledger alone, and what it quieted.
- :mod:`llmtrial.core.comparison_model`: The comparison record's model: one trial against another, what
  differs, and each figure's ratio with its interval and verdict.
- :mod:`llmtrial.core.configuration_spec`: One configuration's spec: what its plan and its job read of
  the trial file, as the plan and trial rules pass it.
- :mod:`llmtrial.core.configuration_model`: The configuration record's model: what one serving
  configuration's job measured, its scenarios, server, failure and telemetry.
- :mod:`llmtrial.core.cost`: Cost per million output tokens and energy per output token: the
  trial's price (the provenance record's ``cost``) over a configuration's measured throughput.
- :mod:`llmtrial.core.fileio`: Two file routines the whole library shares: hashing a file and
  writing one atomically.
- :mod:`llmtrial.core.gitstate`: The project checkout's state: its commit and whether its tracked files
  are changed.
- :mod:`llmtrial.core.hostlock`: The host lock: one trial at a time changes a host.
- :mod:`llmtrial.core.joblog`: Logging for one workflow job or command: everything to one log file,
  with timestamps.
- :mod:`llmtrial.core.ledger`: The trial ledger: an append-only record of every change a trial makes
  to the host.
- :mod:`llmtrial.core.paths`: Every path under ``results/<trial>/``, named once.
- :mod:`llmtrial.core.patch_model`: A vLLM patch's ``patch.yaml`` as one model (its schema generated from it).
- :mod:`llmtrial.core.preflight_model`: The preflight record's model: the host as found, its checks,
  the nodes, the kernel log, the probes and the disk.
- :mod:`llmtrial.core.record_base`: The base of every record model and the parts several record kinds
  share: a check, a fact, a residue.
- :mod:`llmtrial.core.record_models`: Typed models of the ten record kinds: the one statement of each
  record's shape, its JSON Schema (``schemas/<kind>.record.schema.json``) generated from it.
- :mod:`llmtrial.core.records`: Stage records: the JSON files that stages hand to each other and to
  the report.
- :mod:`llmtrial.core.redact`: Secrets kept out of records, logs and the report: the values of
  secret-looking names in an environment, a command line or a configuration become ``<redacted>``.
- :mod:`llmtrial.core.resources`: The files the library ships as package data: record and config
  schemas, the report's templates, and the vLLM patches. Found through ``importlib.resources``, so
  they are there in an installed (not only an editable) package.
- :mod:`llmtrial.core.scenario_model`: A scenario's parts in the configuration record: its passes,
  their summaries and windows, a sweep's steps and onset, the repetition's outcome.
- :mod:`llmtrial.core.stats`: The statistics behind every verdict: intervals over passes, over
  requests, and of a ratio (Student t, percentile bootstrap, Welch's t).
- :mod:`llmtrial.core.trial_checks`: The trial file's model's shared parts: its number type, its names'
  patterns, vLLM's argument names, and what its checks across keys share.
- :mod:`llmtrial.core.trial_config`: The trial file as one model, a submodel per block, its checks across
  keys as its validators (``schemas/config.schema.json`` generated from it).
- :mod:`llmtrial.core.units`: Units, stated once: the binary byte multiples and a byte count for people.
- :mod:`llmtrial.core.vllm_install`: Which vLLM is installed (distribution, version, build), and which
  one a preflight record found.

Imports from: no other package. (tests/test_structure.py holds the order.)
"""

__all__ = ["answers_model", "cleanup_model", "comparison_model", "configuration_model", "configuration_spec", "cost",
           "fileio", "gitstate", "hostlock", "joblog", "ledger", "paths", "patch_model", "preflight_model",
           "record_base", "record_models", "records", "redact", "resources", "scenario_model", "stats",
           "trial_checks", "trial_config", "units", "vllm_install"]
