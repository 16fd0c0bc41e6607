"""The default trial's tp1 (its real records, tests/data/records/demo-default) against another tool's runs of
the same kind of server: vLLM's own benchmark CLI (``vllm bench serve``) run by this test against a real CPU
server of a tiny model served as the trial serves it, its result files converted to Benchmark Reports v0.2 by
llm-d's package CLI (``benchmark-report``) as llm-d-benchmark's harness converts them, with the harness's
run metadata (the model, the benchmark's arguments) beside them.

One server, three runs (about a minute and a half here): two of the trial's c1 workload (64 tokens in, 32 out,
concurrency 1) and one asking 16 output tokens. What is asserted holds whatever this machine's speed: which
pairs get a verdict, by which test, and what makes a pair not comparable; never which side was faster.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import free_base_port
from llmtrial.cli import main
from llmtrial.core.records import load_record
from llmtrial.core.vllm_install import VLLM_CLI
from llmtrial.serve.server import ServerProcess
from llmtrial.weights.tiny import generate_tiny_model
from workflow_helpers import default_config

pytestmark = [pytest.mark.e2e, pytest.mark.aside]  # a server and ports of its own; nothing on the host changes

DEMO = Path(__file__).parents[1] / "data" / "records" / "demo-default"
BIN = Path(sys.executable).parent
SERVED = "tiny-llama"  # the trial's served model name
RUNS = {"c1-out32-a": (32, 1), "c1-out32-b": (32, 2), "c1-out16": (16, 1)}  # name -> (output length, seed)




def bench_argv(port: int, tokenizer: Path, out: Path, name: str, output_len: int, seed: int) -> list[str]:
    return [sys.executable, "-c", VLLM_CLI, "bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}",
            "--model", SERVED, "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", "64",
            "--random-output-len", str(output_len), "--ignore-eos", "--num-prompts", "12", "--max-concurrency", "1",
            "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.json"]


def harness_args(output_len: int) -> str:
    """The benchmark's arguments as llm-d-benchmark's harness records them (run_metadata.yaml, harness_args)."""
    return (f"--dataset-name random --random-input-len 64 --random-output-len {output_len} --ignore-eos "
            "--num-prompts 12 --max-concurrency 1")


def convert(raw: Path, report: Path, output_len: int, span: tuple[float, float], work: Path) -> None:
    """llm-d's package CLI on one result file, in llm-d-benchmark's harness environment (run-only: the run's
    metadata file names the model, the benchmark's arguments and when it ran; no cluster)."""
    meta = work / f"meta-{raw.stem}"
    meta.mkdir()
    start, end = (datetime.datetime.fromtimestamp(t, tz=datetime.UTC).isoformat() for t in span)
    (meta / "run_metadata.yaml").write_text(yaml.safe_dump({
        "model": SERVED, "harness_args": harness_args(output_len), "harness_start": start, "harness_stop": end,
        "harness_delta": f"PT{span[1] - span[0]:.3f}S"}))
    env = {**os.environ, "LLMDBENCH_MAGIC_ENVAR": "1", "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR": str(meta)}
    report.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(BIN / "benchmark-report"), str(raw), str(report), "-w", "vllm-benchmark", "-b", "0.2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and report.is_file(), done.stderr[-2000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("vllm-bench")
    model = generate_tiny_model(work / "model", seed=0)
    port = free_base_port(18600, 1)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            SERVED, "--host", "127.0.0.1", "--port", str(port), "--no-enable-prefix-caching", "--max-model-len", "512",
            "--dtype", "bfloat16", "--enforce-eager"]
    raw = work / "raw"
    with ServerProcess(argv, host="127.0.0.1", port=port, log_path=work / "server.log",
                       env=default_config()["serving"]["env"]) as server:
        server.wait_ready(timeout=600)
        spans = {}
        for name, (output_len, seed) in RUNS.items():
            start = time.time()
            done = subprocess.run(bench_argv(port, model, raw, name, output_len, seed), capture_output=True, text=True,
                                  timeout=600)
            spans[name] = (start, time.time())
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    folders = {"raw": raw, "out32": work / "reports-out32", "out16": work / "reports-out16"}
    for name, (output_len, _seed) in RUNS.items():
        convert(raw / f"{name}.json", folders[f"out{output_len}"] / f"{name}.yaml", output_len, spans[name], work)
    trial = work / "demo"
    subprocess.run(["cp", "-r", str(DEMO), str(trial)], check=True)
    return {**folders, "trial": trial}


