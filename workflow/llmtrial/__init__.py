"""llmtrial: reproducible serving trials of LLMs with vLLM.

The library behind the Snakemake workflow. Modules follow the stages:
staging, server, logs, bench, telemetry, records, cleanup, report.
No module imports snakemake.
"""

__version__ = "0.1.0"
