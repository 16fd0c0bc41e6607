"""The measurement phase of one configuration's job: start the server under the telemetry
sampler, wait for it, time the cold first request, run every scenario's passes (warm-up,
repeated passes, a sweep's steps: :mod:`llmtrial.serve.passes`) each in its own telemetry window,
ask the task set, relaunch with prefix caching on for the scenarios that need it, and stop the server.

A phase that ends the configuration is a :class:`~llmtrial.serve.passes.PhaseFailure`, a result the record
keeps; only faults of the workflow itself raise past :meth:`Measurement.serve`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmtrial.answers.ask import run_set
from llmtrial.core.answers_model import AnswerRun, Task
from llmtrial.core.configuration_model import ColdStart, RateFact, Server, ServerStop, Telemetry, TokensFact
from llmtrial.core.configuration_model import Failure as FailureRecord
from llmtrial.core.ledger import Ledger
from llmtrial.core.paths import JobPaths
from llmtrial.core.record_base import Fact
from llmtrial.core.records import fact
from llmtrial.core.scenario_model import Scenario, ServerMetrics
from llmtrial.core.stats import DEFAULT_LEVEL
from llmtrial.core.trial_config import BenchBlock, ColdStartBlock, OutputsBlock
from llmtrial.host.nodes import Node
from llmtrial.host.telemetry_sources import HostSource, MetricsSource, job_sources
from llmtrial.logs import startup_log
from llmtrial.logs.lines import read_log
from llmtrial.serve import bench
from llmtrial.serve.bench_worker import BenchWorker, SharedWorker
from llmtrial.serve.datasets import JobScenario, needs_prefix_caching
from llmtrial.serve.idle import watch_idle
from llmtrial.serve.multinode import MultiNodeServer
from llmtrial.serve.nodetelemetry import NodeTelemetry, node_window_figures
from llmtrial.serve.onset import onset, step_figures
from llmtrial.serve.passes import Passes, PhaseFailure, Timed, Todo
from llmtrial.serve.progress import StartupWatch, ready_line, say
from llmtrial.serve.server import ServerProcess, ServerStartError
from llmtrial.serve.telemetry import Sampler, describe_sources, read_samples, window_figures

log = logging.getLogger(__name__)

#: Per-pass server counters (deltas of the /metrics series over the pass's window).
SERVER_COUNTERS = {
    "preemptions": "preemptions_total",
    "prompt_tokens": "prompt_tokens_total",
    "generation_tokens": "generation_tokens_total",
    "requests_finished": "requests_finished_total",
    "prefix_cache_queries": "prefix_cache_queries_total",
    "prefix_cache_hits": "prefix_cache_hits_total",
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
class ServerRun:
    """What one server of the job did, for its part of the record: how it stopped and its pid, its launch and
    ready times once it was launched (None: they are not recorded), a multi-node server's ranks, and a
    relaunch's own argv and log."""

    stop: ServerStop
    pid: int | None
    #: (launched_at, ready_at).
    times: tuple[float | None, float | None] | None = None
    ranks: dict[str, dict[str, Any]] | None = None
    argv: list[str] | None = None
    log: str | None = None

    def onto(self, part: Server) -> Server:
        """``part`` (how the server was, or would have been, started) with what it did."""
        done = {"stop": self.stop, "pid": self.pid}
        if self.times is not None:
            done.update(launched_at=self.times[0], ready_at=self.times[1])
        if self.ranks is not None:
            done["ranks"] = self.ranks
        if self.argv is not None:
            done.update(argv=self.argv, log=self.log)
        return part.model_copy(update=done)


@dataclass
class Served:
    """The measurement phase's parts of the configuration record."""

    #: What the server did.
    server: ServerRun
    #: The start-up facts read from the server's log once it was ready.
    startup: dict[str, Any]
    cold_start: ColdStart
    scenarios: list[Scenario]
    #: The sampler's own figures, its sources, the start-up window and (across nodes) every node's telemetry.
    telemetry: Telemetry
    #: The benchmark workers' import time (None: none started here got that far), how many were started here and
    #: every worker that ran a pass (pids), as the record's timing has them.
    bench_import_s: float | None
    bench_workers: int
    bench_worker_pids: list[int]
    #: The first phase that failed, or None.
    failure: FailureRecord | None
    #: The task set asked after the passes (``outputs``), or None when none was asked.
    answers: AnswerRun | None = None
    #: The server launched again with prefix caching on, when a scenario needed it (None when there was none).
    relaunch: ServerRun | None = None
    #: When the server was found down, where it exited after it was ready (Unix time), else None.
    found_down_at: float | None = None

    @property
    def ready(self) -> bool:
        """The server answered /health: the cold start has its ready time."""
        return self.cold_start.ready_seconds is not None


