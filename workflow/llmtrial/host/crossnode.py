"""Preflight across the nodes of a configuration: what each node has, and whether they agree.

:func:`node_facts` runs one small program with the node's own Python (argv, the program text
after ``-c``, its inputs as JSON on stdin: nothing from the trial file passes through a
shell) and returns what the nodes must agree on: Python, vLLM, torch, Ray and NCCL versions,
the interface named in the node's config with its IPv4 addresses and whether the master
address is reachable from it, the size of ``/dev/shm``, and processes of an earlier trial
(vLLM servers, Ray daemons and workers, llmtrial's own ranks) that would hold ports, shared
memory or GPUs, and the GPUs NVML lists there. Nothing is killed here.

:func:`cross_checks` is a pure function of those facts, with checks shaped as the
single-host preflight's (:func:`llmtrial.host.checks.check`); :func:`select_node_gpus` selects, where the
trial counts GPUs per node, each node's count among that node's own GPUs; :func:`same_files` compares the
staged model files' hashes across nodes; :func:`preflight_nodes` gathers the facts of every
node in parallel and returns the record (:class:`llmtrial.core.preflight_model.CrossNode`).

Seed 000 is why each check exists: Ray refused a worker on Python 3.12.13 next to a head on
3.12.3, NCCL had to be pinned to the 200G interface, ``/dev/shm`` had to be remounted larger
before Ray started, and stale Ray nodes of failed attempts had to be force-stopped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llmtrial.core.preflight_model import CrossNode, Gpus, Master, NodeReport
from llmtrial.core.record_base import Check, RecordModel
from llmtrial.core.units import GiB
from llmtrial.host.checks import MIN_SHM_BYTES, check
from llmtrial.host.gpus import SelectionError, select
from llmtrial.host.nodes import Node, NodeError
from llmtrial.onnode import node_facts as onnode_facts

__all__ = ["STALE_MARKERS", "node_facts", "cross_checks", "select_node_gpus", "same_files", "preflight_nodes"]

#: Substrings of a command line that mark a process of an earlier trial, with what it is.
#: They reach the node on stdin, never in the program's argv, so the fact program and the
#: ssh client that carries it never match them.
STALE_MARKERS: dict[str, str] = {
    "vllm.entrypoints": "vLLM server",
    "vllm serve": "vLLM server",
    "llmtrial.onnode.headless_serve": "vLLM headless rank",
    "ray::": "Ray worker",
    "raylet": "Ray node daemon",
    "gcs_server": "Ray head (GCS)",
    "llmtrial.host.collective": "llmtrial sanity-check rank",
    "llmtrial.serve.vllm_bench": "llmtrial benchmark client",
}
#: Seconds for a TCP connect to the master address.
CONNECT_TIMEOUT_S = 3.0
#: Seconds for one node to answer (ssh's own ConnectTimeout is 10 s).
FACTS_TIMEOUT_S = 60.0
#: How much of a stale process's command line is kept.
CMDLINE_CHARS = 240

class InterfaceFacts(RecordModel):
    """The interface named in a node's config, as :mod:`llmtrial.onnode.node_facts` found it."""

    name: str | None = None
    exists: bool = False
    addresses: list[str] = []


class MasterFacts(RecordModel):
    """Whether the master address is reached from the node's interface, and how."""

    address: str
    port: int | None = None
    ip: str | None = None
    method: str = "subnet"
    route_dev: str | None = None
    ok: bool = False
    error: str | None = None


class ShmFacts(RecordModel):
    """``/dev/shm`` on a node, and the least this trial wants there."""

    size_bytes: int | None = None
    free_bytes: int | None = None
    error: str | None = None
    min_bytes: int = MIN_SHM_BYTES


class StaleProcess(RecordModel):
    """A process of an earlier trial on a node."""

    pid: int
    marker: str
    what: str
    cmdline: str
    age_s: float
    user: str | None = None


class StaleFacts(RecordModel):
    """The processes of an earlier trial on a node, and where the list came from."""

    source: str | None = None
    processes: list[StaleProcess] = []


