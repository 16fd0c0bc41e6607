"""The workflow catalog's file (.snakemake-workflow-catalog.yml): the catalog's keys, and mandatory flags that
snakemake takes with this workflow and that the README's module use gives."""

from __future__ import annotations

import shlex

import pytest
import yaml

from conftest import REPO
from workflow_helpers import job_counts, snakemake

pytestmark = pytest.mark.workflow

CATALOG = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())


def test_the_catalog_file_has_the_catalogs_keys_and_claims_only_the_tested_deployment():
    usage = CATALOG["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert set(usage["mandatory-flags"]) == {"desc", "flags"} and usage["mandatory-flags"]["desc"].strip()
    assert usage["software-stack-deployment"] == {"conda": False, "singularity": False, "singularity+conda": False}
    assert usage["report"] is True and (REPO / "workflow" / "report" / "workflow.rst").is_file()
    assert (REPO / "workflow" / "Snakefile").is_file() and (REPO / "config" / "README.md").is_file()


def test_the_mandatory_flags_are_what_the_workflows_profile_sets_and_the_module_use_gives(tmp_path):
    flags = shlex.split(CATALOG["usage"]["mandatory-flags"]["flags"])
    profile = yaml.safe_load((REPO / "workflow" / "profiles" / "default" / "profile.yaml").read_text())
    assert flags == ["--resources", *profile["resources"]]
    readme = (REPO / "README.md").read_text()
    assert f"snakemake --cores all {' '.join(flags)}" in readme
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    run = snakemake(tmp_path, "-n", "--workflow-profile", "none", *flags)
    assert run.returncode == 0, run.stdout + run.stderr
    assert job_counts(run.stdout)["trial"] == 2
