"""One serving configuration's job: start vLLM, measure cold start, run every scenario, stop.

The outcome is always a record. A server that fails to start, times out, or dies during
the benchmark gives ``status: failed`` with the phase, the log tail and the line that
explains it; only faults of the workflow itself raise.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from llmtrial import bench, failures, logs, startup_log
from llmtrial.ceiling import compare_with_measured
from llmtrial.cleanup import restore_first
from llmtrial.engine_warnings import engine_warnings
from llmtrial.gpus import after_failure, launch_check, visible_devices_env
from llmtrial.ledger import Action, Ledger
from llmtrial.manifest import verify_manifest
from llmtrial.multinode import (
    MASTER_PORT_OFFSET,
    SANITY_PORT_OFFSET,
    HeadlessRanks,
    MultiNodeServer,
    NodeGroups,
    RayCluster,
    launch_args,
    ray_port,
    sanity_check,
)
from llmtrial.nodes import Node
from llmtrial.nodetelemetry import NodeTelemetry, node_window_figures
from llmtrial.onset import onset, step_figures
from llmtrial.patching import ensure_patched, evidence, node_plugin_env, server_env
from llmtrial.paths import TrialPaths
from llmtrial.prediction import compare_with_plan
from llmtrial.records import fact, read_record, redact_env, write_record
from llmtrial.scenarios import SWEEP_KEYS, Repetition, goodput, is_sweep, runs_of
from llmtrial.scenarios import steps as sweep_steps
from llmtrial.server import ServerProcess, ServerStartError, build_server_argv
from llmtrial.services import quiet_host, quiet_needed
from llmtrial.sources import HostSource, MetricsSource, job_sources
from llmtrial.telemetry import CSV_HEADER, Sampler, describe_sources, read_samples, window_edge, window_figures

log = logging.getLogger(__name__)

#: Per-pass server counters (deltas of the /metrics series over the pass's window).
SERVER_COUNTERS = {
    "preemptions": "preemptions_total",
    "prompt_tokens": "prompt_tokens_total",
    "generation_tokens": "generation_tokens_total",
    "requests_finished": "requests_finished_total",
}


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


@dataclass(frozen=True)
class JobPaths:
    """Where one configuration's job writes (its folder under the trial's results)."""

    trial: TrialPaths
    configuration: str

    @property
    def out_dir(self) -> Path:
        return self.trial.configuration(self.configuration)

    @property
    def record(self) -> Path:
        return self.trial.config_record(self.configuration)

    @property
    def telemetry(self) -> Path:
        return self.trial.telemetry(self.configuration)

    @property
    def server_log(self) -> Path:
        return self.trial.server_log(self.configuration)

    @property
    def ledger(self) -> Path:
        return self.trial.ledger

    @property
    def node_telemetry(self) -> Path:
        """Every node's samples of a multi-node configuration, merged, with a node column."""
        return self.out_dir / "telemetry-nodes.csv"

    @property
    def bench_dir(self) -> Path:
        return self.out_dir / "bench"

    def rel(self, path: Path) -> str:
        """``path`` relative to the configuration's folder, as records name files."""
        try:
            return str(path.relative_to(self.out_dir))
        except ValueError:
            return str(path)


@dataclass
class Failure(Exception):
    """A phase that ended the configuration: a result, not a fault of the workflow."""

    phase: str
    reason: str
    message: str
    returncode: int | None = None

    def as_record(self) -> dict[str, Any]:
        return {"phase": self.phase, "reason": self.reason, "message": self.message, "returncode": self.returncode}