def node_facts(node: Node, *, master_addr: str, master_port: int | None = None, shm_min_bytes: int = MIN_SHM_BYTES,
               markers: Mapping[str, str] = STALE_MARKERS, timeout: float = FACTS_TIMEOUT_S) -> NodeReport:
    """What ``node`` has, from one run of :mod:`llmtrial.onnode.node_facts` with ``node.python``.

    The master address is reachable from the node's interface when, with ``master_port``, a
    TCP connect from the interface's first IPv4 address to ``master_addr:master_port``
    succeeds within :data:`CONNECT_TIMEOUT_S` (give a port only where something listens:
    the master's sshd, a listener of the caller); without a port, when ``master_addr`` (an
    address or a name the node resolves) lies on one of the interface's subnets, which
    includes its own addresses. Either way the facts name the device the node's routing
    table sends that traffic to (``ip route get``). ``shm_min_bytes`` is kept in the facts
    for :func:`cross_checks`. Raises :class:`NodeError` naming the node when it cannot answer.
    """
    inputs = {"interface": node.interface, "master_addr": master_addr, "master_port": master_port,
              "connect_timeout": CONNECT_TIMEOUT_S, "markers": dict(markers), "cmdline_chars": CMDLINE_CHARS}
    report = NodeReport.model_validate({**node.program(onnode_facts, inputs, timeout), "node": node.describe()})
    report.dev_shm = {**(report.dev_shm or {}), "min_bytes": shm_min_bytes}
    return report


# --------------------------------------------------------------------------- checks

_SEVERITY = {"skip": 0, "ok": 1, "warn": 2, "fail": 3}


def _worst(statuses: Sequence[str], default: str = "ok") -> str:
    return max(statuses, key=_SEVERITY.__getitem__, default=default)


def _answered(facts: Mapping[str, NodeReport]) -> dict[str, NodeReport]:
    """The nodes that answered (a node that did not carries only ``node`` and ``error``)."""
    return {name: f for name, f in facts.items() if not f.error}


def _listing(values: Mapping[str, str | None]) -> str:
    return ", ".join(f"{name} {'not installed' if v is None else v}" for name, v in values.items())


def _same_version(name: str, label: str, values: Mapping[str, str | None], *, why: str, required: bool = True,
                  mismatch: str = "fail", none_detail: str | None = None) -> Check:
    """``values`` (node -> version, None where absent) must be one version on every node.

    None everywhere fails when ``required``, else is a skip (``none_detail``); a node without
    it next to one with it, or two versions, is ``mismatch``.
    """
    present = {n: v for n, v in values.items() if v is not None}
    if not present:
        return check(name, "fail" if required else "skip", none_detail or f"{label} is not installed on any node "
                     f"({', '.join(values)})", versions=dict(values))
    if len(present) < len(values) or len(set(present.values())) > 1:
        return check(name, mismatch, f"{label} differs across nodes: {_listing(values)}; {why}", versions=dict(values))
    version = next(iter(present.values()))
    return check(name, "ok", f"{label} {version} on every node ({', '.join(values)})", versions=dict(values))


def check_python(facts: Mapping[str, NodeReport]) -> Check:
    values = {n: f.python_version for n, f in facts.items()}
    return _same_version("python_patch_level", "Python", values, why=(
        "Ray refuses to join nodes whose Python patch levels differ (seed 000: a 3.12.13 worker could not join "
        "a 3.12.3 head) and pickled objects may not load across versions; build every node's serving "
        "environment on the same Python"))


def check_versions(facts: Mapping[str, NodeReport], *, uses_ray: bool = False) -> list[Check]:
    """vLLM, torch, NCCL and Ray versions equal on every node."""
    vllm = {n: f.vllm and f"{f.vllm} ({f.vllm_distribution})" for n, f in facts.items()}
    ray_why = ("the configuration uses Ray, and Ray refuses nodes of another version" if uses_ray else
               "the configuration does not use Ray, so this only says the environments differ")
    return [
        _same_version("vllm_version", "vLLM", vllm, why="every node must run the same engine code"),
        _same_version("torch_version", "torch", {n: f.torch for n, f in facts.items()},
                      why="workers of different torch builds do not agree on tensors and collectives"),
        _same_version("nccl_version", "NCCL", {n: f.nccl for n, f in facts.items()}, required=False,
                      none_detail="no node's torch is built with CUDA: no NCCL (gloo carries the collectives)",
                      why="NCCL ranks of different versions hang or fail at the first collective; a node "
                          "without NCCL has a CPU build of torch"),
        _same_version("ray_version", "Ray", {n: f.ray for n, f in facts.items()}, required=uses_ray,
                      mismatch="fail" if uses_ray else "warn",
                      none_detail="no node has Ray installed and the configuration does not use it", why=ray_why),
    ]


