"""Rerun a trial from its results folder's provenance into a new results folder, then compare the two.

The trial as it ran (its provenance: the resolved trial file, schema defaults filled) is written
under a new name into the new folder (``results/<new>/reproduce.json``, the trial file the run is
given), with the model pinned to the commit the original staged and each prompt file to the
original's staged copy. Before anything runs, what would make the rerun measure something else
is checked: the project's commit (and whether its tracked files are changed), vLLM's installed
version and the host. Where one differs the rerun stops,
naming each, unless it is asked to go on; the comparison page then names the same differences.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.compare.trials import TrialFolderError, TrialResults
from llmtrial.core.gitstate import git_state
from llmtrial.core.paths import RESULTS, TrialPaths
from llmtrial.core.redact import REDACTED
from llmtrial.core.vllm_install import find_vllm

#: The checkout this library runs from (its Snakefile is what reruns the trial).
REPO = Path(__file__).resolve().parents[3]
SNAKEFILE = REPO / "workflow" / "Snakefile"
TRIAL_FILE = "reproduce.json"


@dataclass(frozen=True)
class Mismatch:
    """One thing about this host and checkout that differs from the original run."""

    what: str
    then: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.what}: {self.then} when the trial ran, {self.now} now"


def mismatches(original: TrialResults, repo: Path = REPO) -> list[Mismatch]:
    """The project's commit, its changed files, vLLM's version and the host, where they differ from the run's."""
    state, prov = git_state(repo), original.provenance
    out = []
    if state.commit != prov.commit:
        out.append(Mismatch("the project's commit", prov.commit, state.commit))
    if state.dirty and not prov.dirty:
        out.append(Mismatch("the project's tracked files", "unchanged", "changed"))
    here = vllm.version if (vllm := find_vllm()) else None
    if here != original.vllm_version():
        out.append(Mismatch("vLLM's version", original.vllm_version(), here))
    if os.uname().nodename != original.preflight.environment.host:
        out.append(Mismatch("the host", original.preflight.environment.host, os.uname().nodename))
    return out


def _redacted(value: Any, path: str = "") -> list[str]:
    if value == REDACTED:
        return [path]
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in _redacted(v, f"{path}.{key}" if path else str(key))]
    if isinstance(value, list):
        return [k for i, v in enumerate(value) for k in _redacted(v, f"{path}[{i}]")]
    return []


def new_name(trial: str, results: Path) -> str:
    """``<trial>-reproduced``, numbered when that folder exists already."""
    name, n = f"{trial}-reproduced", 1
    while (results / name).exists():
        n += 1
        name = f"{trial}-reproduced-{n}"
    return name


def trial_file(original: TrialResults, name: str) -> dict[str, Any]:
    """The trial as it ran, renamed, its model pinned to the commit staged and each prompt file to the copy the
    trial staged; ValueError naming a redacted key."""
    config = copy.deepcopy(original.config)
    hidden = _redacted(config)
    if hidden:
        raise ValueError(f"the recorded trial has redacted values it needs ({', '.join(hidden)}): give them in the "
                         "environment (HF_TOKEN and the like are read from there) or rerun from the trial file")
    config["trial"] = name
    config["compare_with"] = None
    hub = original.manifest.hub
    if hub is not None and hub.commit:
        config["model"]["source"]["revision"] = hub.commit
    for scenario, staged in (original.provenance.prompt_files or {}).items():  # the prompts the trial read
        copy_path = TrialPaths(original.folder).prompts / Path(staged.staged).name
        config["scenarios"][scenario]["prompts"] = str(copy_path.resolve())
    return config


def reproduce(folder: str | Path, *, workdir: Path, name: str | None = None, anyway: bool = False,
              cores: str = "all", snakemake_args: list[str] | None = None) -> tuple[int, Path | None, list[Mismatch]]:
    """Rerun the trial of ``folder`` in ``workdir`` (its results under ``workdir/results``): (snakemake's exit
    status, the new results folder, the mismatches). Nothing runs where a mismatch was found and not ``anyway``
    (status 3)."""
    original = TrialResults.load(folder)
    found = mismatches(original)
    if found and not anyway:
        return 3, None, found
    results = Path(workdir) / RESULTS
    name = name or new_name(original.trial, results)
    new = TrialPaths.of(name, results)
    if new.root.exists() and any(new.root.iterdir()):
        raise TrialFolderError(f"{new.root}: exists already; give another --as name")
    new.root.mkdir(parents=True, exist_ok=True)
    path = new.root / TRIAL_FILE
    path.write_text(json.dumps(trial_file(original, name), indent=2) + "\n", encoding="utf-8")
    argv = [str(Path(sys.executable).parent / "snakemake"), "--snakefile", str(SNAKEFILE),
            "--directory", str(workdir), "--cores", cores, "--configfile", str(path), *(snakemake_args or [])]
    return subprocess.run(argv, check=False).returncode, new.root, found
