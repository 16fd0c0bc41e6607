"""Telemetry on every node (llmtrial.serve.nodetelemetry): the sampler runs for real on the two hosts
made on this machine (tests/hosts.py), its rows are merged with a node column, bytes pushed
across the veth pair show on both ends, and after ``kill -9`` of the process that held the
samplers, cleanup stops them on both nodes from the ledger alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, wait_until
from hosts import cleanup_on_a, entries, kill_planted
from llmtrial.core.ledger import Action, Ledger
from llmtrial.core.paths import TrialPaths
from llmtrial.host.nodes import Node, local_node
from llmtrial.host.process_groups import group_alive
from llmtrial.lifecycle.cleanup import outstanding
from llmtrial.serve.nodetelemetry import (
    CSV_HEADER,
    NodeSampleRow,
    NodeTelemetry,
    node_window_figures,
    parse_node_csv,
    read_node_samples,
    remote_paths,
    write_merged,
)

WORKFLOW = REPO / "workflow"
MB = 1_000_000

#: Holds the samplers of nodes a and b, says so, and waits to be killed.
HOLDER = """\
import json, sys, time
from pathlib import Path
from llmtrial.core.ledger import Ledger
from llmtrial.host.nodes import Node
from llmtrial.serve.nodetelemetry import NodeTelemetry
from llmtrial.core.paths import TrialPaths
inp = json.loads(sys.argv[1])
nodes = [Node.from_reach(name, reach) for name, reach in inp["nodes"].items()]
with NodeTelemetry(Ledger(TrialPaths(Path(inp["results"])).ledger), nodes, label="tp2", interval=0.5,
                   out_csv=Path(inp["results"]) / "nodes.csv"):
    print("sampling", flush=True)
    time.sleep(600)
"""


def started_groups(results: Path) -> dict[str, dict]:
    """Node name -> its group_started entry."""
    return {e.node: e for e in entries(results) if e.action == Action.GROUP_STARTED}


def samples_on(node: Node, label: str = "tp2") -> int:
    """How many rows the node's sampler has written so far (its file, read on the node while it runs)."""
    done = node.run(["cat", remote_paths(node, label)[0]], timeout=30)
    return len(parse_node_csv(done.stdout)) if done.returncode == 0 else 0


def test_rows_are_typed_a_torn_line_is_skipped_and_windows_are_per_node(tmp_path):
    text = ",".join(CSV_HEADER) + "\n1.000,b,10.00,100,0.5,1000,50\n1.500,b,30.00,300,0.7,5000,90\n1.7,b\n2.0,b,4,1,1,1,12"
    rows = parse_node_csv(text)
    assert [r.time for r in rows] == [1.0, 1.5]
    rows += [NodeSampleRow(time=1.2, node="a", cpu_percent=50.0, mem_used_bytes=200.0, load1=1.0, net_rx_bytes=None,
                     net_tx_bytes=None)]
    merged = read_node_samples(write_merged(tmp_path / "nodes.csv", rows))
    assert (tmp_path / "nodes.csv").read_text().splitlines()[0] == ",".join(CSV_HEADER)
    assert [(r.time, r.node) for r in merged] == [(1.0, "b"), (1.2, "a"), (1.5, "b")]
    figures = node_window_figures(tmp_path / "nodes.csv")
    assert figures["b"].model_dump() == {"samples": 2, "cpu_percent_peak": 30.0, "cpu_percent_mean": 20.0,
                            "mem_used_peak_bytes": 300, "load1_peak": 0.7, "net_rx_bytes": 4000, "net_tx_bytes": 40,
                            "first": 1.0, "last": 1.5}
    assert figures["a"].net_rx_bytes is None and figures["a"].samples == 1
    assert set(node_window_figures(merged, 1.1, 1.3)) == {"a"}


