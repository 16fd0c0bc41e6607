"""Configuration records in the format with sweeps, warm-up passes, adaptive repetition and
goodput, built from a few numbers for the report's tests (the default trial's real records,
tests/data/demo, give everything else: server, start-up, telemetry), and a configuration record
across two nodes with the preflight and manifest parts that go with it. The report reads each record
as its model: :func:`as_model` and :func:`demo` give them so."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from conftest import DATA, written
from llmtrial.answers.ask import accuracy
from llmtrial.answers.grading import grade
from llmtrial.answers.tasks import tasks_digest
from llmtrial.core.answers_model import Answer, AnswerRun, Answers, Task
from llmtrial.core.record_base import RecordModel
from llmtrial.core.record_models import KINDS
from llmtrial.core.records import check_record, load_record, read_record
from llmtrial.host.collective import summarize
from llmtrial.serve.nodetelemetry import NodeSampleRow, node_window_figures

DEMO = DATA / "demo"
SLO = {"ttft_ms": 500, "tpot_ms": 50, "percentile": 90}


def as_model(kind: str, record: Mapping[str, Any]) -> Any:
    """A record of ``kind`` built here (a dict, as a stage writes it) checked against its schema and read as
    its model, as the report reads a record file."""
    check_record(record, kind)
    return KINDS[kind].model_validate(record)


def demo(name: str, kind: str) -> Any:
    """One of the default trial's records (tests/data/demo/<name>.json) read as its model."""
    return load_record(DEMO / f"{name}.json", kind)


def models(kind: str, records: list[Mapping[str, Any]]) -> list[RecordModel]:
    """Each of ``records`` read as its model (:func:`as_model`)."""
    return [as_model(kind, r) for r in records]
KV_TOKENS, BLOCK = 1024, 128


def one_pass(n: int, tok_s: float, *, ttft: float = 120.0, tpot: float = 20.0, status: str = "ok",
             goodput: tuple[float, float] | None = None, requests: int = 12) -> dict[str, Any]:
    """A pass entry as the trial writes it; ``goodput`` is (req/s meeting the target, share)."""
    summary: dict[str, Any] = {"completed": requests, "failed": 0, "output_throughput": tok_s,
                               "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 2.5, "mean_ttft_ms": ttft * 1.1,
                               "median_tpot_ms": tpot, "p99_tpot_ms": tpot * 1.8, "median_itl_ms": tpot,
                               "p99_itl_ms": tpot * 2}
    if goodput is not None:
        rate, share = goodput
        summary["goodput"] = {"targets": {"ttft_ms": 500, "tpot_ms": 50}, "percentile": 90, "request_goodput": rate,
                              "requests_meeting": round(share * requests), "requests": requests, "share": share,
                              "met": share >= 0.9}
    entry = {"pass": n, "seed": 1000 + n, "start": 1.0e9 + 10 * n, "end": 1.0e9 + 10 * n + 8, "status": status,
             "argv": ["python", "-m", "vllm.benchmarks.serve"], "log": f"bench/pass{n}.log", "returncode": 0,
             "timed_out": False, "stall": False, "server_metrics": {"preemptions": 0.0}}
    if status == "ok":
        entry["summary"] = summary
        entry["result_file"] = f"bench/pass{n}.json"
    return entry


def fixed(name: str, concurrency: int, tok_s: list[float], *, goodput: list[tuple[float, float]] | None = None,
          slo: dict[str, Any] | None = None, passes: Any = None, warmup: float | None = None,
          repetition: dict[str, Any] | None = None) -> dict[str, Any]:
    """A scenario entry with passes (new keys: kind, warmup, repetition)."""
    ps = [one_pass(i + 1, t, goodput=goodput[i] if goodput else None) for i, t in enumerate(tok_s)]
    spec = {"concurrency": concurrency, "num_prompts": 12, "input_len": 192, "output_len": 128,
            "passes": passes if passes is not None else len(tok_s), "request_rate": "inf", "timeout_s": 900}
    if slo:
        spec["slo"] = slo
    spread = (max(tok_s) - min(tok_s)) / (sum(tok_s) / len(tok_s))
    return {"name": name, "spec": spec, "kind": "fixed", "pass_results": ps,
            "warmup": {**one_pass(0, warmup), "pass": 0} if warmup is not None else None,
            "repetition": repetition or {"min": len(ps), "max": len(ps), "agreement": None, "passes_run": len(ps),
                                         "spread": spread, "stopped": "fixed"},
            "agreement": {"output_throughput": spread, "median_ttft_ms": 0.0}}


