"""The multi-node side of one configuration's job, beside :class:`~llmtrial.serve.multinode.MultiNodeServer`:
the launch and the nodes' roles, the collective sanity check across them before any server
starts, where each node holds the model, every node's serving environment, the server with the
other nodes' ranks (headless vLLM ranks or a Ray cluster), and what ran on each node afterwards.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from llmtrial.core.configuration_model import CollectiveSummary, Launch, SpanNode
from llmtrial.core.hostlock import SLURM_NODE_ENV
from llmtrial.core.ledger import Ledger
from llmtrial.core.record_models import ManifestRecord
from llmtrial.host.nodes import Node
from llmtrial.logs import failures
from llmtrial.logs.lines import read_log
from llmtrial.patch.patchdata import EnabledPatch
from llmtrial.patch.patching import Patched, evidence
from llmtrial.patch.plugin import NodePatches, node_plugin_env
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve.multinode import (
    MASTER_PORT_OFFSET,
    SANITY_PORT_OFFSET,
    HeadlessRanks,
    MultiNodeServer,
    NodeGroups,
    RayCluster,
    launch_args,
    ray_port,
    sanity_check,
)

log = logging.getLogger(__name__)


class SpreadParts(NamedTuple):
    """A configuration across nodes' parts of the record: how it was launched, its nodes, and the
    collective sanity check across them."""

    launch: Launch
    nodes: list[SpanNode]
    collective: CollectiveSummary


@dataclass(frozen=True)
class Spread:
    """One configuration spread over ``nodes`` (the first serves the API), launched ``native``
    (vLLM's own multi-node launch) or with ``ray``."""

    name: str
    label: str
    trial: str
    nodes: Sequence[Node]
    port: int
    launch: str
    manifest: ManifestRecord

    @property
    def master_port(self) -> int:
        return self.port + MASTER_PORT_OFFSET

    @property
    def ray_address(self) -> str:
        return f"{self.nodes[0].address}:{ray_port(self.port)}"

    def server_args(self) -> dict[str, Any]:
        """What the API server's argv adds for the other nodes."""
        if self.launch == "ray":
            return {"distributed_executor_backend": "ray"}
        return launch_args(self.nodes, 0, self.master_port)

    def record(self, *, gpus: bool) -> SpreadParts:
        """The launch, the nodes' roles and the collective run across them (NCCL with GPUs, gloo
        on CPU hosts) before any server starts."""
        model_dirs = self.model_dirs()
        ray = {"master_port": None, "ray_address": self.ray_address} if self.launch == "ray" else {}
        launch = Launch(**{"kind": self.launch, "nnodes": len(self.nodes), "master_addr": self.nodes[0].address,
                           "master_port": self.master_port, **ray})
        roles = ("api server, ray head", "ray worker") if self.launch == "ray" else ("api server", "headless")
        here = os.environ.get(SLURM_NODE_ENV)  # this host's SLURM name, inside an allocation
        nodes = [SpanNode(name=n.name, rank=i, role=roles[bool(i)], address=n.address, reach=n.reach,
                          slurm_host=n.slurm_host or (here if n.is_local else None), interface=n.interface,
                          model_dir=model_dirs[n.name], env_keys=sorted(n.rank_env()))
                 for i, n in enumerate(self.nodes)]
        log.info("%s: sanity check across nodes %s", self.name, ", ".join(n.name for n in self.nodes))
        check = sanity_check(self.nodes, port=self.port + SANITY_PORT_OFFSET, backend="nccl" if gpus else "gloo")
        log.info("%s: sanity check %s in %.1f s", self.name, "passed" if check["ok"] else "FAILED", check["wall_s"])
        return SpreadParts(launch, nodes, CollectiveSummary.model_validate(check))

    def model_dirs(self) -> dict[str, str]:
        """Where each node holds the staged model: the manifest's own folder on the first node,
        the verified copy the model stage made on every other one."""
        copies = self.manifest.nodes or {}
        out = {self.nodes[0].name: self.manifest.model_dir}
        for node in self.nodes[1:]:
            if node.name not in copies:
                raise FileNotFoundError(f"the manifest has no staged copy of the model on node {node.name}: "
                                        "restage it with `snakemake --forcerun stage_model`")
            out[node.name] = copies[node.name].model_dir
        return out

    def envs(self, ledger: Ledger, patched: Patched, env: Mapping[str, str]) -> NodePatches:
        """Every node's serving environment: the configuration's ``env`` with the patches' plugin
        folder, carried to every other node (ledger first), and its rank environment; and the patches in
        the mode each node has them."""
        found = node_plugin_env(ledger, list(self.nodes), patched.plugin_dir, patched.patches, env,
                                trial=self.trial, work_dir=patched.work_dir)
        ray = {"RAY_ADDRESS": self.ray_address} if self.launch == "ray" else {}
        return NodePatches(envs={n.name: {**found.envs[n.name], **n.rank_env(), **ray} for n in self.nodes},
                           patches=found.patches)

    def server(self, argv: list[str], ledger: Ledger, envs: Mapping[str, Mapping[str, str]],
               args: ServingArgs, **kwargs: Any) -> MultiNodeServer:
        """Node 0's API server with the other nodes' ranks (``args``: the configuration's vLLM args, node 0's
        too)."""
        ranks: NodeGroups
        if self.launch == "ray":
            ranks = RayCluster(ledger, self.nodes, label=self.label, port=ray_port(self.port), envs=envs)
        else:
            ranks = HeadlessRanks(ledger, self.nodes, label=self.label, model_dirs=self.model_dirs(),
                                  args=args, envs=envs, master_port=self.master_port)
        return MultiNodeServer(argv, ranks=ranks, ledger=ledger, **kwargs)


def node_outcomes(nodes: Sequence[SpanNode], *, ranks: Mapping[str, Mapping[str, Any]], server_log: str,
                  failed: bool, ready: bool, served: NodePatches, out_dir: Path) -> list[SpanNode]:
    """Each node's entry with what ran there (``ranks``: the server's, by node) and its log and, from
    that log, the patches' evidence and (``failed``: the configuration failed; ``ready``: its server
    had answered /health) the line that explains the failure."""
    return [_node_outcome(node, ranks.get(node.name, {"log": server_log}), failed=failed, ready=ready,
                          patches=served.patches[node.name], env=served.envs[node.name], out_dir=out_dir)
            for node in nodes]


def _node_outcome(node: SpanNode, ran: Mapping[str, Any], *, failed: bool, ready: bool, patches: Sequence[EnabledPatch],
                  env: Mapping[str, str], out_dir: Path) -> SpanNode:
    """One node's entry with what ran there; node 0's log is the server's own, read for the whole record."""
    seen = dict(ran)
    if node.rank or not seen.get("log"):
        name = seen.get("log") or seen.get("ray_log")
        text = read_log(out_dir / name) if name else ""
        seen["patches"] = evidence(patches, text, env, name or "")
        if failed and text:
            seen["error_line"] = failures.diagnose_failure(text, source=name, ready=ready)
    return node.model_copy(update=seen)
