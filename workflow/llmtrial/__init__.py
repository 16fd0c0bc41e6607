"""llmtrial: reproducible serving trials of LLMs with vLLM.

The library behind the Snakemake workflow. Modules follow the stages:
staging, server, logs, bench, telemetry, records, cleanup, report; the model stage's
shared parts are tiny, model_source, manifest, disk and hub, and every module hashes and
writes files through fileio. Imports run one way (tests/test_structure.py checks it).
No module imports snakemake.
"""

__version__ = "0.1.0"
