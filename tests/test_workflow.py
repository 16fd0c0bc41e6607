"""The workflow without running vLLM: DAG shape, config validation, lint."""

from __future__ import annotations

from workflow_helpers import default_config, job_counts, snakemake, write_config


def test_dry_run_has_one_trial_job_per_configuration(tmp_path):
    config = default_config()
    config["configurations"]["tp4"] = {"args": {"tensor_parallel_size": 4}}
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "-n")
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == {
        "preflight": 1, "stage_model": 1, "trial": 3, "cleanup_trial": 1, "report": 1, "all": 1}
    for name in ("tp1", "tp2", "tp4"):
        assert f"results/demo/configs/{name}/record.json" in out.stdout


def test_one_configuration_can_be_asked_for_alone(tmp_path):
    write_config(tmp_path, default_config())
    out = snakemake(tmp_path, "-n", "results/demo/configs/tp2/record.json")
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == {"preflight": 1, "stage_model": 1, "trial": 1}


def test_an_unknown_key_fails_the_dry_run_naming_it(tmp_path):
    config = default_config()
    config["serving"]["startup_timeout"] = 5
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "-n")
    assert out.returncode != 0
    assert "serving.startup_timeout" in out.stdout + out.stderr


def test_a_wrong_type_fails_the_dry_run_naming_the_key(tmp_path):
    config = default_config()
    config["scenarios"]["c4"]["concurrency"] = "four"
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "-n")
    assert out.returncode != 0
    assert "scenarios.c4.concurrency" in out.stdout + out.stderr


def test_lint_passes():
    from conftest import REPO

    out = snakemake(REPO, "--lint")
    assert out.returncode == 0, out.stdout + out.stderr
