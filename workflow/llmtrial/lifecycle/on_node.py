"""Cleanup on the host that made the changes: on a cluster, the node the ledger names.

Under SLURM the jobs that change a host run on the node an allocation gave, and every ledger entry
names that node (``machine``: :func:`llmtrial.core.hostlock.this_host`). ``onerror``, ``onsuccess``,
``snakemake cleanup`` and ``llmtrial cleanup`` run where snakemake runs: the login node. There,
:func:`hosts_to_reach` finds the hosts other than this one with a change still open, and
:func:`cleanup_there` runs ``llmtrial cleanup`` on each of them through ``srun --nodelist=<node>``
(an argv list, waiting for the node like any job; the results folder is on the shared file
system, as the workflow's own jobs need), then reads back the cleanup record it wrote. From inside
an allocation, a node of that allocation is reached as a step of it (``srun --jobid --overlap``): a
job of its own would wait for the node this allocation holds. A node that cannot be reached
(SLURM has it down, drained or not responding; srun failed) is a residue that names it, and what
it changed is left alone here: undoing a node's services or patches on another machine would
change the wrong host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from llmtrial.core.cleanup_model import CleanupRecord
from llmtrial.core.hostlock import tell, this_host
from llmtrial.core.ledger import Entry, replay
from llmtrial.core.record_base import Residue
from llmtrial.core.records import load_record
from llmtrial.host.slurm_hosts import JOB_ENV, allocation_hosts, node_state, own_job_env, srun_argv

#: How long the cleanup sent to a node may take, waiting for the node included.
SUBMIT_TIMEOUT_S = 1800.0


def hosts_to_reach(entries: list[Entry], besides: Iterable[str] = ()) -> list[str]:
    """The hosts other than this one that made a change still open in the ledger (a taking of the
    host's lock too: the lock file is the node's), in the order they first appear; ``besides``:
    kinds of change not counted (the staged weights, for a cleanup that leaves them to the rerun)."""
    state = replay(entries)
    here, skip = this_host(), set(besides)
    hosts = [e.machine for kind, changes in state.outstanding.items() if kind not in skip
             for e in changes.values() if e.machine != here]
    return list(dict.fromkeys(hosts))


def cleanup_argv(node: str, results_dir: Path, record_path: Path, *, ports: Iterable[int], host: str,
                 stop_timeout: float, weights: bool, submit: Sequence[str] = ()) -> list[str]:
    """``srun`` on ``node`` of this Python's ``llmtrial cleanup --here-only`` for the trial at ``results_dir``
    (the node's own changes; it sends none on); ``submit`` are further srun options (the trial's partition and
    account)."""
    trial = Path(results_dir).name
    cmd = [sys.executable, "-m", "llmtrial.cli", "cleanup", str(Path(results_dir).resolve()), "--here-only",
           "--record", str(Path(record_path).resolve()), "--host", host, "--stop-timeout", str(stop_timeout),
           *[arg for port in ports for arg in ("--port", str(port))], *([] if weights else ["--keep-weights"])]
    if node in allocation_hosts():
        return srun_argv(node, cmd, os.environ[JOB_ENV])
    return srun_argv(node, cmd, None, [f"--job-name=llmtrial-cleanup-{trial}", *submit], wait_s=SUBMIT_TIMEOUT_S)


def cleanup_there(node: str, results_dir: Path, record_path: Path, *, ports: Iterable[int], host: str,
                  stop_timeout: float, weights: bool, submit: Sequence[str] = ()) -> CleanupRecord | Residue:
    """Run the trial's cleanup on ``node`` and return the record it wrote, or, when it could not run
    there, the residue that says so (naming the node, what was tried and what was seen)."""
    argv = cleanup_argv(node, results_dir, record_path, ports=ports, host=host, stop_timeout=stop_timeout,
                        weights=weights, submit=submit)
    def unreached(seen: str) -> Residue:
        return Residue(kind="node", what=node, tried=f"llmtrial cleanup on node {node} through srun", node=node,
                       seen=seen)

    if shutil.which("srun") is None:
        return unreached(f"no srun on {this_host()}: run `llmtrial cleanup {results_dir}` on {node}")
    state = node_state(node)
    if state is not None and not state.available:  # srun would queue the cleanup until the host came back
        return unreached(f"{state.describe()}: run the cleanup again once it is back")
    tell(f"llmtrial cleanup: the ledger's changes were made on node {node}: sending the cleanup there "
         f"({' '.join(argv[:5])} …)")
    Path(record_path).unlink(missing_ok=True)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, check=False,
                              env=None if node in allocation_hosts() else own_job_env())  # a step, or a job of its own
    except subprocess.TimeoutExpired:
        return unreached(f"no answer in {SUBMIT_TIMEOUT_S:.0f} s")
    for line in (done.stdout + done.stderr).splitlines():
        tell(f"  {node}: {line}")
    if not Path(record_path).exists():
        return unreached(f"exit {done.returncode}, no record: {(done.stderr or done.stdout).strip()[-400:]}")
    return load_record(record_path, "cleanup")
