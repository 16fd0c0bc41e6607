"""A real SLURM on this machine, for the tests of the SLURM profile: one node by default, or one node
per host of tests/hosts.py (:class:`SlurmNode`: each slurmd started in its host's network namespace,
``NodeAddr`` its address, the controller and the clients on the first node's host; the slurmd's
spool, pid file and log named with ``%n``, its node name).

:func:`slurm_cluster` brings up Debian's SLURM 22.05 (packages munge, slurmctld, slurmd and
slurm-client, which it installs with apt when missing, as root, with ``/usr/sbin/policy-rc.d``
denying every service start for the duration) as one cluster of one node, in about 1.5 s:

* a folder ``/run/llmtrial-slurm-<pid>-<n>-<random>`` (0755: munged wants every parent of its
  socket traversable, which pytest's 0700 tmp dirs are not) holding everything: the munge key,
  socket, seed and log; ``slurm.conf`` and ``gres.conf``; the controller's state, each slurmd's spool
  (``spool-<node>``), the pid files and the daemons' logs (``<daemon>.log``, written by the daemon, and
  ``<daemon>.out``, its stderr, where a start-up failure shows);
* munged with its own key and socket (``AuthInfo=socket=...`` in slurm.conf: the clients read it
  from there too, no munged listens on the default socket), slurmctld and slurmd on two free
  loopback ports, all three children of this process in sessions of their own (``-F`` / ``-D``),
  started in the folder (slurmstepd and slurmscriptd inherit it as their working folder);
* one node ``llmtrial-n1`` (not this machine's hostname: ``NodeAddr=127.0.0.1``,
  ``NodeHostname=<hostname>``, ``slurmd -N llmtrial-n1``; jobs see ``SLURMD_NODENAME=llmtrial-n1``)
  with this machine's topology as ``slurmd -C`` reports it, CPUs and cores consumable
  (``CR_Core``; memory is not, so a job needs no ``--mem``, but one asking more than
  ``RealMemory`` is refused), and one GPU declared without hardware (``Gres=gpu:1``, gres.conf
  ``Name=gpu File=/dev/null``): a job asking ``--gpus=1`` is scheduled once at a time and sees
  ``CUDA_VISIBLE_DEVICES=0``. One partition ``trials``, the default, ``OverSubscribe=NO``;
* no accounting: ``sacct`` fails ("Slurm accounting storage is disabled"), so the Snakemake
  plugin needs ``--slurm-status-command squeue`` (and its init delay at most MinJobAge / 3, or it
  falls back to sacct); ``KillWait=5`` (scancel sends SIGTERM to every process of the
  job, the batch shell's children too, and SIGKILL 5 s later), ``ProctrackType=proctrack/pgid``
  (a job's processes are its steps' process groups: as with the cgroups real clusters track jobs by,
  a process whose parent died is still the job's; proctrack/linuxproc follows parent pids, which an
  orphaned process no longer leads back to the job by, and with it the job step's snakemake outlived
  the cancelled job by over 180 s in 2 of 6 flake-hunt runs), ``MinJobAge=300`` (SLURM's default,
  above three times profiles/slurm's 20 s init delay): squeue (with ``-t all``, as
  :meth:`SlurmCluster.jobs` asks) still shows a finished job for 300 s to about 360 s (slurmctld
  purges once a minute), plain squeue not at all.

The Snakemake jobstep plugin drops ``SLURM_CONF`` before its inner ``srun``, so by default the
cluster also links ``/etc/slurm/slurm.conf`` and ``/etc/slurm/gres.conf`` to its own files; it
refuses (:class:`SlurmUnavailable`) when either exists and is not a link of a cluster of a live
process. Hence one cluster with links per machine at a time; ``link_etc=False`` makes one without
(its clients and jobs need ``SLURM_CONF``, which :meth:`SlurmCluster.env` sets and slurmd passes
on into every job step).

Jobs see the submitter's environment (sbatch exports it all), so ``SLURM_CONF`` is the cluster's,
and inside a step slurmd sets it again even where the caller dropped it; plus ``SLURMD_NODENAME``,
``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST`` and, with ``--gpus=1``, ``CUDA_VISIBLE_DEVICES=0``,
``SLURM_JOB_GPUS=0``. Two single-CPU jobs fit the node at once on a 2-core machine.

On exit, also when the body raised, it cancels every job, stops slurmd, slurmctld and munged
(SIGTERM, SIGKILL after 5 s), kills every other process whose command line, working folder or
``SLURM_CONF`` names the folder (slurmstepd, which ignores SIGTERM, a job's processes, a client left
running) with their descendants, removes its links and the folder, in about 0.3 s. On entry it
first removes what a crashed earlier run left: processes, links and folders naming a folder whose
pid is gone (:func:`clean_stale`). :func:`leftovers` says what of a cluster remains. Where pid 1
reaps no orphans (this container's does not), each job leaves a ``slurmstepd <defunct>`` zombie:
dead, holding nothing, ignored here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hosts import free_ports

PARENT = Path("/run")
PREFIX = "llmtrial-slurm-"
ETC = Path("/etc/slurm")
LINKED = ("slurm.conf", "gres.conf")
NODE = "llmtrial-n1"
PARTITION = "trials"
PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
POLICY = Path("/usr/sbin/policy-rc.d")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
KILL_WAIT = 5
MIN_JOB_AGE = 300
#: squeue's states of a job that is over (anything else is pending, running or on its way out).
FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                      "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
_FOLDER = re.compile(rf"^{PREFIX}(\d+)-")
_RUNS = itertools.count()


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the cluster (not root, apt failed, /etc/slurm held, a daemon failed)."""


