"""The default trial end to end with real vLLM (CPU build), plus configurations that fail.

One session-scoped run (a few minutes) is shared by every test here. The default trial's own
configurations are left out of it: tests/workflow/test_rerun.py runs the default trial (eager) and
checks tp1's and tp2's figures on its first run, so this run does not serve them a second time. It
serves pp2, the suite's one configuration served with torch.compile, with the demo patch's flag.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from browser import PNG_MAGIC, chromium_available, visit
from conftest import REPO, free_base_port
from llmtrial.cli import main
from llmtrial.core.ledger import Ledger
from llmtrial.export.br_validate import validate_report
from llmtrial.export.exports import FORMAT_DIR
from llmtrial.host.process_groups import group_members, port_open
from llmtrial.logs.lines import read_log
from llmtrial.logs.startup_phases import PHASES
from llmtrial.patch.patching import revert_patches, verify_files
from llmtrial.serve.telemetry import read_samples
from workflow_helpers import (
    assert_snakemake_report_bundles,
    assert_stopped_as_its_passes_say,
    default_config,
    demo_service,
    job_counts,
    snakemake,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.workflow]

BASE_PORT = 18300
BAD = "badarg"
#: Configurations the test adds to the default trial: an uneven pipeline split, an invalid
#: flag, one the planner rejects, and the same one forced past the planner.
EXTRA = {
    "pp2": {"description": "Pipeline parallel 2 with an uneven split, 3 layers then 1; the demo patch's flag on.",
            "args": {"pipeline_parallel_size": 2},
            "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_PP_LAYER_PARTITION": "3,1",
                    "LLMTRIAL_DEMO_WORKER_LOG": "1"}},
    BAD: {"description": "A flag vLLM does not know: must become a failure record.",
          "args": {"not_a_vllm_flag": 1}},
    "tp3": {"description": "4 heads do not divide over 3 ranks: the planner rejects it.",
            "args": {"tensor_parallel_size": 3}, "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1|0"}},
    "tp3force": {"description": "The same, forced past the planner to reproduce vLLM's error.",
                 "args": {"tensor_parallel_size": 3}, "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1|0"}, "force": True},
}
LAUNCHED = ["pp2", BAD, "tp3force"]
COST = {"price": 0.90, "per": "host_hour", "currency": "EUR", "note": "example price of this box"}


@pytest.fixture(scope="session")
def trial(tmp_path_factory):
    work = tmp_path_factory.mktemp("trial")
    config = default_config()
    config["configurations"] = dict(EXTRA)  # tp1 and tp2: served and checked by test_rerun's first run
    config["serving"]["base_port"] = free_base_port(BASE_PORT, len(config["configurations"]))
    # pp2 is served compiled: vLLM 0.32's CPU build with pipeline parallel and enforce_eager fails its first
    # request ("assert self.intermediate_tensors is not None" in sync_and_gather_intermediate_tensors)
    # host samples every 0.5 s: pp2's c1 passes (about 2 s here) usually hold a few, though nothing promises
    # any (test_host_telemetry_covers_startup_and_every_pass checks what each window holds)
    config["telemetry"]["interval_s"] = 0.5
    for spec in config["scenarios"].values():  # two or three passes: what these tests check holds at any count
        spec["passes"].update(min=2, max=3)
        spec["num_prompts"] //= 2  # 6 and 16: pipeline parallel on two cores serves slowly, and no count is under test
    del config["outputs"]  # answers: test_rerun's first run and tests/answers check them
    config["cost"] = COST  # priced per host-hour: every configuration here runs on this one host
    demo_port = free_base_port(BASE_PORT + 90, 1)
    config["services"] = {"demo-web": demo_service(work / "demo", demo_port)}
    subprocess.run(config["services"]["demo-web"]["start"], check=True, timeout=60)  # the host's resident service
    write_config(work, config)
    t0 = time.time()
    run = snakemake(work, "--cores", "all", timeout=1800)
    elapsed = time.time() - t0
    results = work / "results" / "demo"
    print(f"default trial took {elapsed:.0f} s", file=sys.stderr)
    yield {"work": work, "run": run, "results": results, "config": config, "demo_port": demo_port}
    try:  # the service the fixture started is stopped by it, and nothing else holds its port
        stop = subprocess.run(config["services"]["demo-web"]["stop"], capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert subprocess.run(config["services"]["demo-web"]["status"], timeout=60).returncode == 3
        assert not port_open("127.0.0.1", demo_port), f"port {demo_port} still answers after the demo service's stop"
    finally:
        revert_patches(Ledger(results / "ledger.jsonl"))  # whatever happened, vLLM is not left patched


def record(trial, name):
    return json.loads((trial["results"] / "configs" / name / "record.json").read_text())


def test_the_workflow_finishes_despite_a_failed_configuration(trial):
    run = trial["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (trial["results"] / "report.html").exists()


@pytest.mark.parametrize("name,kv_tokens", [("pp2", 699_008)])
def test_each_configuration_has_real_startup_and_benchmark_numbers(trial, name, kv_tokens):
    rec = record(trial, name)
    assert rec["status"] == "ok", rec["failure"]
    startup = rec["startup"]
    # 1 GiB of KV per worker; 4 layers x 2 KV heads x 64 x 2 (K,V) x 2 bytes = 2 KiB per token,
    # split by TP; under PP the stage with 3 of the 4 layers sets the count (in 128-token blocks)
    assert startup["kv_cache_tokens"]["value"] == kv_tokens
    assert startup["kv_cache_tokens"]["source"].startswith("server.log:")
    assert startup["max_concurrency_tokens_per_request"]["value"] == 512
    assert startup["engine_init_seconds"]["value"] > 0
    assert startup["vllm_version"]["value"] == "0.32.0"
    # the cold start's figures are what its own times give (how long they were is the machine's business)
    cold, server = rec["cold_start"], rec["server"]
    assert server["launched_at"] < server["ready_at"]
    assert cold["ready_seconds"]["value"] == pytest.approx(server["ready_at"] - server["launched_at"], abs=6e-4)
    assert 0 < cold["first_ttft_s"]["value"] <= cold["first_total_s"]["value"]
    assert cold["first_output_tokens"]["value"] >= 1  # the first token's chunk is what its TTFT timed
    assert cold["first_output_tok_s"]["value"] == round(
        cold["first_output_tokens"]["value"] / cold["first_total_s"]["value"], 3)
    assert [s["name"] for s in rec["scenarios"]] == ["c1", "c4"]
    seeds = set()
    for sc in rec["scenarios"]:
        spec = trial["config"]["scenarios"][sc["name"]]
        rule = spec["passes"]  # {min, max, agreement}: passes until they agree
        assert (sc["repetition"]["min"], sc["repetition"]["max"]) == (rule["min"], rule["max"])
        assert_stopped_as_its_passes_say(sc)  # agreed or max_reached, as its own pass values say
        for p in sc["pass_results"]:
            assert p["status"] == "ok"
            s = p["summary"]
            assert s["completed"] == spec["num_prompts"] and s["failed"] == 0
            assert s["total_output_tokens"] == spec["num_prompts"] * spec["output_len"]  # ignore_eos
            assert s["median_ttft_ms"] > 0 and s["p99_itl_ms"] > 0 and s["output_throughput"] > 0
            detail = json.loads((trial["results"] / "configs" / name / p["result_file"]).read_text())
            assert len(detail["ttfts"]) == spec["num_prompts"]  # per-request detail kept
            seeds.add(p["seed"])
    assert len(seeds) == sum(len(sc["pass_results"]) for sc in rec["scenarios"])
    # the start-up in its phases, in start-up order, from the log's stamps; with the time before the log they
    # make up the launch-to-ready time (unless the log's span, in whole seconds, came out longer)
    phases = rec["startup_phases"]
    names = [p["name"] for p in phases]
    assert names == [n for n in PHASES if n in names] and {"weights", "API server start"} <= set(names)
    assert all(p["source"].startswith("server.log:") for p in phases if p["name"] != "before the log")
    if names[0] == "before the log":
        assert sum(p["seconds"] for p in phases) == pytest.approx(cold["ready_seconds"]["value"], abs=1e-3)
    assert rec["compile_cache"]  # what the start-up did with vLLM's compile cache, in words
    # one benchmark process for the whole trial (whichever configuration's job started it), every pp2 pass in it
    timings = {n: record(trial, n)["timing"] for n in LAUNCHED}
    assert sum(t["bench_workers"] for t in timings.values()) == 1, timings
    [pid] = rec["timing"]["bench_worker_pids"]
    launches = [e for e in Ledger(trial["results"] / "ledger.jsonl").entries() if e.action == "group_launch"]
    assert [e.label for e in launches] == ["demo/benchmark worker"]
    # its import is timed by the job that started it where that job read its ready line (one that failed at
    # start-up had no pass to wait for it)
    assert all(t["bench_import_s"] is None or (t["bench_import_s"] > 0 and t["bench_workers"] == 1)
               for t in timings.values())
    assert rec["server"]["stop"]["port_closed"] and rec["server"]["stop"]["survivors"] == []


@pytest.mark.parametrize("name", ["pp2"])
def test_the_plan_predicted_what_vllm_logged(trial, name):
    rec = record(trial, name)
    plan = json.loads((trial["results"] / "plans" / f"{name}.json").read_text())
    assert plan["verdict"] == "fits" and rec["plan"]["verdict"] == "fits"
    row = next(r for r in rec["prediction"] if r["name"] == "KV cache tokens")
    assert row["predicted"] == plan["plan"]["predicted_kv_cache_tokens"]
    assert row["measured"] == rec["startup"]["kv_cache_tokens"]["value"]
    assert abs(row["relative_error"]) < 0.001


def test_a_rejected_configuration_is_not_launched(trial):
    rec = record(trial, "tp3")
    assert rec["status"] == "skipped" and rec["plan"]["verdict"] == "does_not_fit"
    assert any("must be divisible by tensor parallel size (3)" in r for r in rec["plan"]["reasons"])
    labels = [e.label for e in Ledger(trial["results"] / "ledger.jsonl").entries()]
    server_log = trial["results"] / "configs" / "tp3" / "server.log"
    assert "demo/tp3" not in labels and (not server_log.exists() or server_log.stat().st_size == 0)


def test_a_forced_configuration_reproduces_vllms_error(trial):
    rec = record(trial, "tp3force")
    assert rec["plan"]["forced"] and rec["status"] == "failed" and rec["failure"]["phase"] == "startup"
    assert rec["failure"]["error_line"]["pattern"] == "tp_divisibility"


def test_preflight_record_lists_environment_and_checks(trial):
    pre = json.loads((trial["results"] / "preflight" / "record.json").read_text())
    assert pre["environment"]["key_packages"]["vllm-cpu"] == "0.32.0"
    assert pre["environment"]["gpus"]["present"] is False
    assert {c["name"] for c in pre["checks"]} >= {"allocator", "dev_shm", "open_files", "disk_headroom"}
    assert pre["disk"]["ok"]


@pytest.mark.parametrize("name", ["pp2"])
def test_server_counters_line_up_with_each_pass(trial, name):
    """The /metrics series over a pass's window counts exactly the benchmark's own tokens."""
    for sc in record(trial, name)["scenarios"]:
        for p in sc["pass_results"]:
            assert p["telemetry"]["deltas"]["metrics.generation_tokens_total"] == p["summary"]["total_output_tokens"]
            assert p["server_metrics"]["generation_tokens"] == p["summary"]["total_output_tokens"]
            assert p["server_metrics"]["requests_finished"] == p["summary"]["completed"]
            assert p["server_metrics"]["preemptions"] == 0


@pytest.mark.parametrize("name", ["pp2"])
def test_host_telemetry_covers_startup_and_every_pass(trial, name):
    rec = record(trial, name)
    df = read_samples(trial["results"] / "configs" / name / "telemetry.csv")
    assert {"cpu_percent", "mem_used_bytes", "tree_rss_bytes"} <= set(df["metric"])
    assert {"generation_tokens_total", "kv_cache_usage", "running"} <= set(df[df.source == "metrics"]["metric"])
    marks = set(df[df.source == "window"]["metric"])
    passes = {f"{sc['name']}-pass{p['pass']}" for sc in rec["scenarios"] for p in sc["pass_results"]}
    warmups = {f"{sc['name']}-warmup" for sc in rec["scenarios"] if sc["warmup"]}  # the default trial warms up each
    assert len(warmups) == len(rec["scenarios"]) == 2
    assert {f"{w}:{edge}" for w in passes | warmups for edge in ("start", "end")} == marks
    sw = rec["telemetry"]["startup_window"]
    assert sw["summary"]["host.tree_rss_bytes"]["max"] > 100 * 2**20
    # the host is sampled on its schedule only (not at a window's edges), so how many samples fall inside a
    # pass depends on how long the pass took: each pass's summary holds exactly the CSV's samples in its window
    rss = df[(df.source == "host") & (df.metric == "tree_rss_bytes") & df.value.notna()]
    for sc in rec["scenarios"]:
        for p in sc["pass_results"]:
            inside = rss[(rss.t >= p["window"]["start"]) & (rss.t <= p["window"]["end"])]
            got = p["telemetry"]["summary"].get("host.tree_rss_bytes")
            assert (got["n"], got["max"]) == (len(inside), inside.value.max()) if got else inside.empty
            assert p["window"]["start"] >= sw["end"]
    sources = rec["telemetry"]["sources"]
    assert sources["host"]["status"] == sources["metrics"]["status"] == "sampled"
    assert sources["nvml"]["status"] == "absent" and sources["nvml"]["reason"]
    assert rec["telemetry"]["sampler"]["host"]["errors"] == 0
    assert rec["telemetry"]["sampler"]["host"]["cpu_seconds_per_sample"] > 0


def test_an_invalid_argument_becomes_a_failure_record(trial):
    rec = record(trial, BAD)
    assert rec["status"] == "failed"
    f = rec["failure"]
    assert f["phase"] == "startup" and f["reason"] == "exited" and f["returncode"] == 2
    assert f["error_line"]["pattern"] == "argparse"
    assert "unrecognized arguments: --not-a-vllm-flag" in f["error_line"]["line"]
    assert f["error_line"]["source"].startswith("server.log:")
    assert f["log_tail"] and rec["scenarios"] == []


def test_the_report_shows_every_configuration_scenario_and_failure(trial):
    html = (trial["results"] / "report.html").read_text()
    for text in ("pp2", BAD, "Scenario c1", "Scenario c4", "unrecognized arguments: --not-a-vllm-flag",
                 "vllm-cpu", "0.32.0", "699,008", "tp3: the planner said does_not_fit",
                 "Prediction against measurement", "forced past the planner", "Start-up phases"):
        assert text in html, text
    pp2 = record(trial, "pp2")
    median = pp2["scenarios"][1]["pass_results"][0]["summary"]["median_ttft_ms"]
    assert f"{median:,.2f}" in html
    # the first screen ranks every launched configuration and gives the others their one-line diagnosis
    top = html.split('<h2 id="charts">', 1)[0]
    assert f"{BAD} failed in startup:" in top and "tp3 not launched: the planner said does_not_fit" in top
    assert "pp2" in top and "tp3force failed in startup" in top
    # self-contained: no scripts, no stylesheets or images fetched from anywhere
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)


def test_the_report_prices_each_configuration_from_the_provenance_record_and_says_no_energy_was_measured(trial):
    provenance = json.loads((trial["results"] / "provenance.json").read_text())
    assert provenance["cost"] == COST  # the price the report's (and an exporter's) cost figures read
    html = (trial["results"] / "report.html").read_text()
    for name in ("pp2",):
        rec = record(trial, name)
        assert rec["telemetry"]["sources"]["rapl"]["status"] == "absent"  # no /sys/class/powercap here
        for sc in rec["scenarios"]:
            table = html.split(f"<h3>Scenario {sc['name']} ", 1)[1].split("</table>", 1)[0]
            assert "cost per million output tokens" in table and "EUR, lower is better" in table
            assert "energy per output token" not in table
            # by hand: 0.90 EUR an hour for the one host, over each pass's output tok/s x 3600, per million
            by_hand = statistics.median(0.90 * 1 / (p["summary"]["output_throughput"] * 3600) * 1e6
                                        for p in sc["pass_results"] if p["status"] == "ok")
            row = next(r for r in table.split("<tr") if f"<b>{name}</b>" in r)
            assert f"{by_hand:,.3f}" in row
    gaps = html.split('<h2 id="not-measured">', 1)[1].split("</ul>", 1)[0]
    assert "No GPU energy was measured (no GPU), so no configuration has an energy per output token." in gaps
    assert re.search(r"CPU package energy \(RAPL\) was not measured: [^<]*\(pp2", gaps)


def test_the_exports_hold_a_valid_benchmark_report_per_configuration_and_scenario_that_ran(trial, tmp_path, capsys):
    """The workflow's rule export (part of the default target): llm-d's Benchmark Report v0.2 of each launched
    configuration x scenario, none for those that never reached a scenario; `llmtrial export` writes the same."""
    folder = trial["results"] / "exports" / FORMAT_DIR
    written = {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*.json"))}
    assert sorted(written) == ["pp2/c1.json", "pp2/c4.json"]
    for name, text in written.items():
        report = validate_report(json.loads(text), source=name)
        configuration, scenario = name.removesuffix(".json").split("/")
        passes = [p for p in next(s for s in record(trial, configuration)["scenarios"] if s["name"] == scenario)
                  ["pass_results"] if p["status"] == "ok"]
        ttft = [v for p in passes for v in p["summary"]["request_ttft_ms"]]
        got = report.results.request_performance.aggregate.latency.time_to_first_token
        assert (got.units, got.p50) == ("ms", pytest.approx(statistics.median(ttft)))
        perf = report.results.request_performance  # every request's gaps, latency and send time, as vLLM kept them
        assert perf.aggregate.latency.inter_token_latency.p99 is not None
        assert perf.aggregate.latency.request_latency.p99 is not None
        assert len(perf.time_series.latency.request_latency.series) == len(ttft)
        assert report.scenario.stack[0].standardized.accelerator.parallelism.pp == 2
        assert report.results.component_health[0].replica_health[0].healthy is True
    log = (trial["results"] / "logs" / "export.log").read_text()
    assert f"{BAD}: no Benchmark Report: it failed before any scenario ran" in log
    assert "tp3: no Benchmark Report: the planner rejected it and it was not launched" in log
    assert main(["export", str(trial["results"]), "--out", str(tmp_path)]) == 0
    again = tmp_path / FORMAT_DIR
    assert {p.relative_to(again).as_posix(): p.read_text() for p in sorted(again.rglob("*.json"))} == written
    capsys.readouterr()


@pytest.mark.skipif(not chromium_available(), reason="chromium not installed (make test installs it)")
def test_the_report_renders_offline_in_headless_chromium(trial):
    """Opened with the network off: it asks for nothing, logs no error, and its first screen is
    kept next to it for a person to look at."""
    shot = trial["results"] / "report-first-screen.png"
    page = visit(trial["results"] / "report.html", shot)
    assert page.requests == [], page.requests
    assert page.errors == [], page.errors
    assert "demo" in page.title
    assert page.dom.count("<table") >= 8 and page.dom.count("<svg") >= 5
    assert "Serving trial: demo" in page.dom and "What the trial found" in page.dom
    png = shot.read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000


def test_snakemake_report_bundles_the_report_every_record_and_the_rule_graph(trial):
    """`snakemake --report` after the trial (one configuration failed, one skipped): nothing is missing."""
    zip_path = trial["results"] / "snakemake-report.zip"
    out = snakemake(trial["work"], "--cores", "1", "--report", str(zip_path), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    bundled = assert_snakemake_report_bundles(trial["work"], zip_path, "demo", list(trial["config"]["configurations"]))
    for name in (BAD, "tp3"):
        assert f"results/demo/configs/{name}/record.json" in bundled["files"]


def test_cleanup_left_nothing_running(trial):
    cleanup = json.loads((trial["results"] / "cleanup" / "record.json").read_text())
    assert cleanup["restored"] and cleanup["residues"] == []
    n = len(trial["config"]["configurations"])
    assert {p["port"] for p in cleanup["ports"]} == {trial["config"]["serving"]["base_port"] + i for i in range(n)}
    started = [e for e in Ledger(trial["results"] / "ledger.jsonl").entries() if e.action == "server_started"]
    assert sorted(e.label for e in started) == sorted(f"demo/{c}" for c in LAUNCHED)
    stores = {}  # the file each start-up's engine met its workers through, as its log names it
    for e in started:
        assert group_members(e.pgid, not_before=e.launched_at) == []
        assert not port_open("127.0.0.1", e.port)
        assert e.scratch and not Path(e.scratch).exists()  # its temporary folder, named in the ledger
        log = trial["results"] / "configs" / e.label.removeprefix("demo/") / "server.log"
        stores[e.label] = re.findall(r"distributed_init_method=file://(\S+)", log.read_text() if log.exists() else "")
        assert all(Path(store).parent == Path(e.scratch) for store in stores[e.label]), (e.scratch, stores[e.label])
    assert len(stores["demo/pp2"]) == 2 and len(set(stores["demo/pp2"])) == 1  # its two ranks name its one store file


def test_the_resident_service_was_quieted_during_the_trial_and_restored(trial):
    entries = Ledger(trial["results"] / "ledger.jsonl").entries()
    actions = [e.action for e in entries]
    quiet_at = actions.index("service_quiet")
    assert entries[quiet_at].was_running and quiet_at < actions.index("server_launch")
    assert actions.index("service_restored") > max(i for i, a in enumerate(actions) if a == "server_stopped")
    [row] = json.loads((trial["results"] / "cleanup" / "record.json").read_text())["services"]
    assert row["name"] == "demo-web" and row["was_running"] and row["down"] and row["healthy"]
    assert port_open("127.0.0.1", trial["demo_port"])
    html = (trial["results"] / "report.html").read_text()
    assert "demo-web" in html and "healthy</span> after" in html


def test_a_second_cleanup_changes_nothing(trial):
    out = snakemake(trial["work"], "cleanup", "--cores", "1")
    assert out.returncode == 0, out.stderr
    record = json.loads((trial["results"] / "cleanup" / "on-demand.json").read_text())
    assert record["restored"] and record["services_restored"] == [] and record["jobs"] == []
    assert record["patches_reverted"] == []
    assert all(s["action"] == "none (already stopped)" for s in record["servers"])
    assert port_open("127.0.0.1", trial["demo_port"])


def test_the_demo_patch_ran_only_where_its_flag_was_set_and_was_reverted(trial):
    """The default trial's patch changes vLLM's CPU worker in place (mode file); pp2 sets its flag, and each of
    pp2's two CPU workers logs the patch's line. (test_rerun's first run checks tp2, whose flag is unset.)"""
    patched = json.loads((trial["results"] / "patches" / "record.json").read_text())
    [patch] = patched["patches"]
    [f] = patch["files"]
    assert patch["name"] == "demo-worker-log" and patch["mode"] == "file" and patch["flag"] == "LLMTRIAL_DEMO_WORKER_LOG"
    assert f["path"] == "vllm/v1/worker/cpu_worker.py" and f["record_hash"] == f["before_hash"] != f["after_hash"]
    [on] = record(trial, "pp2")["patches"]["patches"]
    assert on["flag_on"] and on["observed"] and on["as_expected"]
    lines = sorted(on["lines"], key=lambda one: one["process"])  # one per CPU worker, each in a process of its own
    assert [one["process"] for one in lines] == ["Worker_PP0", "Worker_PP1"]
    pp2_log = read_log(trial["results"] / "configs" / "pp2" / "server.log").split("\n")  # lines as sed counts them
    for rank, one in enumerate(lines):
        assert f"llmtrial patch demo-worker-log active: CPU worker rank {rank}" in one["line"]
        assert "llmtrial patch demo-worker-log active" in pp2_log[int(one["source"].split(":")[1]) - 1]
    line = on["lines"][0]  # the report shows the first in the log, whichever worker logged first
    cleanup = json.loads((trial["results"] / "cleanup" / "record.json").read_text())
    [row] = cleanup["patches"]
    assert row["target"] == f["file"] and row["after_hash"] == f["after_hash"]
    assert row["applied_at"] < row["reverted_at"] and row["matches_record"] and row["revert_outcome"] == "restored from backup"
    assert all(v["matches"] for v in verify_files([f["path"]]))
    html = (trial["results"] / "report.html").read_text()
    for text in ("vLLM patches", "demo-worker-log", "LLMTRIAL_DEMO_WORKER_LOG", f["after_hash"], f["record_hash"],
                 "matches RECORD", "restored from backup", line["source"]):
        assert text in html, text


def test_a_finished_trial_has_nothing_left_to_do(trial):
    out = snakemake(trial["work"], "-n")
    assert out.returncode == 0 and "Nothing to be done" in out.stdout + out.stderr


def test_editing_one_configuration_reruns_only_it(trial, tmp_path):
    config = json.loads(json.dumps(trial["config"]))
    config["configurations"]["pp2"]["args"]["max_num_seqs"] = 8
    path = tmp_path / "edited.yaml"
    path.write_text(json.dumps(config))
    out = snakemake(trial["work"], "-n", configfile=path)
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == {"plan": 1, "trial": 1, "cleanup_trial": 1, "report": 1, "export": 1, "all": 1}
    assert "configuration=pp2" in out.stdout and f"configuration={BAD}" not in out.stdout and "configuration=tp3force" not in out.stdout


def test_forcing_one_configuration_runs_only_it(trial):
    out = snakemake(trial["work"], "-n", "--force", "results/demo/configs/pp2/record.json")
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == {"trial": 1}


def test_overhead_benchmark_reads_the_records(trial):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "overhead.py"), str(trial["results"])],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "orchestration overhead" in out.stdout and "pp2" in out.stdout


