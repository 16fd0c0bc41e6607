"""The environment record: exact versions of what runs, secrets redacted."""

from __future__ import annotations

import importlib.metadata as md
import sys

from llmtrial.preflight import environment_record
from llmtrial.records import redact_env


def test_environment_names_python_and_exact_package_versions(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    env = environment_record()
    assert env["python"] == sys.version.split()[0]
    assert env["key_packages"]["vllm-cpu"] == md.version("vllm-cpu")
    assert env["key_packages"]["snakemake"] == md.version("snakemake")
    assert env["packages"]["torch"] == md.version("torch")
    assert env["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["env"]["HF_TOKEN"] == "<redacted>"
    assert "hf_secret_value" not in repr(env)
    assert env["gpus"]["present"] in (True, False) and env["cpu_count"] >= 1


def test_redaction_keeps_ordinary_values():
    assert redact_env({"HF_TOKEN": "x", "MY_API_KEY": "y", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}) == {
        "HF_TOKEN": "<redacted>", "MY_API_KEY": "<redacted>", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
