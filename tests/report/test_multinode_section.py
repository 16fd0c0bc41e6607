"""The report's Nodes section (llmtrial.report.multinode): shown for a configuration across nodes, from
its records only, and absent for a single-host trial."""

from __future__ import annotations

import re

import pytest

import synthetic
from browser import chromium_available, visit
from conftest import DATA
from llmtrial.core.configuration_model import CollectiveSummary, ConfigurationRecord, NodeSample
from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.records import check_record, read_record
from llmtrial.report.multinode import collective_sentence, nodes_context, span_sentence
from llmtrial.report.render import build_context, render_report
from synthetic import as_model, demo, models

DEMO = DATA / "demo"


def context(configurations, preflight=None, manifest=None):
    """The report's context of ``configurations`` (dicts, read as their model) beside the default trial's
    other records, or the preflight and manifest records (dicts) given."""
    return build_context(trial="demo", preflight=as_model("preflight", preflight or read_record(DEMO / "preflight.json")),
                         manifest=as_model("manifest", manifest or read_record(DEMO / "manifest.json")),
                         plans=synthetic.plans(), configurations=models("configuration", configurations),
                         cleanup=demo("cleanup", "cleanup"))


def two_node_context(ok: bool = True):
    return context([read_record(DEMO / "tp1.json"), synthetic.two_node_record("tp2", ok=ok)],
                   synthetic.two_node_preflight(), synthetic.two_node_manifest())


def text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def nodes_section(html: str) -> str:
    return html.split('<h2 id="nodes">', 1)[1].split("<h2", 1)[0]


def test_a_configuration_across_two_nodes_shows_each_node_its_rank_the_check_and_the_traffic():
    html = render_report(two_node_context())
    part = text(nodes_section(html))
    sentence = ("tp2 spans nodes a and b (native launch, master 10.0.0.1:9100); the gloo all-reduce sanity check "
                "took 1.2 s (a median all-reduce of 26.3 ms, 0.64 GB/s bus bandwidth).")
    assert sentence in part and sentence in text(html.split('id="findings"', 1)[1].split("<h2", 1)[0])
    assert 'href="#nodes"' in html
    # the trial's nodes: reach, address, interface, versions from preflight, the weights copy
    assert "a host-a local 10.0.0.1 llmt0 3.11.2 0.32.0 2.13.0+cpu verified" in part
    assert "b host-b ssh 10.0.0.2 llmt0 3.11.2 0.32.0 2.13.0+cpu verified in 2.4 s 6 files" in part
    # per configuration: rank and role, the sanity check, each node's CPU and traffic
    assert "a 0 api server 10.0.0.1 server.log 97.5 % 61.2 % 6.00 GiB 3.24 MiB 48.83 MiB 120" in part
    assert "b 1 headless 10.0.0.2 server-b.log 88.0 % 55.5 % 5.00 GiB 48.64 MiB 3.15 MiB 120" in part
    assert "gloo all-reduce across 2 ranks of 16.00 MiB: took 1.20 s, median all-reduce 26.3 ms" in part
    assert "bus bandwidth 0.638 GB/s" in part and "1 check(s) passed" in part
    assert "tp1 spans" not in html  # the single-host configuration is not listed


def test_a_failed_sanity_check_is_shown_with_its_phase_and_diagnosis():
    html = render_report(two_node_context(ok=False))
    part = text(nodes_section(html))
    assert "failed in all_reduce: rank 1: the all_reduce did not finish within 30 s (gloo timeout)" in part
    assert "the gloo all-reduce sanity check failed in all_reduce: rank 1:" in part


def test_single_host_records_have_no_nodes_section():
    ctx = context([read_record(DEMO / "tp1.json"), read_record(DEMO / "tp2.json")])
    html = render_report(ctx)
    assert ctx.nodes is None and 'id="nodes"' not in html and "#nodes" not in html and " spans nodes " not in html


def test_what_a_record_lacks_is_said_not_invented():
    rec = synthetic.two_node_record()
    del rec["collective"], rec["launch"], rec["telemetry"]["nodes"]
    typed = ConfigurationRecord.model_validate(rec)
    assert span_sentence(typed) == "tp2 spans nodes a and b; no sanity-check collective is recorded."
    ctx = nodes_context([typed], demo("preflight", "preflight"), demo("manifest", "manifest"))
    assert [r.python for r in ctx.rows] == [None, None] and [r.weights for r in ctx.rows] == [None, None]
    assert ctx.configurations[0].nodes[1].telemetry == NodeSample()  # nothing sampled: every figure None
    failed_fetch = {"samples": 0, "error": "node b: samples could not be fetched: ssh could not run cat"}
    rec["telemetry"]["nodes"] = {"file": "nodes.csv", "interval_s": 1.0, "nodes": {"b": failed_fetch}}
    html = render_report(context([rec], synthetic.two_node_preflight(), synthetic.two_node_manifest()))
    assert "node b: samples could not be fetched" in text(nodes_section(html))
    bare = CollectiveSummary(ok=True, world_size=2, backend="gloo", ranks=[], reported=[0, 1], missing=[], size_bytes=None,
                             wall_s=None, median_s=None, algbw_gbps=None, busbw_gbps=None, phase="done", diagnosis=None)
    assert collective_sentence(bare) == "the gloo all-reduce sanity check passed"


def test_the_report_with_two_nodes_opens_offline_and_fits_the_window(tmp_path):
    html = render_report(two_node_context())
    if chromium_available():
        page = visit(atomic_write_text(tmp_path / "report.html", html), tmp_path / "first-screen.png")
        assert page.requests == [] and page.errors == [] and page.too_wide == [], (page.requests, page.errors, page.too_wide)
        assert 'id="nodes"' in page.dom


def test_the_two_node_record_and_its_node_telemetry_pass_the_record_schema():
    rec = synthetic.two_node_record()
    check_record(rec, "configuration")
    del rec["telemetry"]["nodes"]["nodes"]
    with pytest.raises(ValueError, match="telemetry.nodes: 'nodes' is a required property"):
        check_record(rec, "configuration")


@pytest.mark.parametrize(("part", "change", "field"), [
    ("launch", {"kind": "mpi"}, "launch.kind"),
    ("launch", {"nnodes": 1}, "launch.nnodes"),
    ("nodes", {"reach": "telnet"}, "nodes.1.reach"),
    ("collective", {"ok": "yes"}, "collective.ok"),
])
def test_a_broken_multi_node_part_is_refused_naming_its_field(part, change, field):
    """The launch, the nodes and the sanity check are typed parts of the configuration record:
    a record whose parts break their model is a fault of the workflow, named by its field."""
    rec = synthetic.two_node_record()
    (rec[part][1] if part == "nodes" else rec[part]).update(change)
    with pytest.raises(ValueError, match=re.escape(f"{field}: ")):
        check_record(rec, "configuration")
