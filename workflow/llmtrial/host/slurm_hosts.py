"""The hosts of the SLURM allocation a job runs in, and the argv that runs a command on one of them.

Inside an allocation SLURM sets ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST``, the latter in its
compressed host list form (``gpu[07-08,11],login2``), which :func:`expand_hostlist` reads as
``scontrol show hostnames`` does, without needing a SLURM configuration. A trial node with
``reach: slurm`` is host ``slurm_index`` of that list (:func:`allocation_hosts`); a command runs there
as a step of the running allocation (``srun --jobid=<id> --overlap``, beside the step that runs the
trial), or, from outside the allocation (a cleanup from the login node, after the allocation
ended), as a job of its own on that host (``srun --nodelist=<host>``).

An allocation's batch script (the process sbatch starts: where Snakemake's SLURM executor runs the
group's own snakemake) has ``SLURM_JOB_ID`` but no ``SLURM_STEP_ID``, which srun sets in each step it
starts (:func:`in_batch_step`); :func:`job_state` reads a job's state from squeue (``RUNNING``, or
``CANCELLED`` at once after scancel while its processes are still being killed), and
:func:`node_state` a host's from scontrol: a host that is down, drained or not responding takes no job
of its own, and an srun asking it for one would wait in the queue until the host came back.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ALLOCATION_ENV", "JOB_ENV", "NODELIST_ENV", "STEP_ENV", "HostState", "expand_hostlist", "allocation_hosts",
           "STATUS_CHECK_MAX_S", "cap_status_checks", "in_batch_step", "job_state", "node_state", "own_job_env", "remember_allocation", "srun_argv", "srun_options"]

JOB_ENV = "SLURM_JOB_ID"
NODELIST_ENV = "SLURM_JOB_NODELIST"
STEP_ENV = "SLURM_STEP_ID"
#: ``<job id>:<node list>``, set by the allocation's batch script for the steps it starts (:func:`remember_allocation`).
ALLOCATION_ENV = "LLMTRIAL_SLURM_ALLOCATION"

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"unbalanced brackets in host list {text!r}")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in host list {text!r}")
    return [*parts, text[start:]]


def _expand_one(item: str) -> list[str]:
    """``gpu[07-08,11]`` -> gpu07, gpu08, gpu11 (one bracket, at the end, as SLURM 22.05 writes and
    reads them: ``n[1-2]-ib`` is an invalid host list to scontrol too; zero padding kept)."""
    match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]", item)
    if match is None:
        if "[" in item or "]" in item:
            raise ValueError(f"cannot read host list item {item!r}")
        return [item]
    prefix, ranges = match.groups()
    out = []
    for part in ranges.split(","):
        bounds = _RANGE.match(part.strip())
        if bounds is None:
            raise ValueError(f"cannot read range {part!r} in host list item {item!r}")
        low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
        width = len(low) if low.startswith("0") else 0
        out += [f"{prefix}{n:0{width}d}" for n in range(int(low), int(high) + 1)]
    return out


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list as one name per host, in order."""
    return [host for item in _top_level(text.strip()) if item for host in _expand_one(item)]


def allocation_hosts(env: Mapping[str, str] | None = None) -> list[str]:
    """The hosts of the allocation this process runs in, in SLURM's order; [] outside one. The node list
    the batch script noted for this job (:data:`ALLOCATION_ENV`) comes first: in a step that Snakemake's
    jobstep plugin starts, ``SLURM_JOB_NODELIST`` names the step's one node, not the allocation's."""
    env = os.environ if env is None else env
    job, _, noted = env.get(ALLOCATION_ENV, "").partition(":")
    text = noted if noted and job == env.get(JOB_ENV) else env.get(NODELIST_ENV)
    return expand_hostlist(text) if text else []


def remember_allocation(env: MutableMapping[str, str] | None = None) -> None:
    """In an allocation's batch script, note its job id and node list in :data:`ALLOCATION_ENV` for every
    process it starts: Snakemake's jobstep plugin drops each ``SLURM_*`` variable but the job's id before
    its steps' srun, which then sets ``SLURM_JOB_NODELIST`` to the step's own node (a two-node job's
    steps would see one host)."""
    env = os.environ if env is None else env
    if in_batch_step(env) and env.get(NODELIST_ENV):
        env[ALLOCATION_ENV] = f"{env[JOB_ENV]}:{env[NODELIST_ENV]}"


def in_batch_step(env: Mapping[str, str] | None = None) -> bool:
    """True in an allocation's batch script and what it starts without srun; False in a step srun
    started and outside SLURM."""
    env = os.environ if env is None else env
    return bool(env.get(JOB_ENV)) and not env.get(STEP_ENV)


def job_state(job: str, timeout: float = 30.0) -> str | None:
    """Job ``job``'s state as squeue shows it (``RUNNING``, ``CANCELLED``, ``TIMEOUT``, ...); None
    where squeue is missing, fails or no longer knows the job."""
    if shutil.which("squeue") is None:
        return None
    try:
        done = subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None
    states = done.stdout.split() if done.returncode == 0 else []
    return states[0] if states else None


