"""One serving configuration's job: start vLLM, measure cold start, run every scenario, stop.

The outcome is always a record. A server that fails to start, times out, or dies during
the benchmark gives ``status: failed`` with the phase, the log tail and the line that
explains it; only faults of the workflow itself raise.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import statistics
import time
from pathlib import Path
from typing import Any, Mapping

import psutil

from llmtrial import bench, logs
from llmtrial.cleanup import ensure_quiet
from llmtrial.ledger import Ledger
from llmtrial.manifest import verify_manifest
from llmtrial.patching import ensure_patched, evidence, server_env
from llmtrial.plan import predict_kv_tokens
from llmtrial.records import fact, read_record, redact_env, write_record
from llmtrial.server import ServerProcess, ServerStartError, build_server_argv
from llmtrial.telemetry import (
    CSV_HEADER,
    HostSource,
    MetricsSource,
    Sampler,
    describe_sources,
    job_sources,
    read_samples,
    window_figures,
)

log = logging.getLogger(__name__)

#: Per-pass server counters (deltas of the /metrics series over the pass's window).
SERVER_COUNTERS = {
    "preemptions": "preemptions_total",
    "prompt_tokens": "prompt_tokens_total",
    "generation_tokens": "generation_tokens_total",
    "requests_finished": "requests_finished_total",
}


def agreement(values: list[float]) -> float | None:
    """Spread of a figure across passes, (max - min) / mean; None with fewer than two."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2 or statistics.fmean(vals) == 0:
        return None
    return (max(vals) - min(vals)) / statistics.fmean(vals)


