"""The host's other services: quiet them before a trial, give them back after it.

A service has a kind (how to ask whether it runs, stop it and start it) and a health
check (how to tell that it really answers). Every command is an argv list; nothing goes
through a shell. A service's state has three answers: ``running``, ``stopped`` and
``unknown``. Unknown is a status command that cannot run (not found, permission denied,
a timeout), one that exits with a code its tool documents as an error (a daemon that does
not answer, no such unit or container), or a status that says stopped while the health
check answers. The quiet stage reads every service first and stops none when one is
unknown (:class:`ServiceStateUnknown` names it and quotes what was seen).

Quieting writes each service's state to the trial ledger *before* stopping it, so a
restore needs nothing but the ledger: only a service that was running is stopped, and
each stop still outstanding (from this run or an earlier one) is undone by a start that
names it. What does not come back running and healthy is a residue with what was tried
and what was seen.

Kinds: ``systemd`` (systemctl), ``docker`` (a container), ``supervisor`` (a
supervisorctl program) and ``command`` (argv lists of your own; an element ``{python}``
is the interpreter running the trial, or the node's Python on another node). Health
checks: ``http`` (URL and expected status), ``tcp`` (host and port), ``command`` (exit
status 0) and ``completion`` (a short completion against an OpenAI-compatible endpoint).

A service may live on another node of the trial (its ``node`` key; default the trial's
first node, or this host when the trial lists none): :func:`services_on_nodes` gives each
entry the node's ``reach``, and then its status, stop and start commands run on that node
(:meth:`llmtrial.host.nodes.Node.run`) and its health check is made from that node, by
:mod:`llmtrial.onnode.service_health` run with the node's Python (so a URL such as
``http://127.0.0.1:8190/health`` means the node's own loopback). The ``service_quiet``
entry names the node and carries its reach, so a restore rebuilds the node from the ledger.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.cleanup_model import CleanupRecord, HostService, QuietedService, QuietGpu, QuietRecord, RestoredService
from llmtrial.core.ledger import Action, Entry, Ledger, replay
from llmtrial.core.paths import TrialPaths
from llmtrial.core.record_base import HeldGpu, Residue
from llmtrial.core.trial_config import HealthBlock, ServiceBlock, TrialConfig
from llmtrial.host.gpus import held_gpus
from llmtrial.host.nodes import Node, NodeError, all_nodes, local_node, unavailable
from llmtrial.host.telemetry_sources import NvmlSource
from llmtrial.onnode import service_health

log = logging.getLogger(__name__)

Runner = Callable[..., subprocess.CompletedProcess[str]]

RUNNING, STOPPED, UNKNOWN = "running", "stopped", "unknown"
#: An argv element that stands for the interpreter running the trial (sys.executable), so a
#: service command does not depend on which python3 is first on PATH.
PYTHON_PLACEHOLDER = "{python}"

# Exit codes of each kind's status command, from its tool's documentation:
# - `systemctl is-active UNIT` (systemctl(1), "Exit status", LSB): 0 the unit is active; 3 it
#   is not active (prints inactive or failed; activating/deactivating are also 3, and are
#   not "stopped"); 4 no such unit; 1 and others: systemctl failed (no systemd, no bus).
SYSTEMD_STOPPED_WORDS = ("inactive", "failed")
# - `docker inspect --format {{.State.Running}} NAME`: exit 0 prints true or false; non-zero
#   for "No such object" (the container the config names is missing) or "Cannot connect to
#   the Docker daemon": both unknown.
# - `supervisorctl status NAME` (supervisor 4.x supervisorctl.do_status, LSBStatusExitStatuses):
#   0 for a state outside STOPPED_STATES (RUNNING, and STARTING/BACKOFF/STOPPING, which are
#   in transition), 3 (NOT_RUNNING) for STOPPED, EXITED, FATAL or UNKNOWN, 4 (UNKNOWN) for
#   no such process and for a supervisord that does not answer ("... no such file",
#   "... refused connection").
SUPERVISOR_STOPPED_WORDS = ("STOPPED", "EXITED", "FATAL")
# - kind command: exit 0 is running; `stopped_exit_codes` (default [3], the LSB "program is
#   not running" status) are stopped; anything else is unknown.


#: Seconds a node's health program may take beyond the probe's own timeout.
HEALTH_ANSWER_S = 30.0

class ServiceStateUnknown(RuntimeError):
    """A service's state cannot be read: the quiet stage stops before it changes anything."""


