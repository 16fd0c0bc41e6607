"""Every path under ``results/<trial>/``, named once.

The rules build their output patterns from it (``TrialPaths.pattern()`` keeps the
``{trial}`` and ``{configuration}`` wildcards), and the library finds the ledger, the
cleanup records and the patch folders from a results folder with it, so no path is
spelled in two places.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path("results")


@dataclass(frozen=True)
class TrialPaths:
    """The files and folders of one trial's results folder (``root``)."""

    root: Path

    @classmethod
    def of(cls, trial: str, results: Path | str = RESULTS) -> TrialPaths:
        return cls(Path(results) / trial)

    @classmethod
    def pattern(cls) -> TrialPaths:
        """The paths with the ``{trial}`` wildcard, for rules' outputs."""
        return cls.of("{trial}")

    # -- trial-wide records
    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def preflight(self) -> Path:
        return self.root / "preflight" / "record.json"

    @property
    def manifest(self) -> Path:
        return self.root / "model" / "manifest.json"

    @property
    def prompts(self) -> Path:
        """The staged prompt files of the trial's file scenarios, and their record (manifest.json)."""
        return self.root / "prompts"

    @property
    def prompts_record(self) -> Path:
        return self.prompts / "manifest.json"

    @property
    def quieted(self) -> Path:
        return self.root / "services" / "quieted.json"

    @property
    def patches(self) -> Path:
        """The patch stage's folder: its record, the backups and the plugin folder."""
        return self.root / "patches"

    @property
    def patches_record(self) -> Path:
        return self.patches / "record.json"

    @property
    def cleanup(self) -> Path:
        return self.root / "cleanup" / "record.json"

    @property
    def cleanup_on_demand(self) -> Path:
        return self.root / "cleanup" / "on-demand.json"

    @property
    def cleanup_on_error(self) -> Path:
        return self.root / "cleanup" / "on-error.json"

    @property
    def cleanup_on_success(self) -> Path:
        return self.root / "cleanup" / "on-success.json"

    @property
    def cleanup_at_allocation_end(self) -> Path:
        """Under SLURM: the cleanup the allocation ran on its node before it ended with changes open."""
        return self.root / "cleanup" / "at-allocation-end.json"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def findings(self) -> Path:
        """The report's first screen as plain text: what a run's last lines quote."""
        return self.root / "findings.txt"

    @property
    def charts(self) -> Path:
        """The report's charts as SVG files (for Snakemake's own report)."""
        return self.root / "charts"

    @property
    def provenance(self) -> Path:
        """What produced the report: the project's commit, the command, the resolved trial."""
        return self.root / "provenance.json"

    @property
    def exports(self) -> Path:
        """The trial's records in other tools' formats (llmtrial.export): ``exports/<format>/...``."""
        return self.root / "exports"

    def log(self, name: str) -> Path:
        """A job's log: ``logs/<name>.log`` (``plan/<configuration>`` and the like included)."""
        return self.root / "logs" / f"{name}.log"

    # -- per configuration
    def plan(self, configuration: str = "{configuration}") -> Path:
        return self.root / "plans" / f"{configuration}.json"

    def configuration(self, configuration: str = "{configuration}") -> Path:
        """A configuration's folder: record, server log, telemetry, benchmark results."""
        return self.root / "configs" / configuration

    def config_record(self, configuration: str = "{configuration}") -> Path:
        return self.configuration(configuration) / "record.json"

    def telemetry(self, configuration: str = "{configuration}") -> Path:
        return self.configuration(configuration) / "telemetry.csv"

    def server_log(self, configuration: str = "{configuration}") -> Path:
        return self.configuration(configuration) / "server.log"


@dataclass(frozen=True)
class JobPaths:
    """Where one configuration's job writes (its folder under the trial's results)."""

    trial: TrialPaths
    configuration: str

    @property
    def out_dir(self) -> Path:
        return self.trial.configuration(self.configuration)

    @property
    def record(self) -> Path:
        return self.trial.config_record(self.configuration)

    @property
    def telemetry(self) -> Path:
        return self.trial.telemetry(self.configuration)

    @property
    def server_log(self) -> Path:
        return self.trial.server_log(self.configuration)

    @property
    def ledger(self) -> Path:
        return self.trial.ledger

    @property
    def node_telemetry(self) -> Path:
        """Every node's samples of a multi-node configuration, merged, with a node column."""
        return self.out_dir / "telemetry-nodes.csv"

    @property
    def bench_dir(self) -> Path:
        return self.out_dir / "bench"

    @property
    def flags_off_log(self) -> Path:
        """The log of the server launched with the patch flags off, for the answers (``outputs.patch_off``)."""
        return self.out_dir / "answers-flags-off.log"

    @property
    def prefix_caching_log(self) -> Path:
        """The log of the server launched again with prefix caching on (a prefix_repetition scenario)."""
        return self.out_dir / "prefix-caching-server.log"

    def fresh(self) -> None:
        """Ready the folder for a run: an empty bench folder, and no server, rank or node-telemetry file
        of an earlier run (the record and its telemetry are replaced when written)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.bench_dir, ignore_errors=True)  # never mix passes of an earlier run
        self.bench_dir.mkdir(parents=True)
        for old in [self.server_log, self.flags_off_log, self.prefix_caching_log, self.node_telemetry,
                    *self.out_dir.glob("server-*.log"), *self.out_dir.glob("ray-*.log")]:  # other nodes' logs
            old.unlink(missing_ok=True)

    def rel(self, path: Path) -> str:
        """``path`` relative to the configuration's folder, as records name files."""
        try:
            return str(path.relative_to(self.out_dir))
        except ValueError:
            return str(path)