def _clean_env() -> dict[str, str]:
    """os.environ without the variables of any SLURM (a job this process may run in, a client's defaults)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_"))}


@dataclass(frozen=True)
class SlurmNode:
    """A node of the test cluster: its SLURM name, the address slurmctld and the other nodes reach its slurmd
    at, and the argv prefix that runs a command on its host (``ip netns exec <ns>`` for a host of
    tests/hosts.py; none for this machine)."""

    name: str = NODE
    address: str = "127.0.0.1"
    via: tuple[str, ...] = ()


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: list[SlurmNode] = field(default_factory=lambda: [SlurmNode()])
    partition: str = PARTITION
    links: list[Path] = field(default_factory=list, repr=False)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    setup_s: float = 0.0
    teardown_s: float = 0.0

    @property
    def node(self) -> str:
        """The first node's name (the one node of the default cluster)."""
        return self.nodes[0].name

    @property
    def via(self) -> list[str]:
        """The argv prefix of the controller's host, where the clients run: the first node's."""
        return list(self.nodes[0].via)

    def env(self) -> dict[str, str]:
        """os.environ without inherited ``SLURM_*``/``SBATCH_*``/``SRUN_*``/``SALLOC_*``/``SQUEUE_*``
        variables, plus ``SLURM_CONF`` (the munge socket the clients read from the config)."""
        return {**_clean_env(), "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A SLURM client command (``sbatch ...``) with :meth:`env`; its output as text, unchecked."""
        return subprocess.run([*self.via, *argv], env=self.env(), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def jobs(self) -> list[dict[str, str]]:
        """squeue's rows (``-t all``): ``id``, ``state`` (RUNNING, PENDING, COMPLETED, ...), ``nodes``,
        ``reason`` (why it pends, e.g. Resources) and ``name``. A finished job stays MinJobAge (300 s)
        to about 360 s; jobs of every user and partition."""
        proc = self.run("squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%N|%r|%j")
        if proc.returncode != 0:
            raise RuntimeError(f"squeue failed: {proc.stderr.strip()}")
        keys = ("id", "state", "nodes", "reason", "name")
        return [dict(zip(keys, line.split("|", 4), strict=True)) for line in proc.stdout.splitlines() if line]

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until no job is pending, running or completing; TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while active := [j for j in self.jobs() if j["state"] not in FINISHED]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still active after {timeout} s: {active}")
            time.sleep(0.2)

    def job_processes(self, job_id: str, besides: Collection[int] = ()) -> list[psutil.Process]:
        """The live processes of this cluster's job ``job_id`` (by SLURM_JOB_ID and SLURM_CONF in their
        environment: what slurmd started for the job and what those started), but those in the process
        groups ``besides`` (a trial's servers: its cleanup's to stop, not SLURM's)."""
        found = []
        for proc in psutil.process_iter(["environ", "status"]):
            env = proc.info["environ"] or {}
            if (env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_CONF") == str(self.conf)
                    and proc.info["status"] != psutil.STATUS_ZOMBIE):
                with contextlib.suppress(ProcessLookupError):
                    if os.getpgid(proc.pid) not in besides:
                        found.append(proc)
        return found

    def log_tail(self, chars: int = 1500) -> str:
        """The end of each daemon's logs, for an error message."""
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            text = path.read_text(errors="replace").strip()
            if text:
                parts.append(f"--- {path.name}\n{text[-chars:]}")
        return "\n".join(parts)


def _processes(match: Callable[[str], bool]) -> list[psutil.Process]:
    """Live processes whose command line, working folder or SLURM_CONF ``match`` accepts, with their
    descendants; never this process or its ancestors."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline", "cwd", "status", "environ"]):
        info = proc.info
        if proc.pid in mine or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        text = "\0".join([*(info["cmdline"] or []), info["cwd"] or "", (info["environ"] or {}).get("SLURM_CONF", "")])
        if match(text):
            found[proc.pid] = proc
            with contextlib.suppress(psutil.Error):
                found.update({c.pid: c for c in proc.children(recursive=True)})
    return [p for pid, p in found.items() if pid not in mine]


def _kill(procs: list[psutil.Process], grace: float = 1.0) -> None:
    """SIGTERM ``procs``, SIGKILL those left after ``grace`` seconds (slurmstepd ignores SIGTERM). A
    zombie counts as gone: pid 1 may never reap the orphans (slurmstepd and its jobs' processes)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        deadline = time.monotonic() + wait
        while (procs := [p for p in procs if _alive_proc(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not procs:
            return


def _naming(folder: Path) -> Callable[[str], bool]:
    return lambda text: str(folder) in text


def _link_owner(link: Path, parent: Path = PARENT) -> int | None:
    """The pid in the name of the cluster folder under ``parent`` that ``link`` points into; None for
    anything else (no link, a link elsewhere)."""
    if not link.is_symlink():
        return None
    m = re.match(rf"^{re.escape(str(parent))}/{PREFIX}(\d+)-", os.readlink(link))
    return int(m.group(1)) if m else None


def stale_link(link: Path, parent: Path = PARENT) -> bool:
    """Whether ``link`` is a link of a cluster of this module whose process is gone (or whose folder is)."""
    owner = _link_owner(link, parent)
    return owner is not None and (not psutil.pid_exists(owner) or not link.exists())


def clean_stale(parent: Path = PARENT, etc: Path = ETC) -> list[str]:
    """Remove what clusters of processes that are gone left: processes naming their folders, their
    links in ``etc``, their folders under ``parent``. Returns what it removed."""
    pattern = re.compile(rf"{re.escape(str(parent))}/{PREFIX}(\d+)-")
    procs = _processes(lambda text: any(not psutil.pid_exists(int(pid)) for pid in pattern.findall(text)))
    _kill(procs)
    removed = [f"process {p.pid}" for p in procs]
    for name in LINKED:
        if stale_link(etc / name, parent):
            (etc / name).unlink(missing_ok=True)
            removed.append(str(etc / name))
    for folder in parent.glob(f"{PREFIX}*"):
        m = _FOLDER.match(folder.name)
        if m and folder.is_dir() and not psutil.pid_exists(int(m.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def leftovers(root: Path) -> list[str]:
    """What remains of the cluster in ``root``: live processes naming it, /etc/slurm links into it, the folder."""
    left = [f"process {p.pid} {' '.join(p.cmdline())}" for p in _processes(_naming(root)) if _alive_proc(p)]
    left += [str(ETC / n) for n in LINKED if (ETC / n).is_symlink() and os.readlink(ETC / n).startswith(f"{root}/")]
    return left + ([str(root)] if root.exists() else [])


def _alive_proc(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


def _daemon_pids() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in DAEMONS}


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", *args], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdin=subprocess.DEVNULL)


def _missing() -> list[str]:
    return [b for b in BINARIES if not shutil.which(b, path=SEARCH_PATH)]


def ensure_installed() -> None:
    """Install Debian's SLURM and munge when a binary is missing, without starting their services
    (and killing any such daemon the install started anyway); SlurmUnavailable when that fails."""
    missing = _missing()
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"SLURM is not installed ({', '.join(missing)} missing) and installing it needs root")
    before = _daemon_pids()
    made_policy = not POLICY.exists()
    if made_policy:
        POLICY.write_text("#!/bin/sh\n# llmtrial tests: no service starts while installing SLURM\nexit 101\n")
        POLICY.chmod(0o755)
    try:
        proc = _apt("install", "-y", "--no-install-recommends", *PACKAGES)
        if proc.returncode != 0:
            _apt("update")
            proc = _apt("install", "-y", "--no-install-recommends", *PACKAGES)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmUnavailable(f"apt-get could not install {' '.join(PACKAGES)}: {exc}") from exc
    finally:
        if made_policy:
            POLICY.unlink(missing_ok=True)
        _kill([psutil.Process(pid) for pid in _daemon_pids() - before if psutil.pid_exists(pid)])
    if proc.returncode != 0 or _missing():
        raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {(proc.stdout + proc.stderr)[-1500:]}")


def _topology() -> str:
    """This machine's node line from ``slurmd -C``, without its name and uptime."""
    proc = subprocess.run([shutil.which("slurmd", path=SEARCH_PATH) or "slurmd", "-C"], capture_output=True,
                          text=True, timeout=30, env=_clean_env())
    if proc.returncode != 0 or not proc.stdout.startswith("NodeName="):
        raise SlurmUnavailable(f"slurmd -C failed: {proc.stderr.strip()}")
    keys = ("Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "CPUs", "RealMemory")
    fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
    return " ".join(f"{k}={fields[k]}" for k in keys if k in fields)


def _write_config(c: SlurmCluster) -> None:
    host = socket.gethostname().split(".")[0]
    ctld_port, slurmd_port = free_ports(2)
    (c.root / "state").mkdir()
    for node in c.nodes:
        (c.root / f"spool-{node.name}").mkdir()
    (c.root / "plugstack.conf").write_text("")  # none of /etc/slurm/plugstack.conf's plugins
    (c.root / "gres.conf").write_text("AutoDetect=off\nName=gpu File=/dev/null\n")
    names = ",".join(node.name for node in c.nodes)
    c.conf.write_text("\n".join([
        "ClusterName=llmtrial", f"SlurmctldHost={host}({c.nodes[0].address})", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={c.root / 'munge.socket'}",
        # %n: each slurmd's node name (several slurmd on this machine, each in its host's namespace)
        f"StateSaveLocation={c.root / 'state'}", f"SlurmdSpoolDir={c.root / 'spool-%n'}",
        f"SlurmctldPidFile={c.root / 'slurmctld.pid'}", f"SlurmdPidFile={c.root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={c.root / 'slurmctld.log'}", f"SlurmdLogFile={c.root / 'slurmd-%n.log'}",
        f"PlugStackConfig={c.root / 'plugstack.conf'}", "MailProg=/bin/true",
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        # ReturnToService=1: a node set DOWN by `scontrol update` stays down until `state=resume` (one that stopped
        # responding comes back when its slurmd registers again); with 2 it came back at its slurmd's next registration
        "JobCompType=jobcomp/none", "ReturnToService=1", f"MinJobAge={MIN_JOB_AGE}", f"KillWait={KILL_WAIT}",
        "InactiveLimit=0", "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=1,bf_interval=1",
        "GresTypes=gpu",
        *(f"NodeName={node.name} NodeAddr={node.address} NodeHostname={host} {_topology()} Gres=gpu:1 State=UNKNOWN"
          for node in c.nodes),
        f"PartitionName={c.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
        "",
    ]))


def _link_etc(c: SlurmCluster) -> None:
    """Link /etc/slurm/{slurm,gres}.conf to the cluster's; SlurmUnavailable when one is held."""
    ETC.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = ETC / name
        if stale_link(link):
            link.unlink(missing_ok=True)
        try:
            link.symlink_to(c.root / name)
        except FileExistsError:
            owner = _link_owner(link)
            held = f"a link of the SLURM test cluster of process {owner}" if owner else "not a link of this helper"
            raise SlurmUnavailable(f"{link} exists ({held}): one SLURM test cluster with /etc/slurm links "
                                   "per machine at a time") from None
        c.links.append(link)


def _popen(c: SlurmCluster, name: str, argv: list[str], via: tuple[str, ...] = ()) -> None:
    """Start daemon ``name`` (``via``: on that host; ``ip netns exec`` execs it, keeping the pid)."""
    with open(c.root / f"{name}.out", "ab") as out:
        c.daemons[name] = subprocess.Popen([*via, *argv], cwd=c.root, env=c.env(), stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(c: SlurmCluster, what: str, ready: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [f"{n} exited {p.returncode}" for n, p in c.daemons.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = ", ".join(dead) or f"not within {timeout} s"
            raise SlurmUnavailable(f"SLURM test cluster in {c.root}: {what}: {why}\n{c.log_tail()}")
        time.sleep(0.1)


def _nodes_idle(c: SlurmCluster) -> bool:
    names = ",".join(node.name for node in c.nodes)
    with contextlib.suppress(subprocess.TimeoutExpired):
        return c.run("sinfo", "-h", "-N", "-n", names, "-o", "%T", timeout=10).stdout.split() == ["idle"] * len(c.nodes)
    return False


def _start(c: SlurmCluster) -> None:
    sbin = {b: shutil.which(b, path=SEARCH_PATH) or b for b in ("munged", "slurmctld", "slurmd")}
    key = c.root / "munge.key"
    with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(128))
    _popen(c, "munged", [sbin["munged"], "-F", "--key-file", str(key), "--socket", str(c.root / "munge.socket"),
                         "--pid-file", str(c.root / "munged.pid"), "--log-file", str(c.root / "munged.log"),
                         "--seed-file", str(c.root / "munged.seed")])
    _wait(c, "munged made no socket", (c.root / "munge.socket").exists)
    _popen(c, "slurmctld", [sbin["slurmctld"], "-D", "-f", str(c.conf)], c.nodes[0].via)
    for node in c.nodes:
        _popen(c, f"slurmd-{node.name}", [sbin["slurmd"], "-D", "-f", str(c.conf), "-N", node.name], node.via)
    _wait(c, f"node(s) {', '.join(n.name for n in c.nodes)} not idle", lambda: _nodes_idle(c))


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, KILL_WAIT), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


def _teardown(c: SlurmCluster) -> None:
    ctld = c.daemons.get("slurmctld")
    if ctld is not None and ctld.poll() is None:
        with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError, TimeoutError):
            c.run("scancel", f"--partition={c.partition}", timeout=15)
            c.wait_idle(timeout=KILL_WAIT + 10)
    for name in (*(f"slurmd-{node.name}" for node in c.nodes), "slurmctld", "munged"):
        _stop(c.daemons.get(name))
    _kill(_processes(_naming(c.root)))
    for link in c.links:
        if link.is_symlink() and os.readlink(link).startswith(f"{c.root}/"):
            link.unlink(missing_ok=True)
    shutil.rmtree(c.root, ignore_errors=True)


@contextlib.contextmanager
def slurm_cluster(nodes: Sequence[SlurmNode] = (SlurmNode(),), partition: str = PARTITION,
                  link_etc: bool = True) -> Iterator[SlurmCluster]:
    """A SLURM of ``nodes`` (default one, ``llmtrial-n1`` on this machine's loopback) in partition
    ``partition``, removed on exit; the controller runs on the first node's host. ``link_etc`` links
    /etc/slurm's slurm.conf and gres.conf to its own. Raises :class:`SlurmUnavailable` (with the
    daemons' logs) when it cannot be installed or brought up."""
    started = time.monotonic()
    if os.geteuid() != 0:
        raise SlurmUnavailable("the SLURM test cluster needs root (SlurmUser=root, /etc/slurm links)")
    ensure_installed()
    clean_stale()
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{next(_RUNS)}-", dir=PARENT))
    root.chmod(0o755)
    cluster = SlurmCluster(root=root, conf=root / "slurm.conf", nodes=list(nodes), partition=partition)
    try:
        _write_config(cluster)
        if link_etc:
            _link_etc(cluster)
        _start(cluster)
        cluster.setup_s = time.monotonic() - started
        yield cluster
    finally:
        stopping = time.monotonic()
        _teardown(cluster)
        cluster.teardown_s = time.monotonic() - stopping
