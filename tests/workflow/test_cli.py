"""The llmtrial command line."""

from __future__ import annotations

import json

import yaml

from conftest import DATA, REPO
from llmtrial.cli import main


def test_parse_log_prints_facts_and_the_failure_line(capsys):
    assert main(["parse-log", str(DATA / "vllm-0.32.0-cpu-bad-arg-server.log")]) == 0
    out = capsys.readouterr().out
    assert "failure (argparse)" in out and "unrecognized arguments: --not-a-vllm-flag" in out


def test_parse_log_json(capsys):
    assert main(["parse-log", "--json", str(DATA / "vllm-0.32.0-cpu-tp2-server.log")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["startup"]["kv_cache_tokens"]["value"] == 1_048_576


def test_validate_accepts_the_default_trial_and_names_a_bad_key(tmp_path, capsys):
    assert main(["validate", str(REPO / "config" / "config.yaml")]) == 0
    bad = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    bad["model"]["source"]["kindd"] = "tiny"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["validate", str(path)]) == 2
    assert "model.source.kindd" in capsys.readouterr().err
