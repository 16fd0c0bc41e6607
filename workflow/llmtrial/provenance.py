"""Provenance: what produced a trial's records, so an auditor can reproduce it.

The workflow's commit and whether its tracked files were changed, the command line that
started the run (secrets redacted), the resolved configuration (schema defaults filled,
secrets redacted) with its sha256, the sha256 of each trial file read, and of each prompt file
as staged. The main Snakemake process puts its command line in the environment once
(:data:`COMMAND_ENV`, set in ``workflow/rules/common.smk``); jobs inherit it and read it back
with :func:`command_from_env`. The record kind is ``provenance``
(``schemas/provenance.record.schema.json``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmtrial.config import validate_config
from llmtrial.core.cost import Cost
from llmtrial.core.fileio import file_digest
from llmtrial.core.gitstate import git_state
from llmtrial.core.record_models import PromptsRecord, ProvenanceRecord, TrialFile
from llmtrial.core.redact import redact_argv, redact_config

#: The main Snakemake process' argv as JSON; jobs inherit it (never passed through params).
COMMAND_ENV = "LLMTRIAL_COMMAND"
#: The trial file Snakemake reads when no ``--configfile`` is given.
DEFAULT_CONFIGFILE = Path("config") / "config.yaml"


def command_from_env(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The run's command line as the main Snakemake process saved it; None when unset or
    not a JSON list of strings."""
    raw = (os.environ if env is None else env).get(COMMAND_ENV)
    if raw is None:
        return None
    try:
        argv = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return [str(a) for a in argv] if isinstance(argv, list) else None


def config_sha256(config: Mapping[str, Any]) -> str:
    """sha256 of the configuration as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def trial_files(configfiles: list[str | os.PathLike[str]], repo: Path) -> list[TrialFile]:
    """``{path, sha256}`` of each trial file (the default one under ``repo`` when none is
    given); sha256 None with the reason when a file cannot be read."""
    paths = [Path(p) for p in configfiles] or [repo / DEFAULT_CONFIGFILE]
    out: list[TrialFile] = []
    for path in paths:
        try:
            out.append(TrialFile(path=str(path), sha256=file_digest(path).hexdigest()))
        except OSError as exc:
            out.append(TrialFile(path=str(path), sha256=None, reason=f"cannot read: {exc.strerror or exc}"))
    return out


def collect(config: Mapping[str, Any], *, configfiles: list[str | os.PathLike[str]], command: list[str] | None,
            repo: Path, prompts: PromptsRecord | None = None) -> ProvenanceRecord:
    """The provenance record of a run of the workflow in ``repo`` with ``config`` (as
    Snakemake resolved it from ``configfiles``, in the order read) started by ``command``;
    ``prompts``: the staged prompt files' record, when a scenario reads one (each file's
    sha256 is recorded as staged).

    ``config`` is resolved again against the schema (defaults filled) on a copy; the record
    holds it with secrets redacted, and ``config_sha256`` hashes that recorded form, so it
    can be checked against the record itself. The ``cost`` block, when given, is also held as its model
    (:class:`llmtrial.core.cost.Cost`), which the report's and an exporter's cost figures read.
    """
    git = git_state(Path(repo))
    resolved = validate_config(copy.deepcopy(json.loads(json.dumps(dict(config), default=str))))
    recorded = redact_config(resolved)
    return ProvenanceRecord(
        commit=git.commit, dirty=git.dirty, git_reason=git.reason,
        repo=str(repo),
        command_line=redact_argv(command) if command is not None else None,
        config=recorded,
        config_sha256=config_sha256(recorded),
        trial_files=trial_files(list(configfiles), Path(repo)),
        **({"cost": Cost.model_validate(resolved["cost"])} if resolved.get("cost") else {}),
        **({"prompt_files": prompts.scenarios} if prompts is not None else {}),
    )