def check_vllm_files(facts: Mapping[str, NodeReport]) -> Check:
    """The same vLLM code on every node: the Python files that differ from RECORD (a file patch, an edit by hand)
    are the same on each. Seed 000 patched node A's vLLM by hand; a rank on a node without the patch runs
    other code than its peers."""
    found = {n: f.vllm_files for n, f in facts.items()}
    if any(v is None for v in found.values()):
        missing = ", ".join(n for n, v in found.items() if v is None)
        return check("vllm_files", "skip", f"not reported by {missing} (an older node program)", changed={})
    changed = {n: v.changed for n, v in found.items()}
    shown = {n: ("none" if not v.changed_count else f"{v.changed_count} changed from RECORD "
                 f"({', '.join(v.changed[:5])}{', ...' if v.changed_count > 5 else ''})") for n, v in found.items()}
    listing = "; ".join(f"{n} {text}" for n, text in shown.items())
    if len({(v.changed_count, tuple(v.changed)) for v in found.values()}) > 1:
        return check("vllm_files", "fail", f"vLLM's files differ across nodes: {listing}; every rank must run the same "
                     "engine code: revert the change, or make it on every node (a patch in mode plugin is carried to "
                     "each)", changed=changed)
    what = "every file matches RECORD" if not any(changed.values()) else f"the same files changed: {listing}"
    return check("vllm_files", "ok", f"vLLM's Python files on every node ({', '.join(found)}): {what}", changed=changed)


def _interface_problem(name: str, f: NodeReport) -> tuple[str, str]:
    """(status, sentence) for one node's interface and its way to the master."""
    iface, master = InterfaceFacts.model_validate(f.interface), MasterFacts.model_validate(f.master)
    label = iface.name
    target = f"{master.address}" + (f":{master.port}" if master.port else "")
    if label and not iface.exists:
        return "fail", f"{name}: interface {label} does not exist"
    if not master.ok:
        via = f" from {label}" if label else ""
        return "fail", f"{name}: the master {target} is not reachable{via} ({master.error})"
    route = master.route_dev
    own = master.ip in {a.split("/")[0] for a in iface.addresses}
    if label and route and route != label and not own:
        return "fail", f"{name}: traffic to the master {target} leaves by {route}, not by {label}"
    if not label:
        return "warn", (f"{name}: no interface named, the master {target} is reachable; NCCL and gloo pick an "
                        "interface themselves (seed 000 had to pin NCCL to the 200G interface)")
    how = "TCP connect" if master.method == "tcp" else "on its subnet"
    return "ok", f"{name}: {label} ({', '.join(iface.addresses)}) reaches the master {target} ({how})"


def check_interfaces(facts: Mapping[str, NodeReport]) -> Check:
    found = {name: _interface_problem(name, f) for name, f in facts.items()}
    status = _worst([s for s, _ in found.values()])
    shown = [text for s, text in found.values() if s == status] if status != "ok" else [t for _, t in found.values()]
    return check("node_interface", status, "; ".join(shown),
                 nodes={n: {"status": s, "interface": facts[n].interface, "master": facts[n].master}
                        for n, (s, _) in found.items()})


def check_dev_shm(facts: Mapping[str, NodeReport], min_bytes: int | None = None) -> Check:
    """``/dev/shm`` of every node at least the minimum (its facts' ``min_bytes`` unless given)."""
    problems, sizes = [], {}
    for name, f in facts.items():
        shm = ShmFacts.model_validate(f.dev_shm)
        minimum = min_bytes if min_bytes is not None else shm.min_bytes
        size = sizes[name] = shm.size_bytes
        if size is None:
            problems.append(f"{name}: /dev/shm cannot be read ({shm.error})")
        elif size < minimum:
            problems.append(f"{name}: /dev/shm is {size / GiB:.2f} GiB, below the {minimum / GiB:.2f} GiB minimum")
    if problems:
        return check("node_dev_shm", "fail", "; ".join(problems) + "; remount /dev/shm larger before anything starts "
                     "(seed 000 did, before the Ray services) or run containers with --ipc=host", size_bytes=sizes)
    listing = ", ".join(f"{n} {s / GiB:.2f} GiB" for n, s in sizes.items())
    return check("node_dev_shm", "ok", f"/dev/shm: {listing}", size_bytes=sizes)