@pytest.mark.slow
def test_every_node_is_sampled_merged_and_sees_the_bytes_pushed_between_them(hosts, tmp_path):
    a, b = hosts.node_a(), hosts.node_b()
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(4 * MB))
    ledger = Ledger(TrialPaths(tmp_path).ledger)
    with NodeTelemetry(ledger, [a, b], label="tp2", out_csv=tmp_path / "nodes.csv", interval=0.5) as tele:
        wait_until(lambda: min(samples_on(a), samples_on(b)) >= 2, "two samples on each node before the copy",
                   poll=0.5)  # each look is an ssh session: few, so the bytes before the copy stay few
        before = time.time()
        b.copy_to(blob, str(hosts.staging_b / "blob.bin"))
        after = time.time()
        # of two rows more than a node had after the copy, the second was taken after that reading
        later = {node.name: samples_on(node) + 2 for node in (a, b)}
        wait_until(lambda: all(samples_on(node) >= later[node.name] for node in (a, b)), "samples after the copy",
                   poll=0.5)
    summary = tele.summary.model_dump(exclude_unset=True)
    rows = read_node_samples(tmp_path / "nodes.csv")
    assert (tmp_path / "nodes.csv").read_text().splitlines()[0] == ",".join(CSV_HEADER)
    assert [r.time for r in rows] == sorted(r.time for r in rows) and {r.node for r in rows} == {"a", "b"}
    assert summary["file"] == "nodes.csv" and summary["interval_s"] == 0.5 and set(summary["nodes"]) == {"a", "b"}
    for name, fig in summary["nodes"].items():
        assert fig["samples"] >= 4 and "error" not in fig, (name, fig)
        assert 0 <= fig["cpu_percent_mean"] <= fig["cpu_percent_peak"] <= 100 and fig["mem_used_peak_bytes"] > 0
        assert fig["interface"] == "llmt0" and fig["first"] < before and fig["last"] > after
    assert summary["nodes"]["b"]["net_rx_bytes"] >= 4 * MB and summary["nodes"]["a"]["net_tx_bytes"] >= 4 * MB
    assert summary["nodes"]["b"]["net_tx_bytes"] > 0  # the acknowledgements going back
    quiet = node_window_figures(rows, -1, before)
    assert quiet["b"].net_rx_bytes < MB
    # the figures of the same rows as the summary's
    assert node_window_figures(rows)["b"].net_rx_bytes == summary["nodes"]["b"]["net_rx_bytes"]
    # both samplers stopped through the ledger, their files removed on their node
    log = entries(tmp_path)
    assert sorted(e.node for e in log if e.action == Action.GROUP_STOPPED) == ["a", "b"]
    assert outstanding(log)["groups"] == []
    for node in (a, b):
        assert node.run(["test", "-e", remote_paths(node, "tp2")[0]], timeout=30).returncode == 1
        mark = started_groups(tmp_path)[node.name]
        assert group_alive(node, mark.pgid, mark.create_time) == []


@pytest.mark.slow
def test_a_node_whose_sampler_cannot_start_is_listed_with_its_error(hosts, tmp_path):
    a, unreachable = hosts.node_a(), hosts.node_b(identity_file=str(hosts.wrong_key))
    with NodeTelemetry(Ledger(TrialPaths(tmp_path).ledger), [a, unreachable], label="tp2",
                       out_csv=tmp_path / "nodes.csv", interval=0.5) as tele:
        wait_until(lambda: samples_on(a), "a sample on node a", poll=0.5)
    b = tele.summary.nodes["b"]
    assert b.samples == 0 and b.error.startswith("node b: sampler did not start") and "ssh" in b.error
    assert tele.summary.nodes["a"].samples >= 1 and tele.summary.nodes["a"].error is None
    assert {r.node for r in read_node_samples(tmp_path / "nodes.csv")} == {"a"}


def test_an_exception_inside_still_stops_and_merges(tmp_path):
    node = local_node("a", staging_dir=str(tmp_path / "staging"))
    tele = NodeTelemetry(Ledger(TrialPaths(tmp_path).ledger), [node], label="x", out_csv=tmp_path / "n.csv",
                         interval=0.3)
    try:
        with tele:
            wait_until(lambda: samples_on(node, "x"), "a sample on the node")
            raise RuntimeError("the server died")
    except RuntimeError:
        pass
    assert tele.summary.nodes["a"].samples >= 1 and read_node_samples(tmp_path / "n.csv")
    assert outstanding(entries(tmp_path))["groups"] == []


@pytest.mark.slow
def test_kill_9_of_the_holder_then_cleanup_stops_the_samplers_on_both_nodes(hosts, tmp_path):
    a, b = hosts.node_a(), hosts.node_b()
    nodes = {"a": a.describe(), "b": b.describe()}  # what the holder knows: no namespace prefix
    holder = subprocess.Popen(hosts.on_a([sys.executable, "-c", HOLDER,
                                          json.dumps({"results": str(tmp_path), "nodes": nodes})]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(WORKFLOW)})
    pids: list[int] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "sampling", holder.stderr
        marks = started_groups(tmp_path)
        on = {"a": Node.from_reach("a", nodes["a"]), "b": b}
        for name in ("a", "b"):
            pids += group_alive(on[name], marks[name].pgid, marks[name].create_time)
        assert len(pids) == 2
        holder.kill()  # kill -9: no exit code of the holder runs
        holder.wait(timeout=10)
        time.sleep(0.6)
        assert all(group_alive(on[n], marks[n].pgid, marks[n].create_time) for n in ("a", "b"))

        record = cleanup_on_a(hosts, tmp_path)
        assert record["restored"] and record["residues"] == []
        rows = sorted((r["node"], r["label"], r["action"]) for r in record["left_behind"]["groups"])
        assert rows == [("a", "tp2/telemetry", "stopped"), ("b", "tp2/telemetry", "stopped")]
        for name in ("a", "b"):
            assert group_alive(on[name], marks[name].pgid, marks[name].create_time) == []
        assert outstanding(entries(tmp_path))["groups"] == []
    finally:
        if holder.poll() is None:
            holder.kill()
        kill_planted(pids)