def run_argv(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one command (argv list, no shell), capturing its output."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def call(runner: Runner, argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run ``argv``: (exit code, or None when it could not run or timed out; its output;
    what was seen, quoted for a record)."""
    shown = " ".join(argv)
    try:
        out = runner(argv, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", f"`{shown}` timed out after {timeout:g} s"
    except OSError as exc:  # FileNotFoundError, PermissionError, ...
        return None, "", f"`{shown}` could not run: {type(exc).__name__}: {exc}"
    except NodeError as exc:  # on another node: timed out, or ssh could not start
        return None, "", f"`{shown}` did not run: {exc}"
    text = " ".join(((out.stdout or "") + " " + (out.stderr or "")).split())
    return out.returncode, text, f"`{shown}` exited {out.returncode}" + (f": {text[-300:]}" if text else "")


def resolve_argv(argv: list[Any], python: str | None = None) -> list[str]:
    """The argv with each ``{python}`` element replaced by ``python`` (default this
    interpreter; on another node, the node's), never through a shell."""
    return [(python or sys.executable) if str(a) == PYTHON_PLACEHOLDER else str(a) for a in argv]


@dataclass
class Service:
    """One service as the trial config describes it (:meth:`from_config`: its defaults are the model's)."""

    name: str
    kind: str
    target: str  # systemd unit, docker container or supervisor program
    supervisor_config: str | None  # supervisorctl -c FILE
    status_argv: list[str]  # kind command
    stop_argv: list[str]
    start_argv: list[str]
    stopped_exit_codes: list[int]
    health: HealthBlock  # its argv resolved
    stop_timeout_s: float
    start_timeout_s: float
    health_timeout_s: float
    node: Node | None  # another node of the trial (None: this host, as the trial's first node)
    gpus: list[str]  # the GPUs it runs on (NVML indexes or UUIDs)
    start_on_failed_gpu: bool  # restore it even onto a GPU that failed its health check

    @property
    def has_health(self) -> bool:
        return self.health.kind is not None

    @classmethod
    def from_config(cls, name: str, entry: ServiceBlock | Mapping[str, Any]) -> Service:
        """The service of a config entry (its model, or its mapping read as the model), or of a ledger
        entry's ``service`` (its name and ``reach`` set aside: with ``reach``, from :func:`services_on_nodes`,
        on the node it describes)."""
        reach = entry.get("reach") if isinstance(entry, Mapping) else None
        block = entry if isinstance(entry, ServiceBlock) else ServiceBlock.model_validate(
            {k: v for k, v in entry.items() if k not in ("name", "reach")})
        node = Node.from_reach(str(block.node), reach) if reach else None
        python = node.python if node is not None and not node.is_local else None
        health = block.health.model_copy(update={"argv": resolve_argv(block.health.argv, python)})
        return cls(
            name=name, kind=block.kind, target=block.target or name, supervisor_config=block.supervisor_config,
            status_argv=resolve_argv(block.status, python), stop_argv=resolve_argv(block.stop, python),
            start_argv=resolve_argv(block.start, python), stopped_exit_codes=list(block.stopped_exit_codes),
            health=health, stop_timeout_s=float(block.timeouts.stop_s), start_timeout_s=float(block.timeouts.start_s),
            health_timeout_s=float(block.timeouts.health_s), node=node, gpus=[str(g) for g in block.gpus],
            start_on_failed_gpu=block.start_on_failed_gpu,
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name, "kind": self.kind, "target": self.target, "supervisor_config": self.supervisor_config,
            "status": self.status_argv, "stop": self.stop_argv, "start": self.start_argv,
            "stopped_exit_codes": self.stopped_exit_codes, "health": self.health.model_dump(),
            "timeouts": {"stop_s": self.stop_timeout_s, "start_s": self.start_timeout_s, "health_s": self.health_timeout_s},
            "gpus": self.gpus, "start_on_failed_gpu": self.start_on_failed_gpu,
        }
        return {**out, **self.where()}

    def named(self) -> dict[str, Any]:
        """``node``, the name of its node, for a record or a ledger entry ({} on this host)."""
        return {"node": self.node.name} if self.node is not None else {}

    def where(self) -> dict[str, Any]:
        """The ledger's ``node`` and ``reach`` of a service on a node ({} on this host)."""
        return {**self.named(), "reach": self.node.describe()} if self.node is not None else {}

    def runner(self, runner: Runner) -> Runner:
        """How its commands run: ``runner`` on this host, :meth:`Node.run` on its node."""
        node = self.node
        if node is None:
            return runner
        return lambda argv, timeout: node.run(argv, timeout)

    # the commands of each kind ----------------------------------------------------------
    def _supervisorctl(self, *args: str) -> list[str]:
        cfg = ["-c", self.supervisor_config] if self.supervisor_config else []
        return ["supervisorctl", *cfg, *args]

    def argv(self, action: str) -> list[str]:
        """The argv for ``status``, ``stop`` or ``start``."""
        if self.kind == "systemd":
            return {"status": ["systemctl", "is-active", self.target],
                    "stop": ["systemctl", "stop", self.target],
                    "start": ["systemctl", "start", self.target]}[action]
        if self.kind == "docker":
            return {"status": ["docker", "inspect", "--format", "{{.State.Running}}", self.target],
                    "stop": ["docker", "stop", "--time", str(int(self.stop_timeout_s)), self.target],
                    "start": ["docker", "start", self.target]}[action]
        if self.kind == "supervisor":
            return self._supervisorctl(action, self.target)
        if self.kind == "command":
            chosen = {"status": self.status_argv, "stop": self.stop_argv, "start": self.start_argv}[action]
            if not chosen:
                raise ValueError(f"service {self.name}: kind command needs a {action!r} argv list")
            return list(chosen)
        raise ValueError(f"service {self.name}: unknown kind {self.kind!r}")

    def state(self, runner: Runner = run_argv) -> tuple[str, str]:
        """``(running | stopped | unknown, what was seen)`` from the kind's status command."""
        code, output, seen = call(self.runner(runner), self.argv("status"), timeout=30)
        return _read_status(self.kind, code, output, self.stopped_exit_codes), seen

    def is_running(self, runner: Runner = run_argv) -> bool:
        return self.state(runner)[0] == RUNNING


def _read_status(kind: str, code: int | None, output: str, stopped_codes: list[int]) -> str:
    """One kind's status exit code and output as running, stopped or unknown (see the table above)."""
    if code is None:
        return UNKNOWN
    words = output.split()
    if kind == "systemd":
        if code == 0:
            return RUNNING
        return STOPPED if code == 3 and words[:1] and words[0] in SYSTEMD_STOPPED_WORDS else UNKNOWN
    if kind == "docker":
        if code != 0 or len(words) != 1:
            return UNKNOWN
        return {"true": RUNNING, "false": STOPPED}.get(words[0], UNKNOWN)
    if kind == "supervisor":
        word = words[1] if len(words) > 1 else ""
        if code == 0 and word == "RUNNING":
            return RUNNING
        return STOPPED if code == 3 and word in SUPERVISOR_STOPPED_WORDS else UNKNOWN
    if code == 0:
        return RUNNING
    return STOPPED if code in stopped_codes else UNKNOWN


def observe(service: Service, runner: Runner = run_argv) -> tuple[str, str]:
    """The service's state checked against its health check: a status that says stopped while
    the health check answers is unknown (one of the two is wrong)."""
    state, seen = service.state(runner)
    if state == STOPPED and service.has_health:
        ok, health_seen = healthy(service, timeout=5.0)
        if ok:
            return UNKNOWN, f"{seen}, which reads as stopped; yet the health check answers: {health_seen}"
    return state, seen


def healthy(service: Service, timeout: float = 5.0) -> tuple[bool, str]:
    """One health probe, made from the service's node (this host without one): (answered
    as expected, what was seen)."""
    h = service.health
    if h.kind is None:
        return True, "no health check configured"
    if h.kind == "command":
        code, output, seen = call(service.runner(run_argv), list(h.argv), timeout=timeout)
        return code == 0, f"exit {code}: {output[-200:]}" if code is not None else seen
    node = service.node or local_node()
    try:
        within = max(timeout, float(h.timeout_s)) + HEALTH_ANSWER_S
        answer = service_health.HealthAnswer(**node.program(service_health, {"health": h.model_dump(), "timeout": timeout},
                                                      within))
    except (NodeError, TypeError) as exc:
        return False, f"the health check could not run: {exc}"
    return answer.ok, answer.seen


def _wait(predicate: Callable[[], tuple[bool, str]], timeout: float, poll: float = 0.5) -> tuple[bool, str, float]:
    t0 = time.monotonic()
    ok, seen = predicate()
    while not ok and time.monotonic() - t0 < timeout:
        time.sleep(poll)
        ok, seen = predicate()
    return ok, seen, time.monotonic() - t0


@dataclass
class Quieted:
    """What :func:`quiet` did: per service its state before and what was done, the services that
    would not stop, and when it ended."""

    services: list[QuietedService]
    residues: list[Residue]
    quieted_at: float


def quiet(services: list[Service], ledger: Ledger, runner: Runner = run_argv) -> Quieted:
    """Read every service's state, then stop each running one, ledger first, and wait until
    it is really down. When any state is unknown, stop nothing and raise
    :class:`ServiceStateUnknown` naming each such service and quoting what was seen.

    Returns per service its state before, what was done, when, and how long it took to go
    down; residues for a service that would not.
    """
    seen = [(svc, *observe(svc, runner)) for svc in services]
    unknown = [f"service {svc.name} ({svc.kind}): state unknown: {what}" for svc, state, what in seen if state == UNKNOWN]
    if unknown:
        raise ServiceStateUnknown("the quiet stage changed nothing, because it cannot tell whether a service runs: "
                                  + "; ".join(unknown) + ". Fix the status command or the service, then run again.")
    items: list[QuietedService] = []
    residues: list[Residue] = []
    for svc, state, what in seen:
        was_running = state == RUNNING
        entry = ledger.append(Action.SERVICE_QUIET, service=svc.to_json(), was_running=was_running, state_seen=what,
                              **svc.where())
        head = {"name": svc.name, "kind": svc.kind, "was_running": was_running, "state_seen": what, **svc.named()}
        if not was_running:
            items.append(QuietedService(**head, action="left stopped (was not running)"))
            continue
        stopped_at = time.time()
        code, _, stop_seen = call(svc.runner(runner), svc.argv("stop"), timeout=svc.stop_timeout_s)
        down, down_seen, took = _wait(lambda svc=svc: _down(svc, runner), svc.stop_timeout_s)
        if not down:
            residues.append(Residue(kind="service", what=svc.name, tried=" ".join(svc.argv("stop")),
                                    seen=f"still up after {svc.stop_timeout_s:g} s: {down_seen} ({stop_seen})",
                                    **svc.named()))
        ledger.append(Action.SERVICE_STOPPED, name=svc.name, down=down, quiet=entry.id,
                      **svc.named())
        if down:
            log.info("quieted %s: stopped, down after %.1f s", svc.name, took)
        else:
            log.warning("quieted %s: stop tried, still up after %g s: %s", svc.name, svc.stop_timeout_s, down_seen)
        items.append(QuietedService(**head, stopped_at=stopped_at, action="stopped", stop_exit=code,
                                    down_after_s=round(took, 3), seen=down_seen))
    return Quieted(items, residues, time.time())


def _down(svc: Service, runner: Runner) -> tuple[bool, str]:
    state, seen = svc.state(runner)
    ok, health_seen = healthy(svc, timeout=2.0) if svc.has_health else (False, "no health check")
    return (state == STOPPED and not (svc.has_health and ok)), f"state {state} ({seen}); health: {health_seen}"


def _up(svc: Service, runner: Runner) -> tuple[bool, str]:
    """Running by its status command, and healthy when it has a health check."""
    state, seen = svc.state(runner)
    ok, health_seen = healthy(svc) if svc.has_health else (True, "no health check")
    return state == RUNNING and ok, f"state {state} ({seen}); health: {health_seen}"


def outstanding_stops(entries: list[Entry]) -> dict[str, Entry]:
    """The ``service_quiet`` entries of services stopped and not started again since, by id
    (:func:`llmtrial.core.ledger.replay`)."""
    return replay(entries).outstanding["services"]


@dataclass
class Restored:
    """What :func:`restore` did: each service it started again (or held back), and the residues."""

    services: list[RestoredService]
    residues: list[Residue]


def restore(entries: list[Entry], ledger: Ledger, runner: Runner = run_argv,
            held: Sequence[HeldGpu] = ()) -> Restored:
    """Undo, in reverse order, every stop still outstanding in the ledger (of any run): start
    the service unless it runs, then wait until it runs and answers its health check. Each
    restart names the stop it undoes. A service that runs on a GPU ``held`` as failed
    (:func:`llmtrial.host.gpus.recheck_failed`) is not started onto it unless its
    ``start_on_failed_gpu`` says so: it stays stopped, a residue naming the GPU. Idempotent:
    a second call finds nothing to do."""
    done = Restored([], [])
    for quiet_id, entry in reversed(list(outstanding_stops(entries).items())):
        svc = Service.from_config(entry.service["name"], entry.service)
        head = {"name": svc.name, "kind": svc.kind, "run": entry.run, "quiet": quiet_id, "started_at": time.time(),
                **svc.named()}
        failed = _failed_gpu(svc, held)
        if failed is not None:
            done.services.append(RestoredService(**head, healthy=False, held_by_gpu=failed.gpu, health_seen="not started"))
            done.residues.append(_held_back(svc, failed))
            continue
        lost = unavailable(svc.node) if svc.node is not None else None
        if lost is not None:  # its node is down: nothing to start there, nor to wait for
            done.services.append(RestoredService(**head, healthy=False, health_seen=f"not started: {lost}"))
            done.residues.append(Residue(kind="service", what=svc.name, tried=f"start it on node {svc.node.name}",
                                         seen=lost, **svc.named()))
            continue
        state, seen = svc.state(runner)
        started = {}
        if state != RUNNING:
            started["start_exit"], _, started["start_seen"] = call(svc.runner(runner), svc.argv("start"),
                                                                   timeout=svc.start_timeout_s)
        ok, seen_after, took = _wait(lambda svc=svc: _up(svc, runner), svc.health_timeout_s)
        done.services.append(RestoredService(**head, state_before=f"{state} ({seen})", **started, healthy=ok,
                                             health_seen=seen_after, healthy_after_s=round(took, 3)))
        if ok:
            ledger.append(Action.SERVICE_RESTORED, name=svc.name, undoes=quiet_id, healthy_after_s=round(took, 3),
                          **svc.named())
        else:
            done.residues.append(Residue(kind="service", what=svc.name, tried=" ".join(svc.argv("start")),
                                         seen=f"not running and healthy after {svc.health_timeout_s:g} s: {seen_after}",
                                         **svc.named()))
        log.info("restored %s: healthy=%s (%s)", svc.name, ok, seen_after)
    return done


def _failed_gpu(svc: Service, held: Sequence[HeldGpu]) -> HeldGpu | None:
    """The failed GPU ``svc`` runs on, unless its ``start_on_failed_gpu`` lets it start there anyway."""
    failed = next(iter(held_gpus(svc.gpus, held)), None)
    return None if svc.start_on_failed_gpu else failed


def _held_back(svc: Service, failed: HeldGpu) -> Residue:
    """The residue of a service kept stopped because the GPU it runs on failed."""
    return Residue(kind="service", what=svc.name, tried="not started: it runs on a GPU that failed its health check",
                   seen=f"GPU {failed.gpu} failed its health check after {failed.label} failed ({failed.evidence}); "
                        f"start it once the GPU is sound (`snakemake cleanup` checks the GPU again), or set "
                        f"services.{svc.name}.start_on_failed_gpu", **svc.named())


def check_running(quiet_ids: list[str], entries: list[Entry], runner: Runner = run_argv) -> list[HostService]:
    """Read, from the host now, whether each service whose ``service_quiet`` entry is named
    runs and answers its health check: what cleanup's "restored" rests on."""
    by_id = {e.id: e for e in entries if e.action == Action.SERVICE_QUIET}
    out = []
    for quiet_id in quiet_ids:
        entry = by_id[quiet_id]
        svc = Service.from_config(entry.service["name"], entry.service)
        ok, seen = _up(svc, runner)
        out.append(HostService(name=svc.name, run=entry.run, quiet=quiet_id, running_and_healthy=ok, seen=seen))
    return out


# --------------------------------------------------------------------------- the quiet stage


def services_on_nodes(trial: TrialConfig) -> dict[str, Any]:
    """The trial's ``services`` as the quiet and configuration rules pass them (plain data), each
    entry with the ``reach`` of its node (its ``node`` key, default the trial's first node):
    :class:`Service` then runs its commands and health check there. A trial that lists no
    nodes gets its services as they are (on this host)."""
    if not trial.nodes:
        return {name: block.model_dump() for name, block in trial.services.items()}
    nodes = all_nodes(trial)
    first = next(iter(nodes))
    out = {}
    for name, block in trial.services.items():
        node = nodes[block.node or first]
        out[name] = {**block.model_dump(), "node": node.name, "reach": node.describe()}
    return out


def gpu_snapshot(nvml: Any | None = None) -> dict[str, Any] | None:
    """GPU memory in use and the compute processes on each GPU, or None without NVML."""
    source = NvmlSource(nvml)
    if not source.available:
        return None
    try:
        sample = source.sample()
    finally:
        source.close()
    used = sum(v for k, v in sample.items() if k.endswith(".mem_used_bytes"))
    procs = {k.split(".")[0]: v for k, v in sample.items() if k.endswith(".processes")}
    return {"mem_used_bytes": used, "compute_processes": procs}


def quiet_host(results_dir: Path, services: Mapping[str, Any], *,
               restored_first: CleanupRecord | Mapping[str, Any] | None = None,
               nvml: Any | None = None, runner: Runner = run_argv) -> QuietRecord:
    """The quiet stage: read every configured service's state and stop each that runs (ledger
    first), and on a GPU host record the GPU memory and compute processes before and after,
    and the memory freed. A service whose state is unknown stops the stage before anything is
    stopped (:class:`ServiceStateUnknown`). ``restored_first`` is the record of the cleanup
    that gave back what an earlier run left (:func:`llmtrial.lifecycle.cleanup.restore_first`)."""
    ledger = Ledger(TrialPaths(Path(results_dir)).ledger)
    before = gpu_snapshot(nvml)
    quieted = quiet([Service.from_config(name, entry) for name, entry in services.items()], ledger, runner)
    after = gpu_snapshot(nvml)
    gpu = None if before is None or after is None else QuietGpu(
        before=before, after=after, memory_freed_bytes=before["mem_used_bytes"] - after["mem_used_bytes"])
    return QuietRecord(restored_first=restored_first, services=quieted.services, residues=quieted.residues,
                       quieted_at=quieted.quieted_at, gpu=gpu)


def quiet_needed(results_dir: Path, services: Mapping[str, Any]) -> str | None:
    """Before a configuration job launches its server: why the host must be quieted (again),
    or None. A configuration rerun on its own (a new run) quiets it again; changes an earlier
    run left open (a crash) call for a restore first, then a quiet."""
    ledger = Ledger(TrialPaths(Path(results_dir)).ledger)
    entries = ledger.entries()
    state = replay(entries)
    left = [e for kind in state.outstanding if kind != "weights" for e in state.open(kind) if e.run != ledger.run]
    quieted = any(e.action == Action.SERVICE_QUIET and e.run == ledger.run for e in entries)
    if left:
        return "an earlier run left it changed"
    if services and not quieted:
        return "a new run"
    return None
