"""Telemetry on every node of a multi-node configuration, merged into one CSV with a node column.

A small sampler program of the standard library (Linux ``/proc`` only) runs on each node with
the node's own Python, started through :func:`llmtrial.host.process_groups.start_group` so the ledger holds
it before it runs and cleanup can stop it from the ledger alone. It appends one row per
interval to a CSV on the node, flushing each row, until SIGTERM (or SIGINT) stops it, or its
``max_s`` safety limit passes (a sampler of a trial killed before cleanup ends by itself)::

    time,node,cpu_percent,mem_used_bytes,load1,net_rx_bytes,net_tx_bytes
    1732896000.625,b,37.5,8123456512,0.42,1234567,7654321

``time`` is the node's Unix time (ms), ``cpu_percent`` the share of CPU time not idle or
iowait over the interval ending at ``time`` (``/proc/stat``), ``mem_used_bytes``
``MemTotal - MemAvailable`` (``/proc/meminfo``), ``load1`` the one-minute load average, and
``net_*_bytes`` the counters of the node's interface (:attr:`Node.interface`) in
``/proc/net/dev``, or the sum over every interface but ``lo`` when it names none (empty when
the named interface is missing). Counters are kept raw: a window's traffic is their change.

:class:`NodeTelemetry` starts the samplers on enter and, on exit (an exception too), stops
each with :func:`llmtrial.host.process_groups.finish_group`, fetches each node's file (``cat``) and
removes it there, writes the merged CSV sorted by time and keeps :attr:`NodeTelemetry.summary`
(per node: :func:`node_window_figures` over the whole run). A node whose sampler could not
start, stop or be read is listed with an ``error`` naming it; exit never raises for it.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from llmtrial.core.configuration_model import NodeSample, NodesTelemetry
from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.ledger import Ledger
from llmtrial.core.scenario_model import NodeWindow
from llmtrial.host.nodes import Node, NodeError, program_argv
from llmtrial.host.process_groups import finish_group, start_group
from llmtrial.onnode import telemetry_sampler

__all__ = ["CSV_HEADER", "REMOTE_DIR", "NodeTelemetry", "sampler_argv", "remote_paths",
           "parse_node_csv", "read_node_samples", "node_window_figures"]

log = logging.getLogger(__name__)

#: Columns of a node's CSV and of the merged one.
CSV_HEADER: tuple[str, ...] = ("time", "node", "cpu_percent", "mem_used_bytes", "load1", "net_rx_bytes",
                               "net_tx_bytes")
#: Folder under the node's staging folder that holds the samplers' files while they run.
REMOTE_DIR = ".llmtrial-telemetry"
#: Seconds a sampler runs at most when nothing stops it (a trial killed before its cleanup).
MAX_SECONDS = 24 * 3600.0
#: Seconds a sampler has to end after SIGTERM before it is killed.
STOP_TIMEOUT_S = 5.0
#: Seconds for fetching or removing a node's file.
FETCH_TIMEOUT_S = 60.0
_NUMERIC = CSV_HEADER[2:]
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")

def remote_paths(node: Node, label: str) -> tuple[str, str]:
    """(CSV, log) of the sampler ``label`` on ``node``, under its staging folder."""
    stem = f"{_SAFE.sub('_', label)}-{_SAFE.sub('_', node.name)}"
    folder = posixpath.join(node.staging_dir, REMOTE_DIR)
    return posixpath.join(folder, f"{stem}.csv"), posixpath.join(folder, f"{stem}.log")


def sampler_argv(node: Node, out_path: str, interval: float, max_s: float = MAX_SECONDS) -> list[str]:
    """The argv that runs the sampler on ``node`` (every argument its own, no shell)."""
    return program_argv(node.python, telemetry_sampler, out_path, node.name, repr(float(interval)),
                        node.interface or "", repr(float(max_s)))


@dataclass(frozen=True)
class NodeSampleRow:
    """One sample of one node (a row of :data:`CSV_HEADER`), each figure None where its cell was empty."""

    time: float
    node: str
    cpu_percent: float | None
    mem_used_bytes: float | None
    load1: float | None
    net_rx_bytes: float | None
    net_tx_bytes: float | None

    def figures(self) -> tuple[float | None, ...]:
        """The numeric cells after time and node, in the CSV's order."""
        return self.cpu_percent, self.mem_used_bytes, self.load1, self.net_rx_bytes, self.net_tx_bytes


def _row(raw: Mapping[str, str | None]) -> NodeSampleRow | None:
    """One CSV row typed (empty cells None), or None for a short or foreign line."""
    if any(raw.get(k) is None for k in CSV_HEADER):
        return None
    try:
        t = float(raw["time"] or "")
        values = [float(cell) if cell else None for cell in (raw[k] for k in _NUMERIC)]
    except (KeyError, TypeError, ValueError):
        return None
    node = raw["node"]
    if math.isnan(t) or not node:
        return None
    return NodeSampleRow(t, node, *values)


def parse_node_csv(text: str) -> list[NodeSampleRow]:
    """The rows of one node's (or the merged) CSV text; a last line without its newline (torn
    by a kill mid-write) is skipped, and so is any line short of a column."""
    whole = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
    return [r for r in map(_row, csv.DictReader(io.StringIO(whole))) if r is not None]


def read_node_samples(path: str | Path) -> list[NodeSampleRow]:
    """The rows of a merged CSV file written by :class:`NodeTelemetry`."""
    return parse_node_csv(Path(path).read_text(encoding="utf-8"))


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0")


