"""llmtrial: reproducible serving trials of LLMs with vLLM.

The library behind the Snakemake workflow, in packages that follow the stages, each importing
only the packages below it (tests/test_structure.py checks it):

- :mod:`llmtrial.core`: ledger, records and their models, paths, file I/O, package data;
- :mod:`llmtrial.logs`: vLLM's logs read (start-up figures, failures, engine warnings);
- :mod:`llmtrial.host`: nodes, process groups, disk, GPUs, services, probes, host checks;
- :mod:`llmtrial.plan`: shapes, checkpoints, vLLM's memory accounting, the planner;
- :mod:`llmtrial.weights`: sources, staging, manifests, the weights policy;
- :mod:`llmtrial.patch`: vLLM patches as data, applied and reverted;
- :mod:`llmtrial.lifecycle`: preflight, host readiness, cleanup from the ledger;
- :mod:`llmtrial.serve`: the server, the benchmark, telemetry, the trial job in phases;
- :mod:`llmtrial.report`: conclusions, charts and the rendered report, from records only.

Above them sit the trial file (:mod:`llmtrial.config`), provenance (:mod:`llmtrial.provenance`)
and the command line (:mod:`llmtrial.cli`). No module imports snakemake.
"""

__version__ = "0.1.0"
