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


def test_a_command_run_twice_in_one_process_logs_to_the_stderr_of_each_run(tmp_path, capsys):
    """Each run logs where stderr is then, never to the stream of a run before (closed since)."""
    import io
    import logging
    import sys

    path = tmp_path / "bad.yaml"
    path.write_text("model: [\n")
    first = io.StringIO()
    with _stderr(first):
        assert main(["validate", str(path)]) == 2
    assert first.getvalue().startswith(f"{path}: not YAML: while parsing a flow node") and "line 2, column 1" in first.getvalue()
    first.close()
    second = io.StringIO()
    with _stderr(second):
        logging.getLogger("llmtrial.test").warning("after the first run")
    assert second.getvalue().endswith("WARNING llmtrial.test: after the first run\n")
    assert "Logging error" not in second.getvalue() + capsys.readouterr().err and sys.stderr is not first


class _stderr:  # noqa: N801 - used as a context manager
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        import sys

        self.saved, sys.stderr = sys.stderr, self.stream

    def __exit__(self, *exc):
        import sys

        sys.stderr = self.saved