def check_stale(facts: Mapping[str, NodeReport]) -> Check:
    """No vLLM, Ray or llmtrial serving process of an earlier trial on any node (none is killed here)."""
    found = {name: StaleFacts.model_validate(f.stale).processes for name, f in facts.items()}
    found = {name: procs for name, procs in found.items() if procs}
    if not found:
        return check("stale_processes", "ok", f"no vLLM, Ray or llmtrial serving process on {', '.join(facts)}",
                     processes={})
    shown = [f"{name}: pid {p.pid} ({p.what}, {p.age_s:.0f} s old, {p.user}): {p.cmdline}"
             for name, procs in found.items() for p in procs]
    return check("stale_processes", "fail", "; ".join(shown) + "; a stale vLLM or Ray holds ports, shared memory and "
                 "GPUs (seed 000 force-stopped stale Ray nodes before a clean launch): stop them first, nothing "
                 "here kills them", processes={name: [p.model_dump() for p in procs] for name, procs in found.items()})


def cross_checks(facts: Mapping[str, NodeReport], *, uses_ray: bool = False) -> list[Check]:
    """The checks over the nodes' facts (those of :func:`node_facts`, by node name); a node
    that did not answer (``error`` in its facts) is left out here: :func:`preflight_nodes`
    fails it on its own."""
    answered = _answered(facts)
    if not answered:
        return [check("cross_node", "fail", "no node answered: nothing to compare")]
    versions = check_versions(answered, uses_ray=uses_ray)
    return [check_python(answered), versions[0], check_vllm_files(answered), *versions[1:], check_interfaces(answered),
            check_dev_shm(answered), check_stale(answered)]


def _node_selection(name: str, count: int, inventory: Gpus | None, label: str) -> tuple[str, str]:
    """(status, sentence) of node ``name``'s ``count`` GPUs selected among ``inventory``, which gets the selection."""
    key = f"nodes.{name}.gpus"
    if inventory is None:
        return "warn", f"{label}: {key} {count} not checked: the node reported no GPU inventory (an older node program)"
    devices = inventory.devices or []
    try:
        chosen = select(count, devices, key=key, host=label)
    except SelectionError as exc:
        inventory.selected, inventory.selected_gpus = [], []
        return "fail", f"{exc}: give {key} at most {len(devices)}, or free the node's GPUs for the trial"
    inventory.selected, inventory.selected_gpus = [g.index for g in chosen], chosen
    if count and not devices:
        return "warn", (f"{label}: {key} {count} assumed, not checked: the node lists no GPU "
                        f"({inventory.reason or 'NVML lists none'})")
    listing = ", ".join(f"{g.index} ({g.name or g.uuid})" for g in chosen) or "none"
    return "ok", f"{label}: {key} {count}: GPU {listing} of its {len(devices)}"


def select_node_gpus(facts: Mapping[str, NodeReport], counts: Mapping[str, int],
                     labels: Mapping[str, str] | None = None) -> Check:
    """Each node's ``counts`` (its ``nodes.<name>.gpus``) selected among that node's own GPUs (its facts' ``gpus``,
    which get the selection): ok naming what each node selected, fail naming a node with fewer GPUs than its count,
    warn for a node that lists none (its count is then assumed, as on a host without NVML). A node that did not
    answer is left out (``node_reachable`` fails it). ``labels``: how messages name each node."""
    found = {name: _node_selection(name, count, facts[name].gpus, (labels or {}).get(name, f"node {name}"))
             for name, count in counts.items() if name in facts and not facts[name].error}
    status = _worst([s for s, _ in found.values()], default="skip")
    shown = [t for s, t in found.values() if s == status] if status != "ok" else [t for _, t in found.values()]
    selected = {name: (facts[name].gpus or Gpus(present=False, count=0)).selected for name in found}
    return check("node_gpus", status, "; ".join(shown) or "no node that gives GPUs answered",
                 nodes={name: {"status": s, "count": counts[name], "selected": selected[name]}
                        for name, (s, _) in found.items()})


