"""The comparison phase of one configuration's job, after its server stopped: what the log
explains (the failure's line and the GPUs' health after it, the start-up facts, the engine's
warnings, each patch's evidence) and the measured figures beside the plan's (the predicted
start-up terms, the throughput bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmtrial.core.ledger import Ledger
from llmtrial.host.gpus import after_failure
from llmtrial.logs import failures, startup_log
from llmtrial.logs.engine_warnings import engine_warnings
from llmtrial.logs.lines import tail
from llmtrial.patch.patching import evidence
from llmtrial.plan.ceiling import compare_with_measured
from llmtrial.plan.prediction import compare_with_plan


def diagnosis(record: Mapping[str, Any], text: str, *, ledger: Ledger, gpus: Sequence[Mapping[str, Any]],
              kernel_baseline: Sequence[str], label: str, health_check: Any) -> dict[str, Any]:
    """A failed configuration's parts: the GPUs' health after it, and its failure with the line of
    the server's log that explains it and the log's tail."""
    source = record["server"]["log"]
    return {
        "gpu_health": after_failure(ledger, list(gpus), list(kernel_baseline), label, health_check),
        "failure": {**record["failure"],
                    "error_line": failures.diagnose_failure(text, source=source,
                                                            ready="ready_seconds" in record["cold_start"]),
                    "log_tail": tail(text, 40)},
    }


def compare(record: Mapping[str, Any], text: str, *, plan: Mapping[str, Any], patched: Mapping[str, Any],
            env: Mapping[str, str]) -> dict[str, Any]:
    """The record's parts read from the server's log (``text``) and set beside the plan."""
    source = record["server"]["log"]
    startup = record["startup"] or (startup_log.parse_startup(text, source=source) if text else {})
    return {
        "startup": startup,
        "engine_warnings": engine_warnings(text, source=source),
        "patches": {"reapplied": patched["reapplied"], "plugin_dir": patched["plugin_dir"],
                    "patches": evidence(patched["patches"], text, env, source)},
        "prediction": compare_with_plan(plan, startup),
        "throughput_bound": compare_with_measured(plan, record["scenarios"]),
    }