def _compare(pred: dict[str, Any] | None, obs: dict[str, Any] | None) -> dict[str, Any]:
    both = pred is not None and obs is not None
    return {"predicted_step": pred and pred["step"], "predicted_concurrency": pred and pred["concurrency"],
            "observed_step": obs and obs["step"], "observed_concurrency": obs and obs["concurrency"],
            "error_steps": obs["step"] - pred["step"] if both else None,
            "error_requests": obs["in_flight"] - pred["in_flight"] if both else None}


def sweep(name: str, *, concurrency: list[int], preemptions: list[float], kv_peak: list[float], waiting: list[float],
          tok_s: list[float], kv_tokens: int | None = KV_TOKENS, warmup: bool = False) -> dict[str, Any]:
    """A sweep entry: one step per concurrency, its figures, and the onset the planner's rule predicts
    (in flight x blocks per request over the cache's blocks) against the first step that showed it."""
    steps, per_step = [], []
    for i, c in enumerate(concurrency):
        step = {**one_pass(i + 1, tok_s[i], ttft=40.0 * c, tpot=8.0 + 2 * c), "step": i + 1, "concurrency": c,
                "input_len": 192, "output_len": 128, "num_prompts": 4 * c}
        step["server_metrics"]["preemptions"] = preemptions[i]
        step["figures"] = {"preemptions": preemptions[i], "kv_cache_usage_peak": kv_peak[i],
                           "kv_cache_usage_mean": round(kv_peak[i] * 0.7, 3), "running_peak": min(c, 6),
                           "waiting_peak": waiting[i], "output_tok_s": tok_s[i], "ttft_median_ms": 40.0 * c,
                           "ttft_p99_ms": 100.0 * c, "tpot_median_ms": 8.0 + 2 * c, "tpot_p99_ms": 12.0 + 3 * c,
                           "failed": 0}
        steps.append(step)
        per_request = math.ceil((192 + 128) / BLOCK)
        preempts = kv_tokens is not None and c * per_request > kv_tokens // BLOCK
        per_step.append({"step": i + 1, "concurrency": c, "in_flight": c, "blocks_per_request": per_request,
                         "tokens_needed": c * per_request * BLOCK, "predicted_preempts": preempts,
                         "predicted_waits": preempts})
    first = lambda rows, hit: next((r for r in rows if hit(r)), None)  # noqa: E731
    observed = [{"step": s["step"], "concurrency": s["concurrency"], "in_flight": s["concurrency"], **s["figures"]}
                for s in steps]
    onset = {"kv_cache_tokens": kv_tokens, "kv_cache_tokens_source": "server.log:88: CPU KV cache size: 1024 tokens",
             "block_size": BLOCK, "assumption": "Every request of a step is in flight at once and holds its prompt "
             "and its whole output.", "per_step": per_step if kv_tokens else [],
             "preemption": _compare(first(per_step, lambda r: r["predicted_preempts"]),
                                    first(observed, lambda r: r["preemptions"] > 0)),
             "waiting": _compare(first(per_step, lambda r: r["predicted_waits"]),
                                 first(observed, lambda r: r["waiting_peak"] > 0))}
    if not kv_tokens:
        onset["unpredicted"] = "no KV cache size in the server log"
    return {"name": name, "spec": {"concurrency": concurrency, "num_prompts": [4 * c for c in concurrency],
                                   "input_len": 192, "output_len": 128, "passes": 1, "request_rate": "inf"},
            "kind": "sweep", "pass_results": [], "warmup": {**one_pass(0, 9.0), "pass": 0} if warmup else None,
            "steps": steps, "onset": onset}


TP1_SWEEP = {"concurrency": [1, 2, 4, 8], "preemptions": [0, 0, 14, 51], "kv_peak": [0.31, 0.62, 0.99, 1.0],
             "waiting": [0, 0, 2, 5], "tok_s": [30.1, 55.8, 88.2, 84.0]}
TP2_SWEEP = {"concurrency": [1, 2, 4, 8], "preemptions": [0, 0, 0, 9], "kv_peak": [0.16, 0.31, 0.62, 0.99],
             "waiting": [0, 0, 0, 3], "tok_s": [41.0, 77.5, 140.2, 150.3]}
