"""Provenance: the workflow's commit and state, the command line and the resolved configuration,
each trial file's sha256; against real git repositories made here."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, written
from llmtrial.config import validate_config
from llmtrial.core.record_models import ProvenanceRecord
from llmtrial.core.records import check_record, load_record, read_record, write_record
from llmtrial.core.redact import redact_argv, redact_config
from llmtrial.provenance import COMMAND_ENV, collect, command_from_env, config_sha256

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git checkout with one commit: config/config.yaml (the default trial) and a trial file."""
    root = tmp_path / "wf"
    (root / "config" / "trials").mkdir(parents=True)
    shutil.copy(REPO / "config" / "config.yaml", root / "config" / "config.yaml")
    (root / "config" / "trials" / "x.yaml").write_text("trial: x\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    return root


def demo_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_a_clean_checkout_names_its_commit(repo):
    record = collect(demo_config(), configfiles=[], command=["snakemake", "--cores", "all"], repo=repo)
    assert record.commit == git(repo, "rev-parse", "HEAD").strip() and len(record.commit) == 40
    assert record.dirty is False and record.git_reason is None
    assert record.command_line == ["snakemake", "--cores", "all"]


def test_a_changed_tracked_file_makes_it_dirty_an_untracked_one_does_not(repo):
    (repo / "untracked.txt").write_text("new")
    assert collect(demo_config(), configfiles=[], command=None, repo=repo).dirty is False
    (repo / "config" / "trials" / "x.yaml").write_text("trial: y\n")
    assert collect(demo_config(), configfiles=[], command=None, repo=repo).dirty is True


def test_a_folder_that_is_not_a_checkout_has_no_commit_and_says_why(tmp_path):
    record = written(collect(demo_config(), configfiles=[], command=None, repo=tmp_path))
    assert record["commit"] is None and record["dirty"] is None
    assert "not a git repository" in record["git_reason"]
    assert record["trial_files"] == [{"path": str(tmp_path / "config" / "config.yaml"), "sha256": None,
                                      "reason": record["trial_files"][0]["reason"]}]
    check_record(record, "provenance")


def test_the_record_is_the_provenance_model_and_writes_the_fields_the_old_dict_had(tmp_path):
    config = demo_config()
    record = collect(config, configfiles=[], command=["snakemake", "-n"], repo=tmp_path)
    assert isinstance(record, ProvenanceRecord)
    recorded = redact_config(validate_config(copy.deepcopy(config)))
    reason = record.trial_files[0].reason
    assert reason.startswith("cannot read: ")
    expected = {"commit": None, "dirty": None, "git_reason": record.git_reason, "repo": str(tmp_path),
                "command_line": ["snakemake", "-n"], "config": recorded, "config_sha256": config_sha256(recorded),
                "trial_files": [{"path": str(tmp_path / "config" / "config.yaml"), "sha256": None, "reason": reason}]}
    out = read_record(write_record(tmp_path / "provenance.json", record, schema="provenance"))
    assert out == expected and list(out) == list(expected)


def test_a_token_on_the_command_line_is_redacted_and_the_rest_kept():
    argv = ["snakemake", "--cores", "all", "--config", "hf_token=hf_abcSECRET", "cold_start={max_tokens: 8}",
            "--hf-token", "hf_next", "serving={env: {HF_TOKEN: 'hf quoted', VLLM_X: '1'}}", "--api-key=k1"]
    out = redact_argv(argv)
    assert out == ["snakemake", "--cores", "all", "--config", "hf_token=<redacted>", "cold_start={max_tokens: 8}",
                   "--hf-token", "<redacted>", "serving={env: {HF_TOKEN: <redacted>, VLLM_X: '1'}}",
                   "--api-key=<redacted>"]
    assert not any(s in repr(out) for s in ("hf_abcSECRET", "hf_next", "hf quoted", "k1"))


def test_the_command_line_comes_back_from_the_environment(monkeypatch):
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    assert command_from_env() is None
    monkeypatch.setenv(COMMAND_ENV, json.dumps(["snakemake", "--config", "hf_token=x"]))
    assert command_from_env() == ["snakemake", "--config", "hf_token=x"]
    assert command_from_env({COMMAND_ENV: "not json"}) is None
    record = collect(demo_config(), configfiles=[], command=command_from_env(), repo=REPO)
    assert record.command_line == ["snakemake", "--config", "hf_token=<redacted>"]


def test_the_config_is_resolved_with_defaults_its_secrets_redacted_and_hashed(repo):
    config = demo_config()
    config["serving"]["env"] = {"HF_TOKEN": "hf_inconfig", "VLLM_CPU_KVCACHE_SPACE": "1"}
    record = written(collect(config, configfiles=[], command=None, repo=repo))
    resolved = validate_config(copy.deepcopy(config))
    assert record["config"]["cold_start"] == resolved["cold_start"]  # defaults filled
    assert record["config"]["serving"]["env"] == {"HF_TOKEN": "<redacted>", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert "hf_inconfig" not in json.dumps(record)
    assert record["config"] == redact_config(resolved) and config["serving"]["env"]["HF_TOKEN"] == "hf_inconfig"
    canonical = json.dumps(record["config"], sort_keys=True, separators=(",", ":"))
    assert record["config_sha256"] == hashlib.sha256(canonical.encode()).hexdigest() == config_sha256(record["config"])
    assert collect(resolved, configfiles=[], command=None, repo=repo).config_sha256 == record["config_sha256"]


def test_each_trial_file_has_the_sha256_of_its_bytes(repo, tmp_path):
    trial = repo / "config" / "trials" / "x.yaml"
    record = written(collect(demo_config(), configfiles=[repo / "config" / "config.yaml", str(trial)], command=None,
                             repo=repo))
    assert record["trial_files"] == [
        {"path": str(repo / "config" / "config.yaml"),
         "sha256": hashlib.sha256((repo / "config" / "config.yaml").read_bytes()).hexdigest()},
        {"path": str(trial), "sha256": hashlib.sha256(b"trial: x\n").hexdigest()}]
    default = written(collect(demo_config(), configfiles=[], command=None, repo=repo))["trial_files"]
    assert default == [record["trial_files"][0]]  # none named: the default trial file
    path = write_record(tmp_path / "provenance.json", record, schema="provenance")
    assert load_record(path, "provenance").trial_files[1].sha256 == record["trial_files"][1]["sha256"]


def test_common_smk_saves_the_command_line_once_in_the_environment_not_in_params():
    text = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert "os.environ.setdefault(COMMAND_ENV, json.dumps(sys.argv))" in text
    assert not any("COMMAND_ENV" in p.read_text() or "command_from_env" in p.read_text()
                   for p in (REPO / "workflow" / "rules").glob("*.smk") if p.name != "common.smk")


def test_the_cost_block_is_carried_as_its_model_so_exports_read_the_price_from_the_record(tmp_path):
    config = demo_config()
    config["cost"] = {"price": 3.5, "per": "host_hour", "currency": "EUR"}
    path = write_record(tmp_path / "provenance.json", collect(config, configfiles=[], command=None, repo=tmp_path),
                        schema="provenance")
    assert read_record(path)["cost"] == {"price": 3.5, "per": "host_hour", "currency": "EUR", "note": ""}
    cost = load_record(path, "provenance").cost
    assert cost is not None and (cost.price, cost.per, cost.currency) == (3.5, "host_hour", "EUR")
    without = collect(demo_config(), configfiles=[], command=None, repo=tmp_path)
    assert without.cost is None and "cost" not in written(without)