@dataclass
class TrialJob:
    """One serving configuration's job, built once from the trial's config: :meth:`run` serves,
    measures and stops, and writes the record; each phase returns its own part of it."""

    trial: str
    spec: Mapping[str, Any]
    manifest: Mapping[str, Any]
    plan: Mapping[str, Any]
    services: Mapping[str, Any]
    served_model_name: str
    scenarios: Mapping[str, Mapping[str, Any]]
    bench_settings: Mapping[str, Any]
    cold_start: Mapping[str, Any]
    telemetry_interval: float
    paths: JobPaths
    patches: Mapping[str, Any] = field(default_factory=dict)
    #: The nodes the configuration spans, the first serving the API (none or one: this host).
    nodes: Sequence[Node] = ()
    #: The trial file's ``hardware`` (allow_processes, health_check) and preflight's kernel-log baseline.
    hardware: Mapping[str, Any] = field(default_factory=dict)
    kernel_baseline: Sequence[str] = ()

    @property
    def gpus(self) -> list[dict[str, Any]]:
        """The GPUs the trial selected (preflight's resolution of ``hardware.gpus``, via the plan)."""
        return list((self.plan.get("hardware") or {}).get("selected_gpus") or [])

    @property
    def label(self) -> str:
        return f"{self.trial}/{self.spec['name']}"

    @property
    def host(self) -> str:
        return str(self.spec["host"])

    @property
    def port(self) -> int:
        return int(self.spec["port"])

    @property
    def model_dir(self) -> str:
        return str(self.manifest["model_dir"])

    @property
    def spread(self) -> bool:
        """Whether the configuration spans several nodes."""
        return len(self.nodes) > 1

    @property
    def master_port(self) -> int:
        return self.port + MASTER_PORT_OFFSET

    @property
    def launch(self) -> str:
        """How a multi-node configuration is launched: ``native`` (vLLM's own) or ``ray``."""
        return str(self.spec.get("launch") or "native")

    @property
    def ray_address(self) -> str:
        return f"{self.nodes[0].address}:{ray_port(self.port)}"

    def argv(self) -> list[str]:
        extra: dict[str, Any] = {}
        if self.spread:
            extra = ({"distributed_executor_backend": "ray"} if self.launch == "ray"
                     else launch_args(self.nodes, 0, self.master_port))
        args = {**self.spec["args"], **extra}
        return build_server_argv(model_dir=self.model_dir, served_model_name=self.served_model_name,
                                 host=self.host, port=self.port, args=args)

    def new_record(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "configuration": self.spec["name"],
            "description": self.spec.get("description", ""),
            "status": "running",
            "failure": None,
            "server": {"argv": self.argv(), "env": redact_env(self.spec["env"]), "host": self.host, "port": self.port,
                       "log": self.paths.rel(self.paths.server_log)},
            "startup": {},
            "engine_warnings": [],
            "cold_start": {},
            "scenarios": [],
            "telemetry": {"file": self.paths.rel(self.paths.telemetry)},
            "timing": {"job_start": time.time()},
            "plan": {"verdict": self.plan["verdict"], "reasons": self.plan["reasons"],
                     "forced": bool(self.spec.get("force"))},
            "prediction": [],
        }

    def run(self) -> dict[str, Any]:
        """Run the configuration end to end and write its record; returns the record.

        The trial's ``patches`` are applied again first when a cleanup reverted them, the
        plugin folder goes on the server's PYTHONPATH, and the record says per patch whether
        its flag was on and which processes logged its behaviour."""
        self._fresh_folder()
        record = self.new_record()
        if self.plan["verdict"] == "does_not_fit" and not self.spec.get("force"):
            return self._skip(record)
        missing = verify_manifest(self.manifest, hashes=False)
        if missing:
            raise FileNotFoundError(
                f"the staged model is not all there ({'; '.join(missing[:3])}): a finished trial's cleanup archives "
                "or deletes it when model.weights.after says so; restage it with `snakemake --forcerun stage_model`")
        why = quiet_needed(self.paths.trial.root, self.services)
        if why is not None:
            log.info("quieting the host first (%s)", why)
            restored = restore_first(self.paths.trial.root, ports=[self.port], host=self.host)
            record["services_requieted"] = quiet_host(self.paths.trial.root, self.services, restored_first=restored)["services"]
        ledger = Ledger(self.paths.ledger)
        patched = ensure_patched(dict(self.patches), ledger=ledger, work_dir=self.paths.trial.patches)
        envs = self._envs(ledger, patched)
        env = envs[self.nodes[0].name] if self.spread else envs[""]
        record["gpu_census"], busy = launch_check(ledger, self.gpus, self.hardware.get("allow_processes") or [])
        if busy:
            return self._not_served(record, "failed", Failure("gpu_check", "gpu_in_use", busy))
        if self.spread:
            record.update(self._spread_record())
            if not record["collective"]["ok"]:
                return self._not_served(record, "failed", Failure("sanity_check", "collective_failed",
                                                                  record["collective"]["diagnosis"]))
        record["server"]["env"] = redact_env(env)
        job = ledger.append(Action.JOB_STARTED, label=self.label, pid=os.getpid(), create_time=psutil.Process().create_time())
        served = self._serve(ledger, env, envs)
        record["server"].update(served.pop("server"))
        record["timing"].update(served.pop("bench_worker"))
        record["telemetry"].update(served.pop("telemetry"))
        record.update(served)
        text = logs.read_log(self.paths.server_log) if self.paths.server_log.exists() else ""
        record["status"] = "failed" if record["failure"] else "ok"
        record["timing"].update(self._timing(record))
        if record["failure"]:
            record["gpu_health"] = after_failure(ledger, self.gpus, self.kernel_baseline, self.label,
                                                 self.hardware.get("health_check"))
            record["failure"]["error_line"] = failures.diagnose_failure(text, source=record["server"]["log"],
                                                                    ready="ready_seconds" in record["cold_start"])
            record["failure"]["log_tail"] = logs.tail(text, 40)
        self._node_outcomes(record, patched["patches"], envs)
        if not record["startup"] and text:
            record["startup"] = startup_log.parse_startup(text, source=record["server"]["log"])
        record["engine_warnings"] = engine_warnings(text, source=record["server"]["log"])
        record["patches"] = {"reapplied": patched["reapplied"], "plugin_dir": patched["plugin_dir"],
                             "patches": evidence(patched["patches"], text, env, record["server"]["log"])}
        record["prediction"] = compare_with_plan(self.plan, record["startup"])
        record["throughput_bound"] = compare_with_measured(self.plan, record["scenarios"])
        write_record(self.paths.record, record, schema="configuration")
        ledger.append(Action.JOB_FINISHED, label=self.label, pid=os.getpid(), undoes=job["id"])
        return record

    def _envs(self, ledger: Ledger, patched: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        """The serving environment by node name (``""`` on a single host): the configuration's
        env with the patches' plugin folder, carried to every other node (ledger first), and on
        each node of a multi-node configuration its rank environment."""
        if not self.spread:
            env = {**visible_devices_env(self.gpus), **self.spec["env"]}
            return {"": server_env(env, patched["plugin_dir"], patched["patches"])}
        envs = node_plugin_env(ledger, list(self.nodes), patched["plugin_dir"], patched["patches"], self.spec["env"],
                               trial=self.trial)
        ray = {"RAY_ADDRESS": self.ray_address} if self.launch == "ray" else {}
        return {n.name: {**envs[n.name], **n.rank_env(), **ray} for n in self.nodes}

    def _node_outcomes(self, record: dict[str, Any], patches: list[dict[str, Any]],
                       envs: Mapping[str, Mapping[str, str]]) -> None:
        """Each node's entry gets what ran there, its log and, from that log, the patches'
        evidence and (on a failure) the line that explains it."""
        for entry in record.get("nodes") or []:
            entry.update(record["server"].get("ranks", {}).get(entry["name"], {"log": record["server"]["log"]}))
            if not entry["rank"] and entry.get("log"):
                continue  # node 0's log is the server's own, read for the whole record
            name = entry.get("log") or entry.get("ray_log")
            text = logs.read_log(self.paths.out_dir / name) if name else ""
            entry["patches"] = evidence(patches, text, envs[entry["name"]], name or "")
            if record["failure"] and text:
                entry["error_line"] = failures.diagnose_failure(text, source=name, ready="ready_seconds" in record["cold_start"])

    def _fresh_folder(self) -> None:
        self.paths.out_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.paths.bench_dir, ignore_errors=True)  # never mix passes of an earlier run
        self.paths.bench_dir.mkdir(parents=True)
        self.paths.server_log.unlink(missing_ok=True)
        for rank_log in [*self.paths.out_dir.glob("server-*.log"), *self.paths.out_dir.glob("ray-*.log")]:
            rank_log.unlink()  # other nodes' logs of an earlier run
        self.paths.node_telemetry.unlink(missing_ok=True)

    def _skip(self, record: dict[str, Any]) -> dict[str, Any]:
        log.warning("%s not launched: the planner says it cannot work: %s", self.spec["name"],
                    "; ".join(self.plan["reasons"]))
        return self._not_served(record, "skipped")

    def _spread_record(self) -> dict[str, Any]:
        """A multi-node configuration's launch, its nodes' roles and the collective run
        across them before any server starts."""
        model_dirs = self._model_dirs()
        launch: dict[str, Any] = {"kind": self.launch, "nnodes": len(self.nodes), "master_addr": self.nodes[0].address,
                                  "master_port": self.master_port}
        roles = ("api server, ray head", "ray worker") if self.launch == "ray" else ("api server", "headless")
        if self.launch == "ray":
            launch.update(master_port=None, ray_address=self.ray_address)
        nodes = [{"name": n.name, "rank": i, "role": roles[bool(i)], "address": n.address,
                  "reach": n.reach, "interface": n.interface, "model_dir": model_dirs[n.name],
                  "env_keys": sorted(n.rank_env())} for i, n in enumerate(self.nodes)]
        log.info("%s: sanity check across nodes %s", self.spec["name"], ", ".join(n.name for n in self.nodes))
        backend = "nccl" if (self.plan.get("hardware") or {}).get("gpus") else "gloo"  # gloo on CPU hosts
        check = sanity_check(self.nodes, port=self.port + SANITY_PORT_OFFSET, backend=backend)
        log.info("%s: sanity check %s in %.1f s", self.spec["name"], "passed" if check["ok"] else "FAILED",
                 check["wall_s"])
        return {"launch": launch, "nodes": nodes, "collective": check}

    def _model_dirs(self) -> dict[str, str]:
        """Where each node holds the staged model: the manifest's own folder on the first node,
        the verified copy the model stage made on every other one."""
        copies = self.manifest.get("nodes") or {}
        out = {self.nodes[0].name: self.model_dir}
        for node in self.nodes[1:]:
            folder = (copies.get(node.name) or {}).get("model_dir")
            if not folder:
                raise FileNotFoundError(f"the manifest has no staged copy of the model on node {node.name}: "
                                        "restage it with `snakemake --forcerun stage_model`")
            out[node.name] = folder
        return out

    def _not_served(self, record: dict[str, Any], status: str, failure: Failure | None = None) -> dict[str, Any]:
        """The record of a configuration whose server never started (skipped, or stopped by its
        sanity check), with an empty telemetry file."""
        record["status"] = status
        if failure is not None:
            log.warning("configuration %s failed in %s: %s", self.spec["name"], failure.phase, failure.message)
            record["failure"] = failure.as_record()
        record["timing"]["job_end"] = time.time()
        record["timing"]["wall_s"] = record["timing"]["job_end"] - record["timing"]["job_start"]
        self.paths.telemetry.write_text(",".join(CSV_HEADER) + "\n")
        write_record(self.paths.record, record, schema="configuration")
        return record

    @staticmethod
    def _timing(record: Mapping[str, Any]) -> dict[str, Any]:
        end = time.time()
        ready = record["cold_start"].get("ready_seconds")
        return {"job_end": end, "wall_s": end - record["timing"]["job_start"],
                "startup_s": ready["value"] if ready else None,
                "bench_s": sum(p["end"] - p["start"] for s in record["scenarios"] for _, p in runs_of(s))}

    def _serve(self, ledger: Ledger, env: Mapping[str, str], envs: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
        """Start the server under the sampler, run the phases, stop it: the record's
        ``server`` and ``telemetry`` additions, ``startup``, ``cold_start``, ``scenarios`` and
        ``failure`` (the first phase that failed, or None)."""
        host_source = HostSource()
        sources, absent = job_sources(host_source, MetricsSource(self.host, self.port),
                                      gpus=[g["index"] for g in self.gpus] or None)
        server = self._server(ledger, env, envs)
        out: dict[str, Any] = {"server": {}, "startup": {}, "cold_start": {}, "scenarios": [], "failure": None}
        windows: list[tuple[dict[str, Any], float, float]] = []
        failure: Failure | None = None
        worker = bench.BenchWorker(log_path=self.paths.bench_dir / "worker.log")  # every pass of this job
        per_node = (NodeTelemetry(ledger, self.nodes, label=self.label, out_csv=self.paths.node_telemetry,
                                  interval=self.telemetry_interval) if self.spread else contextlib.nullcontext())
        with sigterm_as_exit(), per_node, Sampler(self.paths.telemetry, sources, interval=self.telemetry_interval) as sampler, \
                worker:
            try:
                out["server"], out["startup"], out["cold_start"] = self._start(server, host_source)
                out["cold_start"].update(self._first_request())
                failure = self._scenarios(server, sampler, worker, windows, out["scenarios"])
            except Failure as raised:
                failure = raised
            finally:
                worker.close()
                sampler.retire("metrics")  # the server is going away: its /metrics with it
                out["server"]["stop"] = server.stop()
                out["server"]["pid"] = server.proc.pid if server.proc else None
                if isinstance(server, MultiNodeServer):
                    out["server"]["ranks"] = self._rank_records(server.ranks)
            out["telemetry"] = {"sampler": sampler.stats(), "errors": dict(sampler.errors),
                                "sources": describe_sources(sources, absent, sampler)}
        out["telemetry"].update(self._telemetry(server, windows))
        if isinstance(per_node, NodeTelemetry):
            out["telemetry"]["nodes"] = per_node.summary
            for one, start, end in windows:
                one["node_telemetry"] = node_window_figures(self.paths.node_telemetry, start, end)
        out["bench_worker"] = {"bench_import_s": worker.import_s, "bench_workers": worker.starts}
        for entry in out["scenarios"]:
            if entry["kind"] == "sweep":
                for step in entry["steps"]:
                    step["figures"] = step_figures(step)
                entry["onset"] = onset(entry["steps"], out["startup"].get("kv_cache_tokens"),
                                       (self.plan.get("plan") or {}).get("block_size"))
        if failure is not None:
            log.warning("configuration %s failed in %s: %s", self.spec["name"], failure.phase, failure.message)
            out["failure"] = failure.as_record()
        return out

    def _server(self, ledger: Ledger, env: Mapping[str, str], envs: Mapping[str, Mapping[str, str]]) -> ServerProcess:
        """The configuration's server: on this host, or node 0's with the other nodes' headless ranks."""
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port, "log_path": self.paths.server_log,
                                  "env": dict(env), "ledger": ledger, "stop_timeout": float(self.spec["stop_timeout_s"]),
                                  "label": self.label}
        if not self.spread:
            return ServerProcess(self.argv(), **kwargs)
        ranks: NodeGroups
        if self.launch == "ray":
            ranks = RayCluster(ledger, self.nodes, label=self.label, port=ray_port(self.port), envs=envs)
        else:
            ranks = HeadlessRanks(ledger, self.nodes, label=self.label, model_dirs=self._model_dirs(),
                                  args=self.spec["args"], envs=envs, master_port=self.master_port)
        return MultiNodeServer(self.argv(), ranks=ranks, **kwargs)

    def _rank_records(self, ranks: NodeGroups) -> dict[str, dict[str, Any]]:
        """What each node ran besides the API server (a headless rank, Ray), its log fetched from the node."""
        fetched = ranks.fetch_logs(self.paths.out_dir)
        key = "ray_log" if isinstance(ranks, RayCluster) else "log"
        return {n.name: {**ranks.describe(n), key: fetched.get(n.name)} for n in ranks.members()}

    def _start(self, server: ServerProcess, host_source: HostSource) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Launch and wait for /health: (server times, startup facts, cold start's ready time)."""
        try:
            server.start()
            host_source.pid = server.proc.pid if server.proc else None
            ready_s = server.wait_ready(float(self.spec["startup_timeout_s"]))
        except ServerStartError as exc:
            raise Failure("startup", exc.reason, str(exc), exc.returncode) from None
        log.info("%s ready in %.1f s", self.spec["name"], ready_s)
        startup = startup_log.parse_startup(logs.read_log(server.log_path), source=self.paths.rel(self.paths.server_log))
        return ({"launched_at": server.launched_at, "ready_at": server.ready_at}, startup,
                {"ready_seconds": fact(round(ready_s, 3), "launch to first /health 200", unit="s")})

    def _first_request(self) -> dict[str, Any]:
        cs = self.cold_start
        try:
            first = bench.first_request(self.host, self.port, model=self.served_model_name, prompt=cs["prompt"],
                                        max_tokens=int(cs["max_tokens"]), timeout=float(cs["timeout_s"]))
        except Exception as exc:  # the server answered /health but cannot serve: a result, not a fault
            raise Failure("cold_start", "request_failed", f"first request failed: {exc}") from None
        source = "first streamed completion after ready"
        return {"first_ttft_s": fact(first["ttft_s"], source, unit="s"),
                "first_total_s": fact(first["total_s"], source, unit="s"),
                "first_output_tokens": fact(first["chunks"], source, unit="tokens"),
                "first_output_tok_s": fact(bench.output_rate(first["chunks"], first["total_s"]), source, unit="tok/s")}

    def _scenarios(self, server: ServerProcess, sampler: Sampler, worker: bench.BenchWorker,
                   windows: list[tuple[dict[str, Any], float, float]], out: list[dict[str, Any]]) -> Failure | None:
        """Every scenario, in order, appended to ``out`` (the record's scenarios) as it runs: its
        warm-up pass when asked, then its passes (or a sweep's steps); returns the first failed
        pass, or None. A server that dies ends the phase at once (raised as :class:`Failure`)."""
        failed: Failure | None = None
        for s_index, (name, scenario) in enumerate(self.scenarios.items()):
            entry: dict[str, Any] = {"name": name, "spec": dict(scenario), "kind": "sweep" if is_sweep(scenario) else "fixed",
                                     "passes": [], "warmup": None}
            out.append(entry)
            run = functools.partial(self._checked_pass, server, sampler, worker, windows, name, s_index)
            if scenario.get("warmup"):
                entry["warmup"] = run(scenario, 0, f"{name}-warmup")
            first = (self._sweep if entry["kind"] == "sweep" else self._repeat)(entry, run)
            failed = failed or first
        return failed

    def _sweep(self, entry: dict[str, Any], run: Callable[..., dict[str, Any]]) -> Failure | None:
        """A sweep's steps in order, each one pass with its own seed, into ``entry["steps"]``."""
        failed: Failure | None = None
        entry["steps"] = []
        for step in sweep_steps(entry["spec"]):
            one = run(step, step["step"], f"{entry['name']}-step{step['step']}")
            one.update({k: step[k] for k in ("step", *SWEEP_KEYS)})
            entry["steps"].append(one)
            failed = failed or _pass_failure(entry["name"], one)
        return failed

    def _repeat(self, entry: dict[str, Any], run: Callable[..., dict[str, Any]]) -> Failure | None:
        """A scenario's passes until its repetition rule says stop; the record says why it stopped."""
        rule = Repetition.of(entry["spec"])
        failed: Failure | None = None
        stopped = None
        while stopped is None:
            p = len(entry["passes"]) + 1
            one = run(entry["spec"], p, f"{entry['name']}-pass{p}")
            entry["passes"].append(one)
            failed = failed or _pass_failure(entry["name"], one)
            ok = [q["summary"] for q in entry["passes"] if q["status"] == "ok"]
            spread = bench.agreement([s["output_throughput"] for s in ok])
            stopped = rule.verdict(spread, p, one["status"] == "failed")
        entry["repetition"] = {"min": rule.min, "max": rule.max, "agreement": rule.agreement,
                               "passes_run": len(entry["passes"]), "spread": spread, "stopped": stopped}
        entry["agreement"] = {"output_throughput": spread,
                              "median_ttft_ms": bench.agreement([s["median_ttft_ms"] for s in ok])}
        return failed

    def _checked_pass(self, server: ServerProcess, sampler: Sampler, worker: bench.BenchWorker,
                      windows: list[tuple[dict[str, Any], float, float]], name: str, s_index: int,
                      scenario: Mapping[str, Any], p: int, stem: str) -> dict[str, Any]:
        """One pass (window kept for telemetry); a server that died during it ends the phase."""
        one = self._pass(scenario, bench.pass_seed(int(self.bench_settings["seed"]), s_index, p), stem, sampler, worker)
        one["pass"] = p
        windows.append((one, one["window"]["start"], one["window"]["end"]))
        if not server.alive():
            raise Failure("benchmark", "exited", f"{server.down_reason()} during scenario {name} ({stem})",
                          server.exit_code())
        return one

    def _pass(self, scenario: Mapping[str, Any], seed: int, stem: str, sampler: Sampler,
              worker: bench.BenchWorker) -> dict[str, Any]:
        """One benchmark pass inside its telemetry window: its record entry."""
        percentiles = list(self.bench_settings["percentiles"])
        bench_dir = self.paths.bench_dir
        argv = bench.bench_argv(host=self.host, port=self.port, served_model_name=self.served_model_name,
                                tokenizer=self.model_dir, scenario=scenario, seed=seed, result_dir=str(bench_dir),
                                result_filename=f"{stem}.json", percentiles=percentiles)
        log.info("%s: %s (seed %d)", self.spec["name"], stem, seed)
        # the window opens before its first /metrics sample and closes after its last, so a
        # counter's change over the window is exactly the pass's own
        w_start = window_edge(time.time())
        sampler.mark(f"{stem}:start")  # the CSV names its own windows
        sampler.sample_now("metrics")
        run = worker.run(argv, log_path=bench_dir / f"{stem}.log", timeout=float(scenario["timeout_s"]))
        sampler.sample_now("metrics")
        sampler.mark(f"{stem}:end")
        w_end = window_edge(time.time(), end=True)
        result_file = bench_dir / f"{stem}.json"
        one: dict[str, Any] = {
            "seed": seed, "start": run["start"], "end": run["end"],
            "argv": argv, "log": self.paths.rel(bench_dir / f"{stem}.log"),
            "returncode": run["returncode"], "timed_out": run["timed_out"],
        }
        if run["returncode"] == 0 and result_file.exists():
            one["status"] = "ok"
            one["result_file"] = self.paths.rel(result_file)
            result = read_record(result_file)
            one["summary"] = bench.summarize_result(result, percentiles)
            if scenario.get("slo"):
                one["summary"]["goodput"] = goodput(result, scenario["slo"])
            one["stall"] = bench.stall_flag(one["summary"].get("mean_ttft_ms"), one["summary"].get("median_ttft_ms"))
        else:
            one["status"] = "failed"
        one["window"] = {"start": w_start, "end": w_end}
        return one

    def _telemetry(self, server: ServerProcess, windows: list[tuple[dict[str, Any], float, float]]) -> dict[str, Any]:
        """The start-up window's figures; each pass gets its own window's figures and server counters."""
        if not self.paths.telemetry.exists():
            return {}
        df = read_samples(self.paths.telemetry)
        out: dict[str, Any] = {}
        if server.launched_at is not None:
            end = server.ready_at or time.time()
            out["startup_window"] = {"start": server.launched_at, "end": end,
                                     **window_figures(df, server.launched_at, end)}
        for one, start, end in windows:
            one["telemetry"] = window_figures(df, start, end)
            deltas = one["telemetry"]["deltas"]
            one["server_metrics"] = {name: deltas[f"metrics.{counter}"] for name, counter in SERVER_COUNTERS.items()
                                     if f"metrics.{counter}" in deltas}
        return out


def _pass_failure(name: str, one: Mapping[str, Any]) -> Failure | None:
    if one["status"] != "failed":
        return None
    return Failure("benchmark", "pass_failed", f"benchmark pass {name}/{one['pass']} failed "
                   f"(exit {one['returncode']}{', timed out' if one['timed_out'] else ''})")