TP1_SLO = {"tok_s": [400.0, 410.0, 417.0], "goodput": [(1.10, 0.92), (1.23, 0.95), (1.18, 0.93)]}
TP2_SLO = {"tok_s": [450.0, 500.0, 470.0, 520.0, 460.0, 490.0],
           "goodput": [(0.80, 0.70), (0.85, 0.71), (0.82, 0.72), (0.90, 0.74), (0.78, 0.69), (0.84, 0.71)]}
ADAPTIVE = {"min": 2, "max": 6, "agreement": 0.10}


def records() -> list[dict[str, Any]]:
    """tp1 and tp2 of the default trial with three scenarios in the new format: c1 (fixed, two
    passes), slo4 (a latency target, a warm-up pass, passes until they agree: tp1 agrees after 3,
    tp2 reaches the maximum 6) and the sweep ``ramp`` (tp1 preempts where predicted, tp2 a step late)."""
    out = []
    for name, slo_figs, sweep_figs in (("tp1", TP1_SLO, TP1_SWEEP), ("tp2", TP2_SLO, TP2_SWEEP)):
        rec = copy.deepcopy(read_record(DEMO / f"{name}.json"))
        c1 = rec["scenarios"][0]
        c1.update({"kind": "fixed", "warmup": None})
        n = len(slo_figs["tok_s"])
        spread = (max(slo_figs["tok_s"]) - min(slo_figs["tok_s"])) / (sum(slo_figs["tok_s"]) / n)
        rep = {**ADAPTIVE, "passes_run": n, "spread": spread, "stopped": "agreed" if n < 6 else "max_reached"}
        slo = fixed("slo4", 4, slo_figs["tok_s"], goodput=slo_figs["goodput"], slo=SLO, passes=ADAPTIVE,
                    warmup=5.0, repetition=rep)
        rec["scenarios"] = [c1, slo, sweep("ramp", **sweep_figs, warmup=name == "tp1")]
        out.append(rec)
    return out


def plans() -> list[Any]:
    """The default trial's plans of tp1 and tp2, as their model."""
    return [demo(f"plan-{n}", "plan") for n in ("tp1", "tp2")]


# ------------------------------------------------ a configuration across two nodes

MiB = 2**20


def collective(ok: bool = True, wall_s: float = 1.2) -> dict[str, Any]:
    """The sanity check's record as llmtrial.host.collective.summarize makes it from two ranks' results."""
    ranks = [{"rank": r, "world_size": 2, "backend": "gloo", "ok": ok, "median_s": 0.0262 + 0.0001 * r,
              "size_bytes": 16 * MiB, "torch": "2.13.0+cpu", "python": "3.11.2"} for r in (0, 1)]
    if not ok:
        ranks[1].update(phase="all_reduce", median_s=None, error="gloo timeout",
                        diagnosis="the all_reduce did not finish within 30 s (gloo timeout)")
        ranks[0].update(ok=True)
    out = summarize(ranks)
    out["wall_s"] = wall_s
    return out


def two_node_record(name: str = "tp2", *, ok: bool = True) -> dict[str, Any]:
    """The demo's ``name`` record as the trial writes it for a configuration across nodes a and b."""
    rec = copy.deepcopy(read_record(DEMO / f"{name}.json"))
    rec["nodes"] = [
        {"name": "a", "rank": 0, "role": "api server", "address": "10.0.0.1", "reach": "local", "interface": "llmt0",
         "model_dir": "/staging/tiny", "log": "server.log"},
        {"name": "b", "rank": 1, "role": "headless", "address": "10.0.0.2", "reach": "ssh", "interface": "llmt0",
         "model_dir": "/staging-b/tiny", "log": "server-b.log", "stop": {"signals": ["SIGTERM"], "survivors": []}}]
    rec["launch"] = {"kind": "native", "nnodes": 2, "master_addr": "10.0.0.1", "master_port": 9100}
    rec["collective"] = collective(ok)
    node = {"samples": 120, "interval_s": 0.5, "first": 1.0e9, "last": 1.0e9 + 60, "load1_peak": 1.5}
    rec["telemetry"]["nodes"] = {"file": "nodes.csv", "interval_s": 0.5, "nodes": {
        "a": {**node, "interface": "llmt0", "cpu_percent_peak": 97.5, "cpu_percent_mean": 61.25,
              "mem_used_peak_bytes": 6 * 2**30, "net_rx_bytes": 3_400_000, "net_tx_bytes": 51_200_000},
        "b": {**node, "interface": "llmt0", "cpu_percent_peak": 88.0, "cpu_percent_mean": 55.5,
              "mem_used_peak_bytes": 5 * 2**30, "net_rx_bytes": 51_000_000, "net_tx_bytes": 3_300_000}}}
    for scenario in rec["scenarios"]:  # each pass: the nodes' samples in its window, as the trial reads them
        for one in scenario["pass_results"]:
            start, end = one["window"]["start"], one["window"]["end"]
            rows = [NodeSampleRow(time=start + i * (end - start) / 3, node=n, cpu_percent=50.0 + i, mem_used_bytes=2**30,
                            load1=1.0, net_rx_bytes=1000 * i, net_tx_bytes=2000 * i) for n in ("a", "b") for i in range(4)]
            one["node_telemetry"] = {n: f.model_dump(exclude_unset=True)
                                     for n, f in node_window_figures(rows, start, end).items()}
    return rec