def compared(runs, b: Path, *extra: str) -> dict:
    assert main(["compare", str(runs["trial"]), str(b), "--configuration", "tp1", "--scenario", "c1", *extra]) == 0
    return json.loads((runs["trial"] / "comparison" / (b.stem if b.suffix else b.name) / "comparison.json").read_text())


def rows(record: dict) -> dict[str, dict]:
    return {r["figure"]: r for r in record["rows"]}


def test_the_package_converts_vllm_bench_runs_into_reports_that_state_the_trials_workload(runs):
    [report] = [yaml.safe_load(p.read_text()) for p in runs["out16"].iterdir()]
    load = report["scenario"]["load"]["standardized"]
    assert load["tool"] == "vllm-benchmark" and load["concurrency"] == 1
    assert (load["input_seq_len"]["value"], load["output_seq_len"]["value"]) == (64, 16)
    assert report["scenario"]["stack"][0]["standardized"]["model"]["name"] == SERVED
    raw = json.loads((runs["raw"] / "c1-out16.json").read_text())
    latency = report["results"]["request_performance"]["aggregate"]["latency"]
    assert latency["time_to_first_token"]["p50"] == raw["median_ttft_ms"]
    assert latency["inter_token_latency"]["p99"] == raw["p99_itl_ms"]


def test_two_runs_of_the_same_workload_get_a_verdict_tested_over_runs(runs):
    record = compared(runs, runs["out32"])
    assert record["workloads_match"] and record["b"]["kind"] == "benchmark report"
    assert "converted" not in record["b"]["tool"]  # reports, read as they are
    found = rows(record)
    assert set(found) >= {"output_tok_s", "ttft_median_ms", "itl_median_ms", "e2el_median_ms"}
    out = found["output_tok_s"]
    assert out["against"] == "reports-out32/c1" and len(out["a"]["values"]) == 6 and len(out["b"]["values"]) == 2
    assert out["verdict"] in ("faster", "slower", "no detectable difference", "unresolved")
    assert out["test"].startswith("over runs, 6 in A against 2 in B")
    assert out["low"] is not None and out["low"] <= out["ratio"] <= out["high"]
    page = (runs["trial"] / "comparison" / "reports-out32" / "comparison.html").read_text()
    assert "against B's reports-out32/c1" in page and "test: over runs, 6 in A against 2 in B" in page


def test_one_run_gets_a_verdict_that_says_it_rests_on_the_trials_spread(runs):
    record = compared(runs, runs["out32"] / "c1-out32-a.yaml")
    out = rows(record)["output_tok_s"]
    assert out["verdict"] != "not comparable" and out["low"] is not None
    assert out["test"].startswith("one run in B against 6 in A") and "trust it only as far as" in out["test"]


def test_a_run_with_another_output_length_is_not_comparable_naming_it(runs):
    record = compared(runs, runs["out16"])
    assert not record["workloads_match"]
    out = rows(record)["output_tok_s"]
    assert out["verdict"] == "not comparable" and out["ratio"] is None
    assert "output length (fixed 32 against fixed 16)" in out["reason"]
    assert any("no verdict" in s and "output length (fixed 32 against fixed 16)" in s for s in record["sentences"])


def test_the_raw_result_file_converted_here_says_what_vllm_bench_alone_does_not_state(runs):
    record = load_record(Path(_written(runs, runs["raw"] / "c1-out32-a.json")), "comparison")
    assert "converted by llm-d's package from vllm-benchmark result files" in (record.b.tool or "")
    [out] = [r for r in record.rows if r.figure == "output_tok_s"]
    assert out.verdict == "not comparable"
    assert "model (not stated by B)" in out.reason and "output length (not stated by B)" in out.reason


def _written(runs, b: Path) -> Path:
    compared(runs, b)
    return runs["trial"] / "comparison" / b.stem / "comparison.json"