def test_the_terminal_shows_each_configurations_phases_the_report_and_the_host(trial):
    """What a person running the trial sees besides Snakemake's job lines, checked against the records."""
    out = trial["run"].stdout + trial["run"].stderr
    results = trial["results"]
    pp2 = record(trial, "pp2")
    log = results / "configs" / "pp2" / "server.log"
    assert f"pp2: launching vLLM on 127.0.0.1:{pp2['server']['port']} (its log: {log.relative_to(trial['work'])})" in out
    assert "pp2: start-up: model initialised in" in out and "pp2: start-up: engine initialised" in out
    kv = pp2["startup"]["kv_cache_tokens"]
    ready = re.search(r"pp2: ready after ([\d.]+) s; (.+) \((server\.log:\d+)\)", out)
    assert ready and ready.group(3) == kv["source"] and ready.group(2) in kv["line"]
    assert ready.group(2).startswith("CPU KV cache size: 699,008 tokens")
    assert abs(float(ready.group(1)) - pp2["cold_start"]["ready_seconds"]["value"]) < 0.1
    for sc in pp2["scenarios"]:
        for one in sc["pass_results"]:
            assert f"pp2: {sc['name']} pass {one['pass']}: {one['summary']['output_throughput']:,.1f} output tok/s" in out
        rep = sc["repetition"]
        assert f"pp2: {sc['name']}: {rep['passes_run']} pass(es), stopped because" in out
    assert f"pp2: ok in {pp2['timing']['wall_s']:.0f} s; its record: results/demo/configs/pp2/record.json" in out
    assert f"{BAD}: FAILED in startup (exited)" in out and "tp3: not launched, the planner says it cannot work" in out
    # the run's last lines: the report, its first screen, the host given back
    findings = (results / "findings.txt").read_text().splitlines()
    assert f"llmtrial: report: {(results / 'report.html').resolve()}" in out
    statuses = [record(trial, name)["status"] for name in trial["config"]["configurations"]]
    assert f"llmtrial:   {findings[0]}" in out
    assert findings[0].startswith(f"{statuses.count('ok')} of {len(statuses)} serving configurations completed; "
                                  f"{statuses.count('failed')} failed; {statuses.count('skipped')} not launched")
    assert "llmtrial: host restored: yes (demo-web running and healthy)" in out


def test_a_new_price_reruns_only_the_report_and_the_exports(trial, tmp_path):
    config = json.loads(json.dumps(trial["config"]))
    config["cost"]["price"] = 1.25
    path = tmp_path / "repriced.yaml"
    path.write_text(json.dumps(config))
    out = snakemake(trial["work"], "-n", configfile=path)
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == {"report": 1, "export": 1, "all": 1}  # both quote the price
