"""What the report says about configurations that span several nodes, from the records only.

Every record is read as its model (:mod:`llmtrial.core.record_models`). A configuration record of
a multi-node configuration carries ``nodes`` (each node's name, rank, role, address, reach,
interface, model folder and log), ``launch`` (kind, nnodes, master address and port),
``collective`` (:func:`llmtrial.host.collective.summarize`'s record of the sanity check) and
``telemetry.nodes`` (:class:`llmtrial.serve.nodetelemetry.NodeTelemetry`'s summary). The preflight record may carry ``nodes`` (:func:`llmtrial.host.crossnode.preflight_nodes`)
and the manifest ``nodes`` (per node: model folder, files, bytes, copy time, verified). A
single-host trial has none of these keys, and then nothing here shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llmtrial.core.configuration_model import CollectiveSummary, ConfigurationRecord, Launch, NodeSample
from llmtrial.core.preflight_model import PreflightRecord
from llmtrial.core.record_base import Check
from llmtrial.core.record_models import ManifestRecord, NodeCopy

__all__ = ["is_multinode", "node_rows", "span_rows", "span_sentence", "collective_sentence", "nodes_context"]


def is_multinode(record: ConfigurationRecord) -> bool:
    """Whether a configuration record spans nodes (it lists them)."""
    return bool(record.nodes)


@dataclass
class NodeRow:
    """One node any configuration spans: how it is reached, its address and interface, the versions preflight
    read there (``facts_error``: why they were not read) and its weights' copy."""

    name: str
    reach: str
    address: str
    interface: str | None
    configurations: list[str] = field(default_factory=list)
    weights: NodeCopy | None = None
    python: str | None = None
    vllm: str | None = None
    torch: str | None = None
    hostname: str | None = None
    facts_error: str | None = None


def node_rows(configurations: Sequence[ConfigurationRecord], preflight: PreflightRecord,
              manifest: ManifestRecord) -> list[NodeRow]:
    """One row per node any configuration spans (first seen first): how it is reached, its
    address and interface, the versions preflight read there, and its weights' copy."""
    facts = preflight.nodes.nodes if preflight.nodes else {}
    seen: dict[str, NodeRow] = {}
    for rec in configurations:
        for node in rec.nodes or []:
            row = seen.setdefault(node.name, NodeRow(node.name, node.reach, node.address, node.interface))
            row.configurations.append(rec.configuration)
    for name, row in seen.items():
        if name in facts:
            f = facts[name]
            row.python, row.vllm, row.torch, row.hostname, row.facts_error = (
                f.python_version, f.vllm, f.torch, f.hostname, f.error)
    for name, copy in (manifest.nodes or {}).items():
        if name in seen:
            seen[name].weights = copy
    return list(seen.values())


def collective_sentence(collective: CollectiveSummary | None) -> str:
    """The sanity check's outcome in words: its time and bus bandwidth, or its failure."""
    if collective is None:
        return "no sanity-check collective is recorded"
    backend = collective.backend or "the"
    if not collective.ok:
        return (f"the {backend} all-reduce sanity check failed in {collective.phase or 'an unknown phase'}: "
                f"{collective.diagnosis or 'no diagnosis recorded'}")
    took = f" took {collective.wall_s:.1f} s" if collective.wall_s is not None else " passed"
    detail = []
    if collective.median_s is not None:
        detail.append(f"a median all-reduce of {collective.median_s * 1000:.1f} ms")
    if collective.busbw_gbps is not None:
        detail.append(f"{collective.busbw_gbps:.2f} GB/s bus bandwidth")
    return f"the {backend} all-reduce sanity check{took}" + (f" ({', '.join(detail)})" if detail else "")


def span_sentence(record: ConfigurationRecord) -> str:
    """``tp2-two-hosts spans nodes a and b (native launch, master 10.0.0.1:9100); the gloo
    all-reduce sanity check took 1.2 s (...)``."""
    names = [n.name for n in record.nodes or []]
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
    how = []
    if record.launch is not None:
        how.append(f"{record.launch.kind} launch")
        port = f":{record.launch.master_port}" if record.launch.master_port is not None else ""
        how.append(f"master {record.launch.master_addr}{port}")
    where = f" ({', '.join(how)})" if how else ""
    return f"{record.configuration} spans nodes {listed}{where}; {collective_sentence(record.collective)}."


@dataclass(frozen=True)
class SpanRow:
    """One node of a multi-node configuration: its rank and role, its log, what the sampler on it saw."""

    name: str
    rank: int
    role: str
    address: str
    log: str | None
    telemetry: NodeSample


def span_rows(record: ConfigurationRecord) -> list[SpanRow]:
    """Per node of a multi-node configuration: its rank and role, its log, and what the
    sampler on it saw over the job (CPU peak and mean, bytes received and sent; nothing when none ran)."""
    sampled = record.telemetry.nodes.nodes if record.telemetry.nodes is not None else {}
    return [SpanRow(node.name, node.rank, node.role, node.address, node.log,
                    sampled[node.name] if node.name in sampled else NodeSample()) for node in record.nodes or []]


@dataclass(frozen=True)
class Spanning:
    """One configuration across nodes: its status, launch, sanity check, the sentence and its nodes' rows."""

    configuration: str
    status: str
    launch: Launch | None
    collective: CollectiveSummary | None
    sentence: str
    nodes: list[SpanRow]
    telemetry_file: str | None


@dataclass(frozen=True)
class NodesSection:
    """The report's Nodes section: each node's row, the cross-node preflight's checks, each spanning
    configuration."""

    rows: list[NodeRow]
    checks: list[Check]
    configurations: list[Spanning]


def nodes_context(configurations: Sequence[ConfigurationRecord], preflight: PreflightRecord,
                  manifest: ManifestRecord) -> NodesSection | None:
    """What the report's Nodes section shows, or None when no configuration spans nodes."""
    spanning = [r for r in configurations if is_multinode(r)]
    if not spanning:
        return None
    return NodesSection(
        rows=node_rows(spanning, preflight, manifest),
        checks=list(preflight.nodes.checks) if preflight.nodes else [],
        configurations=[Spanning(r.configuration, r.status, r.launch, r.collective, span_sentence(r), span_rows(r),
                                 r.telemetry.nodes.file if r.telemetry.nodes is not None else None)
                        for r in spanning])