@dataclass(frozen=True)
class Workload:
    """What every configuration of a trial is asked, from the trial's config: the name its
    server serves the model under, the scenarios, the benchmark's settings, the cold first
    request, the telemetry interval and the confidence level."""

    served_model_name: str
    #: The scenarios by name, in the trial file's order, each with its staged prompt file where it reads one.
    scenarios: Mapping[str, JobScenario]
    bench_settings: BenchBlock
    cold_start: ColdStartBlock
    telemetry_interval: float
    #: The confidence level of the passes' interval rule (``statistics.level``).
    level: float = DEFAULT_LEVEL
    #: The trial's ``outputs`` settings and its task set, asked after the passes (None: no set).
    outputs: OutputsBlock | None = None
    tasks: tuple[Task, ...] = ()

    def ask(self, host: str, port: int, *, launch: str, flags: Mapping[str, bool], once: bool = False,
            **parts: Any) -> AnswerRun:
        """The task set asked of the server at ``host:port``, ``outputs.repeat`` times (once with ``once``)."""
        assert self.outputs is not None
        settings = self.outputs.model_copy(update={"repeat": 1}) if once else self.outputs
        return run_set(f"http://{host}:{port}", self.tasks, settings=settings, model=self.served_model_name,
                       launch=launch, flags=flags, **parts)


