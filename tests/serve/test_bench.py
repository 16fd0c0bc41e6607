"""Benchmark glue: vLLM benchmark argv, seeds, result summaries, /metrics parsing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import DATA, CompletionsDouble, loopback, wait_until
from llmtrial.core.ledger import Ledger
from llmtrial.core.records import check_record, read_record
from llmtrial.core.trial_config import ScenarioBlock
from llmtrial.host.nodes import local_node
from llmtrial.host.process_groups import group_members, stop_recorded_groups
from llmtrial.serve.bench import (
    bench_argv,
    first_request,
    output_rate,
    pass_seed,
    rate_summary,
    request_gaps,
    request_output_rates,
    stall_flag,
    summarize_result,
)
from llmtrial.serve.bench_worker import BenchWorker, SharedWorker
from llmtrial.serve.datasets import JobScenario, PassLoad
from llmtrial.serve.scenarios import RequestDetail
from llmtrial.weights.tiny import generate_tiny_model

pytestmark = pytest.mark.stale_sources  # starts vLLM's benchmark client, which a multi-node trial's stale-process check reports

SCENARIO = JobScenario(ScenarioBlock(input_len=64, output_len=32, num_prompts=12, concurrency=4, request_rate="inf"))


def argv(**kw):
    args = dict(host="127.0.0.1", port=8100, served_model_name="tiny", tokenizer="/staged/tiny",
                scenario=SCENARIO, load=PassLoad.at(SCENARIO.block), seed=1001, result_dir="/r", result_filename="c1-pass1.json",
                percentiles=[50, 99.9], python="py")
    args.update(kw)
    return bench_argv(**args)


def value(a: list[str], flag: str) -> str:
    return a[a.index(flag) + 1]


def test_bench_argv_runs_vllm_serving_benchmark_on_random_data_with_detail():
    a = argv()
    assert a[:3] == ["py", "-m", "llmtrial.serve.vllm_bench"]
    assert value(a, "--dataset-name") == "random"
    assert value(a, "--random-input-len") == "64" and value(a, "--random-output-len") == "32"
    assert value(a, "--max-concurrency") == "4" and value(a, "--num-prompts") == "12"
    assert value(a, "--seed") == "1001" and value(a, "--tokenizer") == "/staged/tiny"
    assert value(a, "--metric-percentiles") == "50,99.9"
    for flag in ("--ignore-eos", "--save-result", "--save-detailed"):
        assert flag in a


@pytest.mark.slow
def test_vllm_accepts_the_bench_argv():
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    ns = parser.parse_args(argv()[3:])
    assert ns.ignore_eos and ns.save_detailed and ns.seed == 1001 and ns.max_concurrency == 4


def test_every_pass_of_every_scenario_has_its_own_seed():
    seeds = {pass_seed(1000, s, p) for s in range(5) for p in range(1, 6)}
    assert len(seeds) == 25


def test_summary_of_a_real_vllm_result_file():
    result = json.loads((DATA / "vllm-0.32.0-bench-result.json").read_text())
    s = summarize_result(result, [50, 90, 99])
    assert s.completed == result["completed"] and s.failed == result["failed"] == 0
    assert s.median_ttft_ms == result["median_ttft_ms"] and s.p99_itl_ms == result["p99_itl_ms"]
    assert s.output_throughput == result["output_throughput"]
    assert s.total_output_tokens == sum(result["output_lens"])
    assert "ttfts" not in s.model_dump()  # per-request arrays stay in the result file
    # but each request's latency and inter-token gaps are kept, in ms: the samples of E2EL and ITL
    assert s.request_e2el_ms == [round(v * 1000, 3) for v in result["latencies"]]
    assert s.request_itl_ms == [round(g * 1000, 3) for gaps in result["itls"] for g in gaps]


def test_a_failed_request_has_no_gaps_nor_latency_of_its_own():
    detail = RequestDetail.model_validate({"ttfts": [0.01, 0.0], "latencies": [0.05, 0.0], "output_lens": [3, 0],
                                           "itls": [[0.02, 0.02], []], "errors": ["", "timeout"]})
    assert request_gaps(detail) == ([20.0, 20.0], [50.0])


def test_a_mean_far_above_the_median_is_a_stall():
    assert stall_flag(30.0, 10.0)
    assert not stall_flag(11.0, 10.0)
    assert not stall_flag(None, 10.0) and not stall_flag(5.0, 0.0)


def test_each_streams_own_output_throughput_from_a_real_vllm_result_file():
    result = json.loads((DATA / "vllm-0.32.0-bench-result.json").read_text())
    s = summarize_result(result, [50])
    rates = s.request_output_tok_s
    assert len(rates) == result["completed"] == 32
    assert rates[0] == round(result["output_lens"][0] / result["latencies"][0], 3) == 264.226
    assert rates == [round(n / t, 3) for n, t in zip(result["output_lens"], result["latencies"], strict=True)]
    summary = s.request_output_tok_s_summary
    assert summary.model_dump() == {"n": 32, "min": min(rates), "median": summary.median, "max": max(rates)}
    assert summary.min <= summary.median <= summary.max
    record = read_record(DATA / "demo" / "tp1.json")
    record["scenarios"][0]["pass_results"][0]["summary"] = s.model_dump(mode="json", exclude_unset=True)
    check_record(record, "configuration")
    broken = json.loads(json.dumps(record))
    broken["scenarios"][0]["pass_results"][0]["summary"]["request_output_tok_s_summary"] = {"n": 1}
    with pytest.raises(ValueError, match="request_output_tok_s_summary"):
        check_record(broken, "configuration")


def test_failed_and_zero_latency_requests_have_no_throughput_of_their_own():
    result = {"output_lens": [128, 128, 0, 128], "latencies": [29.09, 29.29, 0.0, 29.3],
              "errors": ["", "", "timeout", "boom"]}
    assert request_output_rates(RequestDetail.model_validate(result)) == [4.4, 4.37]
    assert rate_summary([4.4, 4.37, 4.37, 4.37]).model_dump() == {"n": 4, "min": 4.37, "median": 4.37, "max": 4.4}
    assert rate_summary([]).model_dump() == {"n": 0, "min": None, "median": None, "max": None}
    # a result file without per-request detail
    assert request_output_rates(RequestDetail.model_validate({"completed": 3})) == []


def test_the_first_request_counts_the_streamed_chunks_that_carry_text(completions_server):
    host, port = completions_server
    first = first_request(host, port, model="m", prompt="Hi", max_tokens=5, timeout=60)
    assert first.chunks == 5 and 0 < first.ttft_s <= first.total_s
    assert output_rate(first.chunks, first.total_s) == round(5 / first.total_s, 3)
    assert output_rate(5, 0.0) is None and output_rate(None, 1.0) is None


# One benchmark worker, real vLLM benchmark code, against loopback doubles of the server.

SMALL = JobScenario(ScenarioBlock(input_len=16, output_len=8, num_prompts=4, concurrency=2, request_rate="inf"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny model's folder: vLLM's benchmark loads its tokenizer to build the random prompts."""
    return generate_tiny_model(tmp_path_factory.mktemp("bench-tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def double():
    with loopback(CompletionsDouble) as address:
        yield address


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One worker for the module's tests: importing vLLM's benchmark takes about 10 s."""
    with BenchWorker(log_path=tmp_path_factory.mktemp("bench-worker") / "worker.log") as w:
        yield w


def small_argv(address, tokenizer, out, name, **flags):
    host, port = address
    a = bench_argv(host=host, port=port, served_model_name="tiny", tokenizer=str(tokenizer), scenario=SMALL, load=PassLoad.at(SMALL.block),
                   seed=7, result_dir=str(out), result_filename=f"{name}.json", percentiles=[50, 99])
    for flag, v in flags.items():
        a[a.index(f"--{flag.replace('_', '-')}") + 1] = v
    return a


@contextlib.contextmanager
def silent_server() -> Iterator[socket.socket]:
    """A loopback server that accepts connections (the kernel does) and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        yield silent


def gone(pid):
    return not psutil.pid_exists(pid) and not group_members(pid)


@pytest.mark.slow
def test_two_passes_through_one_worker_write_their_own_results_and_logs(worker, double, tokenizer, tmp_path):
    runs = [worker.run(small_argv(double, tokenizer, tmp_path, name), log_path=tmp_path / f"{name}.log", timeout=120)
            for name in ("first", "second")]
    assert [(r.returncode, r.timed_out) for r in runs] == [(0, False), (0, False)]
    assert runs[0].start < runs[0].end <= runs[1].start < runs[1].end
    assert worker.starts == 1 and worker.import_s > 0
    for name, other in (("first", "second"), ("second", "first")):
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["completed"] == result["num_prompts"] == SMALL.block.num_prompts
        assert result["output_throughput"] > 0 and len(result["ttfts"]) == SMALL.block.num_prompts
        log = (tmp_path / f"{name}.log").read_text()
        assert log.count("Serving Benchmark Result") == 1
        assert f"result_filename='{name}.json'" in log and f"{other}.json" not in log
    assert "Serving Benchmark Result" not in worker.log_path.read_text()


@pytest.mark.slow
def test_a_pass_through_the_worker_does_not_depend_on_the_passes_before_it(worker, double, tokenizer, tmp_path):
    """Same seed, same prompts, whatever ran in the worker in between (so the record's
    standalone argv reruns the pass the worker ran)."""
    lens = []
    for name, seed in (("a", "11"), ("b", "12"), ("again", "11")):
        argv = small_argv(double, tokenizer, tmp_path, name, seed=seed) + ["--random-range-ratio", "0.5"]
        assert worker.run(argv, log_path=tmp_path / f"{name}.log", timeout=120).returncode == 0
        lens.append(json.loads((tmp_path / f"{name}.json").read_text())["input_lens"])
    assert lens[0] == lens[2] != lens[1]


@pytest.mark.slow
def test_a_failed_pass_is_reported_in_its_log_and_the_worker_goes_on(worker, double, tokenizer, tmp_path):
    bad_flag = worker.run(small_argv(double, tokenizer, tmp_path, "bad", dataset_name="nosuch"),
                          log_path=tmp_path / "bad.log", timeout=120)
    raised = worker.run(small_argv(double, tokenizer, tmp_path, "raised", max_concurrency="0"),
                        log_path=tmp_path / "raised.log", timeout=120)
    starts = worker.starts
    ok = worker.run(small_argv(double, tokenizer, tmp_path, "ok"), log_path=tmp_path / "ok.log", timeout=120)
    assert (bad_flag.returncode, bad_flag.timed_out) == (2, False)  # argparse's exit code
    assert "invalid choice: 'nosuch'" in (tmp_path / "bad.log").read_text()
    assert raised.returncode == 1
    log = (tmp_path / "raised.log").read_text()
    assert "Traceback" in log and "ValueError: --max-concurrency must be greater than 0" in log
    assert ok.returncode == 0 and (tmp_path / "ok.json").exists() and worker.starts == starts
    assert not (tmp_path / "bad.json").exists() and not (tmp_path / "raised.json").exists()


@pytest.mark.slow
def test_a_pass_past_its_timeout_kills_the_worker_and_the_next_starts_a_fresh_one(worker, double, tokenizer, tmp_path):
    warm = worker.run(small_argv(double, tokenizer, tmp_path, "warm"), log_path=tmp_path / "warm.log", timeout=120)
    assert warm.returncode == 0  # the worker has imported: the timeout below is the pass's own
    pid, starts = worker.proc.pid, worker.starts
    with silent_server() as silent:
        hung = worker.run(small_argv(silent.getsockname(), tokenizer, tmp_path, "hung"),
                          log_path=tmp_path / "hung.log", timeout=5)
    assert (hung.returncode, hung.timed_out) == (None, True)
    assert hung.end - hung.start >= 5  # killed at its timeout, not before: the silent server never answers
    assert gone(pid) and worker.proc is None
    assert "timed out after 5 s" in (tmp_path / "hung.log").read_text()
    after = worker.run(small_argv(double, tokenizer, tmp_path, "after"), log_path=tmp_path / "after.log", timeout=120)
    assert after.returncode == 0 and (tmp_path / "after.json").exists()
    assert worker.starts == starts + 1 and worker.proc.pid != pid


@pytest.mark.slow
def test_close_ends_the_worker_and_leaves_no_process_behind(worker):
    worker.start()
    pid = worker.proc.pid
    worker.close()
    assert gone(pid) and worker.proc is None
    worker.close()  # twice is harmless


def fake_worker(tmp_path: Path, text: str) -> str:
    """A stand-in for the worker's interpreter: a shell script BenchWorker runs as ``python``."""
    fake = tmp_path / "python"
    fake.write_text(text)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return str(fake)


#: A double of the worker process (named by BenchWorker's ``python``): it says it is ready,
#: reads one request and exits 5 without answering.
DYING_WORKER = """#!/bin/sh
echo '{"ready": true, "import_s": 0.5}'
read request
exit 5
"""


def test_a_worker_that_dies_mid_pass_gives_its_exit_code_and_is_replaced(tmp_path):
    argv = ["py", "-m", "llmtrial.serve.vllm_bench", "--num-prompts", "1"]
    with BenchWorker(log_path=tmp_path / "worker.log", python=fake_worker(tmp_path, DYING_WORKER)) as w:
        first = w.run(argv, log_path=tmp_path / "p1.log", timeout=30)
        assert (first.returncode, first.timed_out) == (5, False) and w.proc is None
        assert "exited with code 5" in (tmp_path / "p1.log").read_text()
        second = w.run(argv, log_path=tmp_path / "p2.log", timeout=30)
    assert second.returncode == 5 and w.starts == 2 and w.import_s == 1.0
    with pytest.raises(ValueError, match="not a benchmark pass"):
        w.run(["py", "-m", "other"], log_path=tmp_path / "p3.log", timeout=30)



#: Doubles of the worker process: one that never finishes importing, one that is ready and then never
#: answers a pass (its server hung). Each ignores the end of its stdin, as vLLM's import and a pass do.
IMPORTING_WORKER = """#!/bin/sh
exec sleep 600
"""
SILENT_WORKER = """#!/bin/sh
echo '{"ready": true, "import_s": 0.5}'
exec sleep 600
"""


class Stopped(Exception):
    """What SIGTERM becomes in a trial job (llmtrial.serve.measure.sigterm_as_exit raises SystemExit)."""


@pytest.mark.parametrize("text", [IMPORTING_WORKER, SILENT_WORKER], ids=["importing", "mid-pass"])
def test_a_job_stopped_early_kills_its_worker_without_waiting_out_the_grace(tmp_path, text):
    """A job stopped while its worker imports (vLLM still starting) or runs a pass must stop its server
    soon (Snakemake's and cleanup's SIGTERM give it seconds): close() kills such a worker at once instead of
    giving it the idle worker's grace to exit, which it would spend in full (it reads no stdin then)."""
    w = BenchWorker(log_path=tmp_path / "worker.log", python=fake_worker(tmp_path, text), close_timeout=3600)
    w.start()
    pid = w.proc.pid
    if text == SILENT_WORKER:
        def stop(signum, frame):
            raise Stopped

        previous = signal.signal(signal.SIGALRM, stop)
        signal.alarm(1)
        try:
            with pytest.raises(Stopped):  # the job is stopped in the middle of the pass
                w.run(["py", "-m", "llmtrial.serve.vllm_bench"], log_path=tmp_path / "p1.log", timeout=600)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    began = time.monotonic()
    w.close()
    assert gone(pid) and w.proc is None
    assert time.monotonic() - began < 1800  # the grace, an hour, was not waited out (whatever the machine's load)

#: A trial job's stand-in that starts a benchmark worker and hangs in one pass until it is killed.
JOB_WITH_A_WORKER = Path(__file__).parents[1] / "programs" / "job_with_a_worker.py"


@pytest.mark.slow  # a real worker: it imports vLLM's benchmark code
def test_a_worker_mid_pass_ends_when_the_job_that_started_it_is_killed(tokenizer, tmp_path):
    """In its own session the worker is out of the job's process group, so a kill of the job does not reach
    it, and mid-pass it does not read the stdin whose end would tell it; it ends with the job all the same
    (it asked the kernel for SIGTERM when its parent dies)."""
    kill_job_mid_pass(tokenizer, tmp_path)


def kill_job_mid_pass(tokenizer, tmp_path: Path, *shared: str) -> int:
    """Run tests/programs/job_with_a_worker.py (``shared``: its socket name and ledger) until its pass reaches a
    server that never answers, kill -9 the job, and wait for its worker's end; the job's pid."""
    with silent_server() as silent:
        argv = small_argv(silent.getsockname(), tokenizer, tmp_path, "hung")
        job = subprocess.Popen([sys.executable, str(JOB_WITH_A_WORKER), str(tmp_path / "worker.log"), json.dumps(argv),
                                *shared], stdout=subprocess.PIPE, text=True)
        try:
            pid = int(job.stdout.readline())
            silent.settimeout(120)
            held, _ = silent.accept()  # the pass has reached the server: the worker is mid-pass
        finally:
            job.kill()
            job.wait(timeout=30)
        with held:  # open, unanswered, until the worker is gone: its pass would wait on it for hours
            wait_until(lambda: gone(pid), "the worker's end after its job's", timeout=60)
    return job.pid


# --------------------------------------------------------------------------- one worker for a trial's configurations


def shared_spec(tmp_path: Path, owner: int) -> SharedWorker:
    """A trial's shared worker, as a configuration's job describes it: its socket, the trial's ledger, this host."""
    return SharedWorker(name=f"llmtrial-bench-test-{os.getpid()}-{tmp_path.name}", ledger=Ledger(tmp_path / "ledger.jsonl"),
                        node=local_node(), label="t/benchmark worker", owner=owner,
                        log_path=tmp_path / "logs" / "benchmark-worker.log")


def cleanup_stops(spec: SharedWorker) -> list[str]:
    """What the trial's cleanup does with the worker's ledger entry: stop its group; each outcome."""
    launches = [e for e in spec.ledger.entries() if e.action == "group_launch"]
    residues: list = []
    stopped = stop_recorded_groups(launches, spec.ledger, 10.0, residues)
    assert residues == []
    return [row["action"] for row in stopped]


@pytest.mark.slow
def test_two_configurations_run_their_passes_in_one_shared_worker_that_cleanup_stops(double, tokenizer, tmp_path):
    spec = shared_spec(tmp_path, os.getpid())
    jobs = [BenchWorker(log_path=tmp_path / name / "worker.log", shared=spec) for name in ("tp1", "tp2")]
    runs = []
    for name, job in zip(("tp1", "tp2"), jobs, strict=True):
        with job:  # each configuration's job closes it at its end
            runs.append(job.run(small_argv(double, tokenizer, tmp_path, name), log_path=tmp_path / f"{name}.log",
                                timeout=120))
    assert [(r.returncode, r.timed_out) for r in runs] == [(0, False), (0, False)]
    assert all(json.loads((tmp_path / f"{n}.json").read_text())["completed"] == 4 for n in ("tp1", "tp2"))
    assert (jobs[0].starts, jobs[1].starts) == (1, 0) and jobs[0].import_s > 0 and jobs[1].import_s is None
    [pid] = jobs[0].pids
    assert jobs[1].pids == [pid] and not gone(pid)  # left listening for the next configuration
    [launch] = [e for e in spec.ledger.entries() if e.action == "group_launch"]  # written before it started
    assert launch.label == "t/benchmark worker" and launch.argv[-2:] == ["--listen", spec.name]
    assert cleanup_stops(spec) == ["stopped"]
    wait_until(lambda: gone(pid), "the stopped worker reaped (its parent is init's)", timeout=60)


@pytest.mark.slow
def test_a_shared_pass_past_its_timeout_kills_the_worker_and_the_next_configuration_starts_one(double, tokenizer,
                                                                                             tmp_path):
    spec = shared_spec(tmp_path, os.getpid())
    with BenchWorker(log_path=tmp_path / "worker.log", shared=spec) as first:
        assert first.run(small_argv(double, tokenizer, tmp_path, "warm"), log_path=tmp_path / "warm.log",
                         timeout=120).returncode == 0
        [pid] = first.pids
        with silent_server() as silent:
            hung = first.run(small_argv(silent.getsockname(), tokenizer, tmp_path, "hung"),
                             log_path=tmp_path / "hung.log", timeout=5)
    assert (hung.returncode, hung.timed_out) == (None, True)
    wait_until(lambda: gone(pid), "the killed worker reaped (its parent is init's)", timeout=60)
    assert f"its worker (process group {pid}) was killed" in (tmp_path / "hung.log").read_text()
    with BenchWorker(log_path=tmp_path / "worker.log", shared=spec) as second:
        after = second.run(small_argv(double, tokenizer, tmp_path, "after"), log_path=tmp_path / "after.log",
                           timeout=120)
    assert after.returncode == 0 and second.starts == 1 and second.pids != [pid]
    assert cleanup_stops(spec) == ["stopped", "none (already gone)"]  # newest first: the second, then the killed one


@pytest.mark.slow
def test_a_shared_worker_ends_once_its_owner_the_runs_snakemake_has_ended(double, tokenizer, tmp_path):
    owner = subprocess.Popen(["sleep", "600"])
    try:
        spec = shared_spec(tmp_path, owner.pid)
        with BenchWorker(log_path=tmp_path / "worker.log", shared=spec) as job:
            assert job.run(small_argv(double, tokenizer, tmp_path, "one"), log_path=tmp_path / "one.log",
                           timeout=120).returncode == 0
            [pid] = job.pids
        assert not gone(pid)
    finally:
        owner.kill()
        owner.wait(timeout=30)  # reaped: a zombie owner counts as ended too, but its pid could not be reused
    wait_until(lambda: gone(pid), "the shared worker's end after its owner's", timeout=60)
    assert f"its owner {owner.pid} ended" in spec.log_path.read_text()
    assert cleanup_stops(spec) == ["none (already gone)"]


@pytest.mark.slow  # a real worker: it imports vLLM's benchmark code
def test_a_shared_worker_mid_pass_ends_when_the_configurations_job_is_killed(tokenizer, tmp_path):
    """The shared worker outlives the jobs that use it, so it does not die with the one that started it; but one
    killed mid-pass leaves a pass benchmarking a server that is going away: the worker ends then, and the next
    configuration starts a fresh one."""
    spec = shared_spec(tmp_path, os.getpid())
    job = kill_job_mid_pass(tokenizer, tmp_path, spec.name, str(spec.ledger.path))
    assert f"the pass's client {job} ended mid-pass" in (tmp_path / "pass.log").read_text()  # the pass's output
    assert cleanup_stops(spec) == ["none (already gone)"]