def write_merged(out_csv: Path, rows: Iterable[NodeSampleRow]) -> Path:
    """Write rows of every node as one CSV sorted by time (then node), header :data:`CSV_HEADER`."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for r in sorted(rows, key=lambda r: (r.time, r.node)):
        writer.writerow([f"{r.time:.3f}", r.node, *(_cell(v) for v in r.figures())])
    return atomic_write_text(out_csv, buf.getvalue())


def _delta(readings: list[float | None]) -> int | None:
    """A counter's change from its first reading to its last (None without one)."""
    v = [x for x in readings if x is not None]
    return int(v[-1] - v[0]) if v else None


def _figures(rows: list[NodeSampleRow]) -> NodeWindow:
    """One node's figures over its rows (sorted by time)."""
    cpu = [r.cpu_percent for r in rows if r.cpu_percent is not None]
    mem = [r.mem_used_bytes for r in rows if r.mem_used_bytes is not None]
    load = [r.load1 for r in rows if r.load1 is not None]
    return NodeWindow(samples=len(rows), cpu_percent_peak=max(cpu, default=None),
                      cpu_percent_mean=round(sum(cpu) / len(cpu), 2) if cpu else None,
                      mem_used_peak_bytes=int(max(mem)) if mem else None, load1_peak=max(load, default=None),
                      net_rx_bytes=_delta([r.net_rx_bytes for r in rows]),
                      net_tx_bytes=_delta([r.net_tx_bytes for r in rows]),
                      first=rows[0].time if rows else None, last=rows[-1].time if rows else None)


def node_window_figures(samples: str | Path | Sequence[NodeSampleRow], start: float = -math.inf,
                        end: float = math.inf) -> dict[str, NodeWindow]:
    """Per node, what its samples with ``start <= time <= end`` show: ``samples``, CPU peak and
    mean (%), memory used peak, load peak, bytes received and sent over the interface (the
    counters' change between the first and last sample in the window; None without two
    readings' worth of counter), and the ``first`` and ``last`` sample times. ``samples`` is a
    merged CSV's path or its rows (:func:`read_node_samples`); a node without a sample in the
    window is absent."""
    rows = read_node_samples(samples) if isinstance(samples, (str, Path)) else list(samples)
    by_node: dict[str, list[NodeSampleRow]] = {}
    for r in sorted(rows, key=lambda r: r.time):
        if start <= r.time <= end:
            by_node.setdefault(r.node, []).append(r)
    return {name: _figures(node_rows) for name, node_rows in by_node.items()}


class NodeTelemetry:
    """Sample every node of ``nodes`` every ``interval`` seconds while in a ``with``.

    ``label`` names the samplers in the ledger (``<label>/telemetry``) and their files on the
    nodes; ``out_csv`` receives the merged samples on exit. :attr:`summary` (also what
    :meth:`close` returns) is ``{"file", "interval_s", "nodes": {name: figures or error}}``.
    """

    def __init__(self, ledger: Ledger, nodes: Sequence[Node], *, label: str, out_csv: Path,
                 interval: float = 1.0, max_s: float = MAX_SECONDS) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique: {names}")
        self.ledger, self.nodes, self.label = ledger, list(nodes), label
        self.out_csv, self.interval, self.max_s = Path(out_csv), float(interval), float(max_s)
        self.groups: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, str] = {}
        self.summary: NodesTelemetry | None = None

    def __enter__(self) -> NodeTelemetry:
        for node in self.nodes:
            csv_path, log_path = remote_paths(node, self.label)
            try:
                self.groups[node.name] = start_group(
                    self.ledger, node, sampler_argv(node, csv_path, self.interval, self.max_s),
                    label=f"{self.label}/telemetry", log_path=log_path)
            except (NodeError, OSError) as err:
                self.errors[node.name] = f"node {node.name}: sampler did not start: {err}"
                log.warning("%s", self.errors[node.name])
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> NodesTelemetry:
        """Stop every sampler, fetch and remove its file, write the merged CSV (idempotent)."""
        if self.summary is not None:
            return self.summary
        rows: list[NodeSampleRow] = []
        for node in self.nodes:
            if node.name in self.groups:
                rows += self._collect(node)
        write_merged(self.out_csv, rows)
        figures = node_window_figures(rows)
        nodes: dict[str, NodeSample] = {}
        for node in self.nodes:
            seen = figures.get(node.name, NodeWindow(samples=0))
            entry = NodeSample(interface=node.interface or "all but lo", **seen.model_dump(exclude_unset=True))
            if node.name in self.errors:
                entry.error = self.errors[node.name]
            nodes[node.name] = entry
        self.summary = NodesTelemetry(file=self.out_csv.name, interval_s=self.interval, nodes=nodes)
        return self.summary

    def _collect(self, node: Node) -> list[NodeSampleRow]:
        """Stop ``node``'s sampler and read its rows; a failure is kept in :attr:`errors`."""
        csv_path, log_path = remote_paths(node, self.label)
        try:
            stop = finish_group(self.ledger, node, self.groups[node.name], timeout=STOP_TIMEOUT_S)
            if stop["survivors"]:
                self.errors[node.name] = f"node {node.name}: sampler pids {stop['survivors']} would not stop"
        except NodeError as err:
            self.errors[node.name] = f"node {node.name}: sampler could not be stopped: {err}"
        try:
            text = node.run(["cat", csv_path], timeout=FETCH_TIMEOUT_S, check=True).stdout
        except NodeError as err:
            self.errors.setdefault(node.name, f"node {node.name}: samples could not be fetched: {err}")
            return []
        try:
            node.run(["rm", "-f", csv_path, log_path], timeout=FETCH_TIMEOUT_S, check=True)
            # the folder too, unless another sampler's files are still in it
            node.run(["rmdir", posixpath.dirname(csv_path)], timeout=FETCH_TIMEOUT_S)
        except NodeError as err:
            log.warning("node %s: could not remove %s: %s", node.name, csv_path, err)
        return [r for r in parse_node_csv(text) if r.node == node.name]