@dataclass
class Measurement:
    """What the measurement of one configuration needs, from the trial's config and its plan."""

    name: str
    label: str
    host: str
    port: int
    model_dir: str
    workload: Workload
    startup_timeout_s: float
    paths: JobPaths
    #: The selected GPUs' indices (NVML telemetry), the plan's KV block size (a sweep's onset).
    gpus: Sequence[int] = ()
    block_size: int | None = None
    #: The nodes a multi-node configuration spans (each samples its own telemetry).
    nodes: Sequence[Node] = ()
    #: Each applied patch by name: its flag on in this server (what the answers record says).
    flags: Mapping[str, bool] = field(default_factory=dict)
    #: The configuration's own args turn prefix caching on: every scenario runs on the one server.
    prefix_caching: bool = False
    #: How long the server is held idle after its passes and task set (``serving.idle_watch_s``; 0: not held).
    idle_watch_s: float = 0.0
    #: The configuration's server with prefix caching on, not yet started: it runs the scenarios that need
    #: prefix caching (:func:`llmtrial.serve.datasets.needs_prefix_caching`) once the others are done.
    relaunch: Callable[[], ServerProcess] | None = None

    def _groups(self) -> tuple[list[Todo], list[Todo]]:
        """The scenarios the first server runs, and those that wait for the relaunch with prefix caching on."""
        todo = [(i, name, spec) for i, (name, spec) in enumerate(self.workload.scenarios.items())]
        if self.prefix_caching:
            return todo, []
        return ([t for t in todo if not needs_prefix_caching(t[2].block)],
                [t for t in todo if needs_prefix_caching(t[2].block)])

    def serve(self, ledger: Ledger, server: ServerProcess) -> Served:
        """Start ``server`` under the sampler, run the phases, stop it: the measurement's parts of the record
        (:class:`Served`)."""
        host_source, metrics = HostSource(), MetricsSource(self.host, self.port)
        sources, absent = job_sources(host_source, metrics, gpus=list(self.gpus) or None)
        first, cached = self._groups()
        relaunched: list[ServerRun] = []
        times: tuple[float | None, float | None] | None = None
        startup: dict[str, Any] = {}
        cold = ColdStart()
        scenarios: list[Scenario] = []
        windows: list[Timed] = []
        failure: PhaseFailure | None = None
        answers: AnswerRun | None = None
        root = self.paths.trial.root  # one worker for every configuration of the trial in this run
        worker = BenchWorker(log_path=self.paths.bench_dir / "worker.log",
                             shared=SharedWorker.of_trial(ledger, root, trial=root.name))
        per_node = (NodeTelemetry(ledger, self.nodes, label=self.label, out_csv=self.paths.node_telemetry,
                                  interval=self.workload.telemetry_interval) if len(self.nodes) > 1 else contextlib.nullcontext())
        with sigterm_as_exit(), per_node, Sampler(self.paths.telemetry, sources, interval=self.workload.telemetry_interval) as sampler, \
                worker:
            try:
                worker.start()  # vLLM's benchmark imports while vLLM starts: the passes need not wait for it
                times, startup, ready = self._start(server, host_source)
                cold = ColdStart(ready_seconds=ready)  # kept when the first request fails
                cold = self.first_request(cold)
                run = Passes(name=self.name, host=self.host, port=self.port, model_dir=self.model_dir,
                             served_model_name=self.workload.served_model_name,
                             bench_settings=self.workload.bench_settings, level=self.workload.level, paths=self.paths,
                             sampler=sampler, worker=worker, windows=windows, out=scenarios).run
                failure = run(server, first, caching=self.prefix_caching)
                if self.workload.outputs and failure is None:
                    say("%s: asking the task set (%d task(s))", self.name, len(self.workload.tasks))
                    answers = self.workload.ask(self.host, self.port, launch="passes", flags=self.flags)
                if self.idle_watch_s and failure is None:
                    watch_idle(server, self.idle_watch_s, sampler, self.name)
                if cached:
                    server.stop()
                    metrics.seen = False  # the next server's start-up is not a failed scrape
                    failure = self._relaunched(host_source, run, cached, relaunched) or failure
            except PhaseFailure as raised:
                failure = raised
            finally:
                sampler.retire("metrics")  # the server is going away: its /metrics with it
                stopped = self._stopped(server)  # first: the server holds the host's memory and ports
                worker.close()
            telemetry = Telemetry(file=self.paths.rel(self.paths.telemetry), sampler=sampler.stats(),
                                  errors=dict(sampler.errors), sources=describe_sources(sources, absent, sampler))
        self._telemetry(server, windows, telemetry)
        if isinstance(per_node, NodeTelemetry):
            telemetry.nodes = per_node.summary
            for one, start, end in windows:
                one.node_telemetry = node_window_figures(self.paths.node_telemetry, start, end)
        self._sweep_figures(scenarios, startup)
        if failure is not None:
            log.warning("configuration %s failed in %s: %s", self.name, failure.phase, failure.message)
        order = list(self.workload.scenarios)  # the record keeps the trial file's order
        return Served(server=dataclasses.replace(stopped, times=times), startup=startup, cold_start=cold,
                      scenarios=sorted(scenarios, key=lambda e: order.index(e.name)), telemetry=telemetry,
                      bench_import_s=worker.import_s, bench_workers=worker.starts, bench_worker_pids=worker.pids,
                      failure=failure.as_record() if failure is not None else None, answers=answers,
                      relaunch=relaunched[0] if relaunched else None,
                      found_down_at=failure.found_down_at if failure is not None else None)

    def _relaunched(self, host_source: HostSource, run: Callable[..., PhaseFailure | None], cached: list[Todo],
                    into: list[ServerRun]) -> PhaseFailure | None:
        """The scenarios that need prefix caching, on the configuration's server launched again with it on
        (the first one stopped): their first failed pass, or None. ``into`` gets what the server did."""
        assert self.relaunch is not None, "a scenario needs prefix caching on and the job gave no relaunch"
        server = self.relaunch()
        log.info("%s: relaunching with prefix caching on for %s", self.name, ", ".join(name for _, name, _ in cached))
        try:
            try:
                self._launch(server, host_source)
            except ServerStartError as exc:
                raise PhaseFailure("startup", exc.reason, f"the relaunch with prefix caching on ({server.log_path.name}): "
                              f"{exc}", exc.returncode) from None
            return run(server, cached, caching=True, relaunched=True)
        finally:
            into.append(dataclasses.replace(self._stopped(server), times=(server.launched_at, server.ready_at),
                                            argv=server.argv, log=self.paths.rel(server.log_path)))

    def _stopped(self, server: ServerProcess) -> ServerRun:
        """Stop ``server``: how it stopped, its pid, and a multi-node server's ranks."""
        return ServerRun(stop=server.stop(), pid=server.proc.pid if server.proc else None,
                         ranks=server.ranks.records(self.paths.out_dir) if isinstance(server, MultiNodeServer) else None)

    def _sweep_figures(self, scenarios: list[Scenario], startup: Mapping[str, Any]) -> None:
        """Each sweep step's figures, and each sweep's predicted against observed onset (from the KV cache
        tokens the server logged, a start-up fact)."""
        kv = startup.get("kv_cache_tokens")
        kv_tokens = Fact.model_validate(kv) if kv else None
        for entry in scenarios:
            if entry.kind == "sweep":
                for step in entry.steps or []:
                    step.figures = step_figures(step)
                entry.onset = onset(entry.steps or [], kv_tokens, self.block_size, entry.spec)

    def _start(self, server: ServerProcess,
               host_source: HostSource) -> tuple[tuple[float | None, float | None], dict[str, Any], Fact]:
        """Launch and wait for /health: ((launched_at, ready_at), startup facts, cold start's ready time)."""
        source = self.paths.rel(self.paths.server_log)
        say("%s: launching vLLM on %s:%d (its log: %s)", self.name, self.host, self.port, server.log_path)
        try:
            ready_s = self._launch(server, host_source, progress=StartupWatch(self.name, server.log_path, source))
        except ServerStartError as exc:
            say("%s: did not start (%s): %s", self.name, exc.reason, exc)
            raise PhaseFailure("startup", exc.reason, str(exc), exc.returncode) from None
        startup = startup_log.parse_startup(read_log(server.log_path), source=source)
        say("%s", ready_line(self.name, ready_s, startup))
        return ((server.launched_at, server.ready_at), startup,
                Fact.model_validate(fact(round(ready_s, 3), "launch to first /health 200", unit="s")))

    def _launch(self, server: ServerProcess, host_source: HostSource, progress: StartupWatch | None = None) -> float:
        """Start ``server``, sample its process tree, and wait for its /health: seconds from launch to ready
        (:class:`~llmtrial.serve.server.ServerStartError` when it does not start)."""
        server.start()
        host_source.pid = server.proc.pid if server.proc else None
        return server.wait_ready(self.startup_timeout_s, progress=progress)

    def first_request(self, cold: ColdStart | None = None) -> ColdStart:
        """The cold start ``cold`` (launch to ready) with the first streamed request after it."""
        cs = self.workload.cold_start
        try:
            first = bench.first_request(self.host, self.port, model=self.workload.served_model_name, prompt=cs.prompt,
                                        max_tokens=cs.max_tokens, timeout=float(cs.timeout_s))
        except Exception as exc:  # the server answered /health but cannot serve: a result, not a fault
            raise PhaseFailure("cold_start", "request_failed", f"first request failed: {exc}") from None
        source = "first streamed completion after ready"
        rate = bench.output_rate(first.chunks, first.total_s)
        return (cold or ColdStart()).model_copy(update={
            "first_ttft_s": Fact.model_validate(fact(first.ttft_s, source, unit="s")),
            "first_total_s": Fact.model_validate(fact(first.total_s, source, unit="s")),
            "first_output_tokens": TokensFact.model_validate(fact(first.chunks, source, unit="tokens")),
            "first_output_tok_s": RateFact.model_validate(fact(rate, source, unit="tok/s"))})

    def _telemetry(self, server: ServerProcess, windows: list[Timed], telemetry: Telemetry) -> None:
        """The start-up window's figures, into ``telemetry``; each pass gets its own window's figures and server
        counters."""
        if not self.paths.telemetry.exists():
            return
        df = read_samples(self.paths.telemetry)
        if server.launched_at is not None:
            end = server.ready_at or time.time()
            telemetry.startup_window = window_figures(df, server.launched_at, end)
            telemetry.startup_window.start, telemetry.startup_window.end = server.launched_at, end
        for one, start, end in windows:
            one.telemetry = window_figures(df, start, end)
            deltas = one.telemetry.deltas or {}
            one.server_metrics = ServerMetrics(**{name: deltas[f"metrics.{counter}"] for name, counter
                                                  in SERVER_COUNTERS.items() if f"metrics.{counter}" in deltas})
