"""The review phase of one configuration's job, after its server stopped: what the log
explains (the failure's line and the GPUs' health after it, the start-up facts, the engine's
warnings, each patch's evidence) and the measured figures beside the plan's (the predicted
start-up terms, the throughput bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmtrial.core.configuration_model import (
    EngineWarning,
    Failure,
    GpuHealth,
    Prediction,
    ServerPatches,
    StartupPhase,
    ThroughputBound,
)
from llmtrial.core.ledger import Ledger
from llmtrial.core.preflight_model import SelectedGpu
from llmtrial.core.record_models import PlanRecord
from llmtrial.core.scenario_model import Scenario
from llmtrial.core.trial_config import HealthCheckBlock
from llmtrial.host.gpus import after_failure
from llmtrial.logs import failures, startup_log
from llmtrial.logs.engine_warnings import engine_warnings
from llmtrial.logs.lines import tail
from llmtrial.logs.startup_phases import compile_cache, startup_phases
from llmtrial.patch.patching import Patched, evidence
from llmtrial.plan.ceiling import compare_with_measured
from llmtrial.plan.prediction import compare_with_plan


@dataclass
class Diagnosis:
    """A failed configuration's parts of the record."""

    #: Each selected GPU's health after the failure (None without a selected GPU).
    gpu_health: GpuHealth | None
    #: The failure with the line of the server's log that explains it and the log's tail.
    failure: Failure


@dataclass
class Reviewed:
    """The record's parts read from the server's log and set beside the plan."""

    startup: dict[str, Any]
    startup_phases: list[StartupPhase]
    compile_cache: str | None
    engine_warnings: list[EngineWarning]
    patches: ServerPatches
    prediction: list[Prediction]
    throughput_bound: list[ThroughputBound]


def review_failure(failure: Failure, text: str, *, source: str, ready: bool, ledger: Ledger,
              gpus: Sequence[SelectedGpu], kernel_baseline: Sequence[str], label: str,
              health_check: HealthCheckBlock) -> Diagnosis:
    """A failed configuration's parts: the GPUs' health after it, and its ``failure`` with the line of
    the server's log (``text``, read from ``source``; ``ready``: the server had answered /health) that
    explains it and the log's tail."""
    health = after_failure(ledger, list(gpus), list(kernel_baseline), label, health_check)
    explained = failures.diagnose_failure(text, source=source, ready=ready)
    return Diagnosis(gpu_health=GpuHealth.model_validate(health) if health is not None else None,
                     failure=Failure.model_validate({**failure.model_dump(exclude_unset=True), "error_line": explained,
                                                     "log_tail": tail(text, 40)}))


def review(text: str, *, source: str, startup: Mapping[str, Any], scenarios: Sequence[Scenario],
            plan: PlanRecord, patched: Patched, env: Mapping[str, str], ready_seconds: float | None = None) -> Reviewed:
    """The record's parts read from the server's log (``text``, read from ``source``) and set beside the
    plan: the start-up facts (``startup`` as the measurement read them, else from the log), its phases (with
    ``ready_seconds``, the launch-to-ready time) and what it did with the compile cache, the engine's
    warnings, each patch's evidence, the predictions, and the ``scenarios``' throughput bound."""
    facts = dict(startup) or (startup_log.parse_startup(text, source=source) if text else {})
    return Reviewed(
        startup=facts, startup_phases=startup_phases(text, source, ready_seconds) if text else [],
        compile_cache=compile_cache(text) if text else None,
        engine_warnings=engine_warnings(text, source=source),
        patches=ServerPatches(reapplied=patched.reapplied, plugin_dir=patched.plugin_dir,
                              patches=evidence(patched.patches, text, env, source)),
        prediction=compare_with_plan(plan, facts),
        throughput_bound=compare_with_measured(plan, scenarios),
    )