def same_files(manifests: Mapping[str, Mapping[str, str | None]], *, show: int = 5) -> Check:
    """The staged model files hash the same on every node.

    ``manifests``: node name -> {path relative to the model folder: sha256, or None where
    the node has no readable file}, as :meth:`Node.sha256` gives after stripping each node's
    own folder. A path missing on a node or hashed differently fails; the detail lists the
    first ``show`` such files with each node's digest (12 hex digits) or ``missing``.
    """
    paths = sorted(set().union(*(m.keys() for m in manifests.values()))) if manifests else []
    if not paths:
        return check("model_files", "skip", "no staged files to compare", differing=[])
    differing = []
    for path in paths:
        digests = {n: m.get(path) for n, m in manifests.items()}
        if None in digests.values() or len(set(digests.values())) > 1:
            differing.append({"path": path, "sha256": digests})
    if not differing:
        return check("model_files", "ok", f"{len(paths)} files hash the same on {', '.join(manifests)}", differing=[])
    shown = ["{}: {}".format(d["path"], ", ".join(f"{n} {(v or 'missing')[:12]}" for n, v in d["sha256"].items()))
             for d in differing[:show]]
    more = f" and {len(differing) - show} more" if len(differing) > show else ""
    return check("model_files", "fail", f"{len(differing)} of {len(paths)} staged files differ across nodes: "
                 + "; ".join(shown) + more, differing=differing)


# --------------------------------------------------------------------------- all nodes


def _facts_or_error(node: Node, **kwargs: Any) -> NodeReport:
    started = time.monotonic()
    try:
        facts = node_facts(node, **kwargs)
    except NodeError as err:
        facts = NodeReport(node=node.describe(), error=str(err))
    facts.elapsed_s = round(time.monotonic() - started, 3)
    return facts


def check_answered(facts: Mapping[str, NodeReport]) -> Check:
    failed = {name: f.error for name, f in facts.items() if f.error}
    if failed:
        return check("node_reachable", "fail", "; ".join(failed.values()), errors=failed)
    took = ", ".join(f"{n} {f.elapsed_s:.1f} s" for n, f in facts.items())
    return check("node_reachable", "ok", f"every node answered ({took})", errors={})


def preflight_nodes(nodes: Sequence[Node], *, master_addr: str | None = None, master_port: int | None = None,
                    shm_min_bytes: int = MIN_SHM_BYTES, uses_ray: bool = False, timeout: float = FACTS_TIMEOUT_S,
                    markers: Mapping[str, str] = STALE_MARKERS, gpus: Mapping[str, int] | None = None,
                    here: Mapping[str, Gpus] | None = None) -> CrossNode:
    """The cross-node preflight record of ``nodes`` (the first one the master unless
    ``master_addr`` is given): every node's facts, gathered in parallel with ``timeout``
    seconds each, and the checks. A node that does not answer is a failed
    ``node_reachable`` check naming it with ssh's error; the other checks compare the rest.

    ``gpus`` (each node's ``nodes.<name>.gpus``, where the trial counts GPUs per node) adds the ``node_gpus``
    check (:func:`select_node_gpus`); ``here`` gives a node's inventory in place of what its program listed
    (the node reached locally: this host's, as preflight took it)."""
    if not nodes:
        raise ValueError("no nodes to check")
    master = master_addr or nodes[0].address
    kwargs = {"master_addr": master, "master_port": master_port, "shm_min_bytes": shm_min_bytes,
              "markers": markers, "timeout": timeout}
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = {node.name: pool.submit(_facts_or_error, node, **kwargs) for node in nodes}
        facts = {name: future.result() for name, future in futures.items()}
    for name, inventory in (here or {}).items():
        if name in facts and not facts[name].error:
            facts[name].gpus = inventory.model_copy(deep=True)
    checks = [check_answered(facts), *cross_checks(facts, uses_ray=uses_ray)]
    if gpus:
        checks.append(select_node_gpus(facts, gpus, {node.name: node.label() for node in nodes}))
    return CrossNode(master=Master(address=master, port=master_port), nodes=facts, checks=checks)