#: The parts of a host's state (``scontrol``'s ``State=``, its flags joined by ``+``) under which it takes no
#: new job: down, drained or draining, failed or failing, not responding, powered down, not there yet.
UNAVAILABLE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN",
                         "POWERING_DOWN", "POWER_DOWN", "FUTURE", "UNKNOWN", "INVAL"})
#: The marks sinfo appends to a state (not responding, powered off, powering up, ...).
SINFO_MARKS = "*~#!%$@^-"


@dataclass(frozen=True)
class HostState:
    """A SLURM host's state as scontrol shows it: ``state`` (``IDLE``, ``DOWN+NOT_RESPONDING``, ...) and the
    ``reason`` an administrator or slurmctld gave (None without one)."""

    host: str
    state: str
    reason: str | None = None

    @property
    def available(self) -> bool:
        """False when SLURM would not start a job on the host now (:data:`UNAVAILABLE`, or sinfo's marks of a
        host not responding, powered off or powering down: ``*``, ``~``, ``!``, ``%``)."""
        parts = self.state.upper().split("+")
        return not ({p.rstrip(SINFO_MARKS) for p in parts} & UNAVAILABLE or any(p[-1:] in "*~!%" for p in parts if p))

    def describe(self) -> str:
        return f"SLURM has host {self.host} {self.state}" + (f" (reason: {self.reason})" if self.reason else "")


def node_state(host: str, timeout: float = 30.0) -> HostState | None:
    """Host ``host``'s state from ``scontrol show node``; None where scontrol is missing, fails or does
    not know the host (then only trying it tells)."""
    if shutil.which("scontrol") is None:
        return None
    try:
        done = subprocess.run(["scontrol", "--oneliner", "show", "node", host], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None
    state = re.search(r"(?:^|\s)State=(\S+)", done.stdout) if done.returncode == 0 else None
    if state is None:
        return None
    reason = re.search(r"(?:^|\s)Reason=(.*?)\s*(?=\s[A-Za-z]+=|$)", done.stdout.strip())
    return HostState(host=host, state=state.group(1), reason=reason.group(1) if reason else None)


def own_job_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for an srun that starts a job of its own (``srun --nodelist=<host>``, no ``--jobid``):
    this process's, without the ``SLURM_*`` variables of a job it may run in (srun takes an inherited
    ``SLURM_JOB_ID`` for a job to make a step of, and refuses a host outside it); ``SLURM_CONF`` kept."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def srun_options(partition: str | None, account: str | None) -> list[str]:
    """srun's options for a job of its own under the trial's partition and account (where given)."""
    return [f"--{key}={value}" for key, value in (("partition", partition), ("account", account)) if value]


def srun_argv(host: str, cmd: Sequence[str], job: str | None, options: Sequence[str] = (),
              wait_s: float | None = None) -> list[str]:
    """The argv that runs ``cmd`` on ``host``: a step of allocation ``job`` beside the running ones,
    or, without one, a job of its own on that host (``options``: srun's further ones); ``wait_s``: how
    long a job of its own may wait for the host (srun's ``--immediate``), so that srun gives up its
    request itself instead of being killed with it still queued, to run later unasked."""
    within = [f"--jobid={job}", "--overlap"] if job else []
    immediate = [f"--immediate={max(1, int(wait_s))}"] if wait_s is not None and not job else []
    return ["srun", *within, "--nodes=1", "--ntasks=1", f"--nodelist={host}", *immediate, *options, *cmd]


#: The longest wait between two status checks of the login side's snakemake under SLURM (seconds).
STATUS_CHECK_MAX_S = 20


def cap_status_checks(executor: type, most_s: float = STATUS_CHECK_MAX_S) -> None:
    """Cap the wait between the status checks of Snakemake's SLURM executor class ``executor`` at ``most_s``
    seconds, or at the run's ``--seconds-between-status-checks`` where that is longer.

    The executor (snakemake-executor-plugin-slurm 2.8.0) adds 10 s to its wait after every check that finds
    no job finished, up to 180 s, and has no setting for it: a trial's host group is one long job, so the
    login side noticed its end up to three minutes late (47 s after a two-node trial's cleanup had finished,
    here), and the report with it. A few jobs a trial keep checks every 20 s light for slurmctld. Applied once
    per class; the executor's own checks are unchanged."""
    original = executor.check_active_jobs
    if getattr(original, "capped_at", None) is not None:
        return

    async def check_active_jobs(self: Any, active_jobs: list[Any]) -> AsyncIterator[Any]:
        async for job in original(self, active_jobs):
            yield job
        asked = getattr(self.workflow.remote_execution_settings, "seconds_between_status_checks", None) or 0
        self.next_seconds_between_status_checks = min(self.next_seconds_between_status_checks, max(most_s, asked))

    check_active_jobs.capped_at = most_s  # type: ignore[attr-defined]
    check_active_jobs.__doc__ = original.__doc__
    executor.check_active_jobs = check_active_jobs
