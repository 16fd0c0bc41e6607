"""What the report says about configurations that span several nodes, from the records only.

A configuration record of a multi-node configuration carries ``nodes`` (each node's name,
rank, role, address, reach, interface, model folder and log), ``launch`` (kind, nnodes,
master address and port), ``collective`` (:func:`llmtrial.host.collective.summarize`'s record of
the sanity check) and ``telemetry.nodes`` (:class:`llmtrial.serve.nodetelemetry.NodeTelemetry`'s
summary). The preflight record may carry ``nodes`` (:func:`llmtrial.host.crossnode.preflight_nodes`)
and the manifest ``nodes`` (per node: model folder, files, bytes, copy time, verified). A
single-host trial has none of these keys, and then nothing here shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["is_multinode", "node_rows", "span_rows", "span_sentence", "collective_sentence", "nodes_context"]


def is_multinode(record: Mapping[str, Any]) -> bool:
    """Whether a configuration record spans nodes (it lists them)."""
    return bool(record.get("nodes"))


def _facts(preflight: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return dict(((preflight.get("nodes") or {}).get("nodes")) or {})


def node_rows(configurations: Sequence[Mapping[str, Any]], preflight: Mapping[str, Any],
              manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per node any configuration spans (first seen first): how it is reached, its
    address and interface, the versions preflight read there, and its weights' copy."""
    facts, copies = _facts(preflight), dict(manifest.get("nodes") or {})
    seen: dict[str, dict[str, Any]] = {}
    for rec in configurations:
        for node in rec.get("nodes") or []:
            row = seen.setdefault(node["name"], {"name": node["name"], "configurations": []})
            row["configurations"].append(rec["configuration"])
            for key in ("reach", "address", "interface"):
                row.setdefault(key, node.get(key))
    for name, row in seen.items():
        f = facts.get(name) or {}
        row.update(python=f.get("python_version"), vllm=f.get("vllm"), torch=f.get("torch"),
                   hostname=f.get("hostname"), facts_error=f.get("error"), weights=copies.get(name))
    return list(seen.values())


def collective_sentence(collective: Mapping[str, Any] | None) -> str:
    """The sanity check's outcome in words: its time and bus bandwidth, or its failure."""
    if not collective:
        return "no sanity-check collective is recorded"
    backend = collective.get("backend") or "the"
    if not collective.get("ok"):
        return (f"the {backend} all-reduce sanity check failed in {collective.get('phase') or 'an unknown phase'}: "
                f"{collective.get('diagnosis') or 'no diagnosis recorded'}")
    took = f" took {collective['wall_s']:.1f} s" if collective.get("wall_s") is not None else " passed"
    median = collective.get("median_s")
    rate = collective.get("busbw_gbps")
    detail = []
    if median is not None:
        detail.append(f"a median all-reduce of {median * 1000:.1f} ms")
    if rate is not None:
        detail.append(f"{rate:.2f} GB/s bus bandwidth")
    return f"the {backend} all-reduce sanity check{took}" + (f" ({', '.join(detail)})" if detail else "")


def span_sentence(record: Mapping[str, Any]) -> str:
    """``tp2-two-hosts spans nodes a and b (native launch, master 10.0.0.1:9100); the gloo
    all-reduce sanity check took 1.2 s (...)``."""
    names = [n["name"] for n in record.get("nodes") or []]
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
    launch = record.get("launch") or {}
    how = [f"{launch['kind']} launch"] if launch.get("kind") else []
    if launch.get("master_addr"):
        port = f":{launch['master_port']}" if launch.get("master_port") is not None else ""
        how.append(f"master {launch['master_addr']}{port}")
    where = f" ({', '.join(how)})" if how else ""
    return f"{record['configuration']} spans nodes {listed}{where}; {collective_sentence(record.get('collective'))}."


def _telemetry(record: Mapping[str, Any], name: str) -> dict[str, Any]:
    return dict((((record.get("telemetry") or {}).get("nodes") or {}).get("nodes") or {}).get(name) or {})


def span_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per node of a multi-node configuration: its rank and role, its log, and what the
    sampler on it saw over the job (CPU peak and mean, bytes received and sent)."""
    return [{**{k: node.get(k) for k in ("name", "rank", "role", "address", "log")},
             "telemetry": _telemetry(record, node["name"])} for node in record.get("nodes") or []]


def nodes_context(configurations: Sequence[Mapping[str, Any]], preflight: Mapping[str, Any],
                  manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the report's Nodes section shows, or None when no configuration spans nodes."""
    spanning = [r for r in configurations if is_multinode(r)]
    if not spanning:
        return None
    return {
        "rows": node_rows(spanning, preflight, manifest),
        "checks": list((preflight.get("nodes") or {}).get("checks") or []),
        "configurations": [{"configuration": r["configuration"], "status": r.get("status"),
                            "launch": r.get("launch") or {}, "collective": r.get("collective"),
                            "sentence": span_sentence(r), "nodes": span_rows(r),
                            "telemetry_file": ((r.get("telemetry") or {}).get("nodes") or {}).get("file")}
                           for r in spanning],
    }
