"""The scenarios' passes on one running server: each scenario's warm-up, then its repeated passes until
they agree (or a sweep's steps), each benchmark pass in its own telemetry window, appended to the record's
scenarios as it runs. A phase that ends the configuration is a :class:`PhaseFailure`, a result the record keeps.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmtrial.core.configuration_model import Failure as FailureRecord
from llmtrial.core.paths import JobPaths
from llmtrial.core.records import read_record
from llmtrial.core.scenario_model import Agreement, Pass, Repetition, Scenario, Step, Window
from llmtrial.core.trial_config import BenchBlock
from llmtrial.host.telemetry_sources import RAPL_SOURCE
from llmtrial.serve import bench
from llmtrial.serve.bench_worker import BenchWorker
from llmtrial.serve.datasets import JobScenario, PassLoad
from llmtrial.serve.progress import pass_line, say, stopped_line
from llmtrial.serve.scenarios import RepetitionRule, RequestDetail, goodput, is_sweep, spread_of
from llmtrial.serve.scenarios import steps as sweep_steps
from llmtrial.serve.server import ServerProcess
from llmtrial.serve.telemetry import Sampler, window_edge

log = logging.getLogger(__name__)

#: The sources whose counters are sampled at each pass's edges too (when sampled at all): /metrics, the GPUs'
#: energy (NVML) and the CPU packages' (RAPL).
EDGE_SOURCES = ("metrics", "nvml", RAPL_SOURCE)
#: A scenario to run: its position in the trial file (its seeds), its name and the scenario.
Todo = tuple[int, str, JobScenario]
#: A pass's record entry with its telemetry window's start and end.
Timed = tuple[Pass, float, float]
#: One benchmark run of a scenario: (the run's load, its number, its file stem) -> its record entry.
RunPass = Callable[[PassLoad, int, str], Pass]


@dataclass
class PhaseFailure(Exception):
    """A phase that ended the configuration: a result, not a fault of the workflow."""

    phase: str
    reason: str
    message: str
    returncode: int | None = None
    #: When the server was found down (Unix time), where it exited after it was ready.
    found_down_at: float | None = None

    def as_record(self) -> FailureRecord:
        return FailureRecord(phase=self.phase, reason=self.reason, message=self.message, returncode=self.returncode)


@dataclass
class Passes:
    """What every pass of one configuration's job shares: where the server listens, the model's tokenizer, the
    benchmark's settings and worker, the telemetry sampler, and the lists the passes are kept in (``windows``
    for their telemetry, ``out`` the record's scenarios), across the job's servers."""

    name: str
    host: str
    port: int
    model_dir: str
    served_model_name: str
    bench_settings: BenchBlock
    #: The confidence level of the passes' interval rule (``statistics.level``).
    level: float
    paths: JobPaths
    sampler: Sampler
    worker: BenchWorker
    windows: list[Timed]
    out: list[Scenario]

    def run(self, server: ServerProcess, todo: list[Todo], *, caching: bool, relaunched: bool = False) -> PhaseFailure | None:
        """The scenarios of ``todo`` on ``server``, in order, each appended to ``out`` as it runs: its warm-up
        pass when asked, then its passes (or a sweep's steps); returns the first failed pass, or None.
        ``caching``: the server has prefix caching on. A server that dies ends the phase at once (raised as
        :class:`PhaseFailure`)."""
        failed: PhaseFailure | None = None
        for s_index, name, scenario in todo:
            entry = Scenario(name=name, spec=scenario.spec(), kind="sweep" if is_sweep(scenario.block) else "fixed",
                             pass_results=[], warmup=None, prefix_caching=caching,
                             **({"relaunched": True} if relaunched else {}))
            self.out.append(entry)
            run: RunPass = functools.partial(self._checked_pass, server, name, s_index, scenario)
            if scenario.block.warmup:
                entry.warmup = warmup = run(PassLoad.at(scenario.block), 0, f"{name}-warmup")
                say("%s (kept out of the figures)", pass_line(self.name, f"{name} warm-up", warmup))
            first = (self._sweep if entry.kind == "sweep" else self._repeat)(entry, scenario, run)
            failed = failed or first
        return failed

    def _sweep(self, entry: Scenario, scenario: JobScenario, run: RunPass) -> PhaseFailure | None:
        """A sweep's steps in order, each one pass with its own seed, into ``entry.steps``."""
        failed: PhaseFailure | None = None
        entry.steps = []
        block = scenario.block
        swept = {"concurrency": isinstance(block.concurrency, list), "input_len": isinstance(block.input_len, list),
                 "output_len": isinstance(block.output_len, list), "num_prompts": isinstance(block.num_prompts, list)}
        for load in sweep_steps(block):
            one = run(load, int(load.step or 0), f"{entry.name}-step{load.step}")
            assert isinstance(one, Step)
            entry.steps.append(one)
            values = {"concurrency": load.concurrency, "input_len": load.input_len, "output_len": load.output_len,
                      "num_prompts": load.num_prompts}
            said = ", ".join(f"{k} {v}" for k, v in values.items() if swept[k])
            say("%s", pass_line(self.name, f"{entry.name} step {load.step} ({said})", one))
            failed = failed or _pass_failure(entry.name, one)
        return failed

    def _repeat(self, entry: Scenario, scenario: JobScenario, run: RunPass) -> PhaseFailure | None:
        """A scenario's passes until its repetition rule says stop; the record says why it stopped."""
        rule = RepetitionRule.of(scenario.block.passes, self.level)
        failed: PhaseFailure | None = None
        stopped = None
        while stopped is None:
            p = len(entry.pass_results) + 1
            one = run(PassLoad.at(scenario.block), p, f"{entry.name}-pass{p}")
            entry.pass_results.append(one)
            failed = failed or _pass_failure(entry.name, one)
            ok = [q.summary for q in entry.pass_results if q.status == "ok" and q.summary is not None]
            values = [float(s.output_throughput) for s in ok if s.output_throughput is not None]
            stopped = rule.verdict(values, p, one.status == "failed")
            say("%s", pass_line(self.name, f"{entry.name} pass {p}", one, spread_of(values), len(values)))
        spread = spread_of(values)
        entry.repetition = Repetition(min=rule.min, max=rule.max, agreement=rule.agreement, interval=rule.interval,
                                      level=rule.level, passes_run=len(entry.pass_results), spread=spread,
                                      interval_width=rule.interval_width(values), stopped=stopped)
        ttfts = [float(s.median_ttft_ms) if s.median_ttft_ms is not None else None for s in ok]
        entry.agreement = Agreement(output_throughput=spread, median_ttft_ms=spread_of(ttfts))
        say("%s", stopped_line(self.name, entry.name, entry.repetition))
        return failed

    def _checked_pass(self, server: ServerProcess, name: str, s_index: int, scenario: JobScenario, load: PassLoad,
                      p: int, stem: str) -> Pass:
        """One pass (window kept for telemetry); a server that died during it ends the phase."""
        one = self._pass(scenario, load, p, bench.pass_seed(self.bench_settings.seed, s_index, p), stem)
        assert one.window is not None and one.window.start is not None and one.window.end is not None
        self.windows.append((one, one.window.start, one.window.end))
        if not server.alive():
            raise PhaseFailure("benchmark", "exited", f"{server.down_reason()} during scenario {name} ({stem})",
                               server.exit_code(), found_down_at=time.time())
        return one

    def _pass(self, scenario: JobScenario, load: PassLoad, p: int, seed: int, stem: str) -> Pass:
        """One benchmark pass (a sweep's step: ``load.step``) inside its telemetry window: its record entry."""
        percentiles = list(self.bench_settings.percentiles)
        bench_dir = self.paths.bench_dir
        argv = bench.bench_argv(host=self.host, port=self.port, served_model_name=self.served_model_name,
                                tokenizer=self.model_dir, scenario=scenario, load=load, seed=seed,
                                result_dir=str(bench_dir), result_filename=f"{stem}.json", percentiles=percentiles)
        log.info("%s: %s (seed %d)", self.name, stem, seed)
        # the window opens before its first sample of each counter (/metrics, the GPUs' and the CPU packages'
        # energy) and closes after its last, so a counter's change over the window is exactly the pass's own
        edges = [name for name in EDGE_SOURCES if name in self.sampler.names]
        w_start = window_edge(time.time())
        self.sampler.mark(f"{stem}:start")  # the CSV names its own windows
        for name in edges:
            self.sampler.sample_now(name)
        run = self.worker.run(argv, log_path=bench_dir / f"{stem}.log", timeout=float(scenario.block.timeout_s))
        for name in edges:
            self.sampler.sample_now(name)
        self.sampler.mark(f"{stem}:end")
        w_end = window_edge(time.time(), end=True)
        result_file = bench_dir / f"{stem}.json"
        ok = run.returncode == 0 and result_file.exists()
        kind = Pass if load.step is None else functools.partial(
            Step, step=load.step, concurrency=load.concurrency, input_len=load.input_len, output_len=load.output_len,
            num_prompts=load.num_prompts)
        one = kind(pass_=p, seed=seed, start=run.start, end=run.end, status="ok" if ok else "failed",
                   argv=argv, log=self.paths.rel(bench_dir / f"{stem}.log"), returncode=run.returncode,
                   timed_out=run.timed_out)
        if ok:
            one.result_file = self.paths.rel(result_file)
            result = read_record(result_file)
            one.summary = summary = bench.summarize_result(result, percentiles)
            if scenario.block.slo:
                summary.goodput = goodput(RequestDetail.model_validate(result), scenario.block.slo)
            one.stall = bench.stall_flag(summary.mean_ttft_ms, summary.median_ttft_ms)
        one.window = Window(start=w_start, end=w_end)
        return one


def _pass_failure(name: str, one: Pass) -> PhaseFailure | None:
    if one.status != "failed":
        return None
    return PhaseFailure("benchmark", "pass_failed", f"benchmark pass {name}/{one.pass_} failed "
                   f"(exit {one.returncode}{', timed out' if one.timed_out else ''})")