@contextlib.contextmanager
def sigterm_as_exit():
    """Turn SIGTERM (Snakemake stopping a job) into SystemExit so ``finally`` blocks run
    and the server's process group is stopped before the job goes."""
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_configuration(
    *,
    trial: str,
    spec: Mapping[str, Any],
    manifest: Mapping[str, Any],
    plan: Mapping[str, Any],
    services: Mapping[str, Any],
    served_model_name: str,
    scenarios: Mapping[str, Mapping[str, Any]],
    bench_settings: Mapping[str, Any],
    cold_start: Mapping[str, Any],
    telemetry_interval: float,
    out_dir: Path,
    record_path: Path,
    telemetry_path: Path,
    server_log: Path,
    ledger_path: Path,
    patches: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one configuration end to end and write its record; returns the record.

    ``patches`` is the trial's ``patches`` config: they are applied again first when a
    cleanup reverted them, the plugin folder goes on the server's PYTHONPATH, and the record
    says per patch whether its flag was on and which processes logged its behaviour."""
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_dir = out_dir / "bench"
    shutil.rmtree(bench_dir, ignore_errors=True)  # never mix passes of an earlier run
    bench_dir.mkdir(parents=True)
    server_log.unlink(missing_ok=True)
    model_dir = manifest["model_dir"]
    host, port = spec["host"], int(spec["port"])
    argv = build_server_argv(model_dir=model_dir, served_model_name=served_model_name,
                             host=host, port=port, args=spec["args"])
    record: dict[str, Any] = {
        "trial": trial,
        "configuration": spec["name"],
        "description": spec.get("description", ""),
        "status": "running",
        "failure": None,
        "server": {"argv": argv, "env": redact_env(spec["env"]), "host": host, "port": port,
                   "log": _rel(server_log, out_dir)},
        "startup": {},
        "cold_start": {},
        "scenarios": [],
        "telemetry": {"file": _rel(telemetry_path, out_dir)},
        "timing": {"job_start": time.time()},
        "plan": {"verdict": plan["verdict"], "reasons": plan["reasons"], "forced": bool(spec.get("force"))},
        "prediction": [],
    }
    if plan["verdict"] == "does_not_fit" and not spec.get("force"):
        log.warning("%s not launched: the planner says it cannot work: %s", spec["name"], "; ".join(plan["reasons"]))
        record["status"] = "skipped"
        record["timing"]["job_end"] = time.time()
        record["timing"]["wall_s"] = record["timing"]["job_end"] - record["timing"]["job_start"]
        telemetry_path.write_text(",".join(CSV_HEADER) + "\n")
        write_record(record_path, record, schema="configuration")
        return record
    missing = verify_manifest(manifest, hashes=False)
    if missing:
        raise FileNotFoundError(
            f"the staged model is not all there ({'; '.join(missing[:3])}): a finished trial's cleanup archives "
            "or deletes it when model.weights.after says so; restage it with `snakemake --forcerun stage_model`")
    requiet = ensure_quiet(ledger_path.parent, dict(services), ports=[port], host=host)
    if requiet is not None:
        record["services_requieted"] = requiet["services"]
    ledger = Ledger(ledger_path)
    patched = ensure_patched(dict(patches or {}), ledger=ledger, work_dir=ledger_path.parent / "patches")
    env = server_env(spec["env"], patched["plugin_dir"], patched["patches"])
    record["server"]["env"] = redact_env(env)
    job = ledger.append("job_started", label=f"{trial}/{spec['name']}", pid=os.getpid(),
                        create_time=psutil.Process().create_time())
    host_source = HostSource()
    sources, absent = job_sources(host_source, MetricsSource(host, port))
    server = ServerProcess(argv, host=host, port=port, log_path=server_log, env=env,
                           ledger=ledger, stop_timeout=float(spec["stop_timeout_s"]),
                           label=f"{trial}/{spec['name']}")
    windows: list[tuple[dict[str, Any], float, float]] = []
    with sigterm_as_exit(), Sampler(telemetry_path, sources, interval=telemetry_interval) as sampler:
        try:
            _serve_and_measure(record, server, host_source, sampler, spec, served_model_name, model_dir,
                               scenarios, bench_settings, cold_start, bench_dir, out_dir, windows)
        finally:
            sampler.retire("metrics")  # the server is going away: its /metrics with it
            record["server"]["stop"] = server.stop()
            record["server"]["pid"] = server.proc.pid if server.proc else None
        record["telemetry"]["sampler"] = sampler.stats()
        record["telemetry"]["errors"] = dict(sampler.errors)
        record["telemetry"]["sources"] = describe_sources(sources, absent, sampler)
    _summarize_telemetry(record, telemetry_path, server, windows)
    _finish(record, server_log, out_dir)
    record["patches"] = {"reapplied": patched["reapplied"], "plugin_dir": patched["plugin_dir"], "patches": evidence(
        patched["patches"], logs.read_log(server_log) if server_log.exists() else "", env, record["server"]["log"])}
    record["prediction"] = compare_with_plan(plan, record["startup"])
    write_record(record_path, record, schema="configuration")
    ledger.append("job_finished", label=f"{trial}/{spec['name']}", pid=os.getpid(), undoes=job["id"])
    return record


def _serve_and_measure(record: dict[str, Any], server: ServerProcess, host_source: HostSource, sampler: Sampler,
                       spec: Mapping[str, Any], served_model_name: str, model_dir: str,
                       scenarios: Mapping[str, Mapping[str, Any]], bench_settings: Mapping[str, Any],
                       cold_start: Mapping[str, Any], bench_dir: Path, out_dir: Path,
                       windows: list[tuple[dict[str, Any], float, float]]) -> None:
    log_name = record["server"]["log"]
    host, port = server.host, server.port
    try:
        server.start()
        host_source.pid = server.proc.pid if server.proc else None
        ready_s = server.wait_ready(float(spec["startup_timeout_s"]))
    except ServerStartError as exc:
        _fail(record, "startup", exc.reason, str(exc), exc.returncode)
        return
    record["server"]["launched_at"] = server.launched_at
    record["server"]["ready_at"] = server.ready_at
    record["cold_start"]["ready_seconds"] = fact(round(ready_s, 3), "launch to first /health 200", unit="s")
    record["startup"] = logs.parse_startup(logs.read_log(server.log_path), source=log_name)
    log.info("%s ready in %.1f s", spec["name"], ready_s)

    try:
        first = bench.first_request(host, port, model=served_model_name, prompt=cold_start["prompt"],
                                    max_tokens=int(cold_start["max_tokens"]), timeout=float(cold_start["timeout_s"]))
    except Exception as exc:  # the server answered /health but cannot serve: a result, not a fault
        _fail(record, "cold_start", "request_failed", f"first request failed: {exc}", None)
        return
    record["cold_start"]["first_ttft_s"] = fact(first["ttft_s"], "first streamed completion after ready", unit="s")
    record["cold_start"]["first_total_s"] = fact(first["total_s"], "first streamed completion after ready", unit="s")

    percentiles = list(bench_settings["percentiles"])
    for s_index, (name, scenario) in enumerate(scenarios.items()):
        entry: dict[str, Any] = {"name": name, "spec": dict(scenario), "passes": []}
        record["scenarios"].append(entry)
        for p in range(1, int(scenario["passes"]) + 1):
            seed = bench.pass_seed(int(bench_settings["seed"]), s_index, p)
            stem = f"{name}-pass{p}"
            argv = bench.bench_argv(host=host, port=port, served_model_name=served_model_name, tokenizer=model_dir,
                                    scenario=scenario, seed=seed, result_dir=str(bench_dir),
                                    result_filename=f"{stem}.json", percentiles=percentiles)
            log.info("%s: scenario %s pass %d (seed %d)", spec["name"], name, p, seed)
            # the window opens before its first /metrics sample and closes after its last, so a
            # counter's change over the window is exactly the pass's own
            w_start = time.time()
            sampler.mark(f"{stem}:start")  # the CSV names its own windows
            sampler.sample_now("metrics")
            run = bench.run_pass(argv, log_path=bench_dir / f"{stem}.log", timeout=float(scenario["timeout_s"]))
            sampler.sample_now("metrics")
            sampler.mark(f"{stem}:end")
            w_end = time.time()
            result_file = bench_dir / f"{stem}.json"
            one: dict[str, Any] = {
                "pass": p, "seed": seed, "start": run["start"], "end": run["end"],
                "argv": argv, "log": _rel(bench_dir / f"{stem}.log", out_dir),
                "returncode": run["returncode"], "timed_out": run["timed_out"],
            }
            if run["returncode"] == 0 and result_file.exists():
                result = read_record(result_file)
                one["status"] = "ok"
                one["result_file"] = _rel(result_file, out_dir)
                one["summary"] = bench.summarize_result(result, percentiles)
                one["stall"] = bench.stall_flag(one["summary"].get("mean_ttft_ms"), one["summary"].get("median_ttft_ms"))
            else:
                one["status"] = "failed"
            entry["passes"].append(one)
            one["window"] = {"start": w_start, "end": w_end}
            windows.append((one, w_start, w_end))
            if not server.alive():
                _fail(record, "benchmark", "exited", f"server exited with code {server.proc.poll() if server.proc else None} "
                      f"during scenario {name} pass {p}", server.proc.poll() if server.proc else None)
                return
            if one["status"] == "failed":
                _fail(record, "benchmark", "pass_failed", f"benchmark pass {name}/{p} failed "
                      f"(exit {run['returncode']}{', timed out' if run['timed_out'] else ''})", None, keep_going=True)
        ok = [q["summary"] for q in entry["passes"] if q["status"] == "ok"]
        entry["agreement"] = {
            "output_throughput": agreement([s["output_throughput"] for s in ok]),
            "median_ttft_ms": agreement([s["median_ttft_ms"] for s in ok]),
        }


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured in (None, 0):
        return None
    return (predicted - measured) / measured


def compare_with_plan(plan: Mapping[str, Any], startup: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The planner's figures beside what vLLM logged, with the relative error of each."""
    data, facts = plan.get("plan") or {}, plan.get("facts") or {}
    rows: list[dict[str, Any]] = []

    def add(name: str, predicted: Any, kind: str, measured_key: str) -> None:
        measured = startup.get(measured_key)
        if predicted is None or measured is None:
            return
        value = measured["value"]
        rows.append({"name": name, "predicted": predicted, "predicted_kind": kind, "measured": value,
                     "measured_source": measured["source"], "relative_error": relative_error(predicted, value)})

    if not data:
        return rows
    add("KV cache tokens", data.get("predicted_kv_cache_tokens"), facts["predicted_kv_cache_tokens"]["kind"], "kv_cache_tokens")
    add("max concurrency", data.get("max_concurrency"), facts["max_concurrency"]["kind"], "max_concurrency")
    weights = data.get("weights_bytes_per_rank") or []
    if weights:
        add("weights per rank (GiB)", round(weights[0] / 2**30, 2), facts["weights_bytes_per_rank"]["kind"], "model_load_gib")
    for name, key, logged in (("GPU budget per rank (GiB)", "gpu_budget_bytes", "gpu_requested_gib"),
                              ("non-torch memory (GiB)", "non_torch_bytes", "non_torch_gib"),
                              ("peak activation (GiB)", "peak_activation_bytes", "peak_activation_gib"),
                              ("CUDA graph memory (GiB)", "cuda_graph_bytes", "cuda_graph_gib")):
        if key in facts:
            add(name, round(facts[key]["value"] / 2**30, 2), facts[key]["kind"], logged)
    kv_memory = data.get("available_kv_bytes_per_rank") or []
    if kv_memory and "gpu_budget_bytes" in facts:
        add("KV cache memory per rank (GiB)", round(kv_memory[0] / 2**30, 2), facts["available_kv_bytes_per_rank"]["kind"],
            "available_kv_gib" if "available_kv_gib" in startup else "kv_cache_in_use_gib")
    avail = startup.get("available_kv_gib")
    per_rank = data.get("kv_cache_bytes_per_token_per_rank")
    if avail and per_rank:
        per_rank = per_rank if isinstance(per_rank, list) else [per_rank]
        _, tokens, _ = predict_kv_tokens([avail["value"] * 2**30] * len(per_rank), per_rank, data["block_size"],
                                         data["max_model_len"])
        add("KV cache tokens from the logged KV memory", tokens, "predicted", "kv_cache_tokens")
    return rows


def _fail(record: dict[str, Any], phase: str, reason: str, message: str, returncode: int | None,
          keep_going: bool = False) -> None:
    if record["failure"] is not None and keep_going:
        return
    record["status"] = "failed"
    record["failure"] = {"phase": phase, "reason": reason, "message": message, "returncode": returncode}
    log.warning("configuration %s failed in %s: %s", record["configuration"], phase, message)


def _finish(record: dict[str, Any], server_log: Path, out_dir: Path) -> None:
    text = logs.read_log(server_log) if server_log.exists() else ""
    if record["failure"] is not None:
        record["failure"]["error_line"] = logs.diagnose_failure(text, source=record["server"]["log"])
        record["failure"]["log_tail"] = logs.tail(text, 40)
    else:
        record["status"] = "ok"
    if not record["startup"] and text:
        record["startup"] = logs.parse_startup(text, source=record["server"]["log"])
    t = record["timing"]
    t["job_end"] = time.time()
    t["wall_s"] = t["job_end"] - t["job_start"]
    ready = record["cold_start"].get("ready_seconds")
    t["startup_s"] = ready["value"] if ready else None
    t["bench_s"] = sum(p["end"] - p["start"] for s in record["scenarios"] for p in s["passes"])


def _summarize_telemetry(record: dict[str, Any], telemetry_path: Path, server: ServerProcess,
                         windows: list[tuple[dict[str, Any], float, float]]) -> None:
    if not telemetry_path.exists():
        return
    df = read_samples(telemetry_path)
    if server.launched_at is not None:
        end = server.ready_at or time.time()
        record["telemetry"]["startup_window"] = {"start": server.launched_at, "end": end,
                                                 **window_figures(df, server.launched_at, end)}
    for one, start, end in windows:
        one["telemetry"] = window_figures(df, start, end)
        deltas = one["telemetry"]["deltas"]
        one["server_metrics"] = {name: deltas[f"metrics.{counter}"] for name, counter in SERVER_COUNTERS.items()
                                 if f"metrics.{counter}" in deltas}


def _rel(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)