def two_node_preflight() -> dict[str, Any]:
    """The demo's preflight record with crossnode.preflight_nodes' part for nodes a and b."""
    rec = copy.deepcopy(read_record(DEMO / "preflight.json"))
    facts = {"python_version": "3.11.2", "vllm": "0.32.0", "torch": "2.13.0+cpu", "ray": None,
             "interface": {"name": "llmt0", "exists": True, "addresses": []}}
    rec["nodes"] = {"master": {"address": "10.0.0.1", "port": 9100},
                    "nodes": {"a": {"node": {"name": "a", "reach": "local"}, **facts, "hostname": "host-a"},
                              "b": {"node": {"name": "b", "reach": "ssh"}, **facts, "hostname": "host-b"}},
                    "checks": [{"name": "same_versions", "status": "ok", "detail": "equal on a, b"}]}
    return rec


def two_node_manifest() -> dict[str, Any]:
    rec = copy.deepcopy(read_record(DEMO / "manifest.json"))
    rec["nodes"] = {"a": {"model_dir": "/staging/tiny", "files": 6, "bytes": 9_000_000, "copy_s": 0.0,
                          "verified": True, "reused": False, "copied_from": None},
                    "b": {"model_dir": "/staging-b/tiny", "files": 6, "bytes": 9_000_000, "copy_s": 2.4,
                          "verified": True, "reused": False, "copied_from": "a"}}
    return rec


# ------------------------------------------------ answers to a task set

#: Three tasks with known answers, one per category, for answers parts built here.
TASKS = [Task(id=1, prompt="What is 12 * 11?", expected="132", grader="number", category="multiplication", source="t:1"),
         Task(id=2, prompt="What is 205 + 695?", expected="900", grader="number", category="addition", source="t:2"),
         Task(id=3, prompt="The capital of France?", expected="Paris", grader="contains", category="fact", source="t:3")]


def answer_run(texts: list[str], *, launch: str = "passes", flag: bool = True, repeat_identical: int | None = 3,
               failure: str | None = None) -> AnswerRun:
    """One asking of :data:`TASKS` answered ``texts``, graded as the trial grades; ``flag``: the demo
    patch's flag in that server; a ``failure`` has no answers."""
    answers = [Answer(task=t.id, category=t.category, text=x, token_ids=[ord(c) for c in x], sha256=None,
                      finish_reason="stop", output_tokens=len(x), correct=grade(x, t.expected, t.grader), seconds=0.2)
               for t, x in zip(TASKS, texts, strict=True)] if failure is None else []
    own = {"server_log": "answers-flags-off.log", "ready_s": 21.5} if launch == "flags_off" else {}
    return AnswerRun(launch=launch, flags={"demo-worker-log": flag}, started=1.0, seconds=0.6,
                     repeat=2 if repeat_identical is not None else 1, repeat_identical=repeat_identical, answers=answers,
                     accuracy=accuracy(TASKS, answers) if answers else [], failure=failure, **own)


def answers_part(*runs: AnswerRun) -> dict:
    """A configuration record's ``answers`` (as written) with ``runs``."""
    return written(Answers(api="chat", max_tokens=16, seed=0, temperature=0.0, tasks_sha256=tasks_digest(TASKS),
                           tasks=TASKS, runs=list(runs)))
