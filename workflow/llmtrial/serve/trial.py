"""One serving configuration's job: make the host ready, serve and measure, compare, stop.

The job runs three phases, each in its own module and each giving its part of the record:
host readiness (:mod:`llmtrial.lifecycle.readiness`: quiet again, patch again, the GPU census, the serving
environment), measurement (:mod:`llmtrial.serve.measure`: start, cold request, warm-ups, passes,
sweeps, telemetry windows) and review (:mod:`llmtrial.serve.log_review`: diagnosis, engine
warnings, predictions, the throughput bound). A multi-node configuration's side of each lives in
:mod:`llmtrial.serve.multinode_job`.

The outcome is always a record. A server that fails to start, times out, or dies during
the benchmark gives ``status: failed`` with the phase, the log tail and the line that
explains it; only faults of the workflow itself raise.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from llmtrial.core.configuration_model import ConfigurationRecord, PlanVerdict, Server, Telemetry, Timing
from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.core.ledger import Action, Ledger
from llmtrial.core.paths import JobPaths
from llmtrial.core.preflight_model import SelectedGpu
from llmtrial.core.record_models import ManifestRecord, PlanRecord
from llmtrial.core.records import write_record
from llmtrial.core.redact import redact_env
from llmtrial.core.trial_config import HardwareBlock, PatchBlock
from llmtrial.host.nodes import Node
from llmtrial.lifecycle.readiness import Readiness, host_env, ready_host
from llmtrial.logs.lines import read_log
from llmtrial.logs.signature import signature_record
from llmtrial.patch.plugin import NodePatches
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve import log_review
from llmtrial.serve.answers_job import job_answers, patch_flags
from llmtrial.serve.confirm import candidate, confirm
from llmtrial.serve.idle import down_state
from llmtrial.serve.measure import Measurement, Served, Workload
from llmtrial.serve.multinode_job import Spread, node_outcomes
from llmtrial.serve.passes import PhaseFailure
from llmtrial.serve.progress import outcome_line, say
from llmtrial.serve.server import DEFAULT_ARGS, ServerProcess, build_server_argv
from llmtrial.serve.telemetry import CSV_HEADER
from llmtrial.weights.manifest import require_staged

log = logging.getLogger(__name__)

@dataclass
class TrialJob:
    """One serving configuration's job, built once from the trial's config: :meth:`run` serves,
    measures and stops, and writes the record; each phase returns its own part of it."""

    trial: str
    spec: ConfigurationSpec
    manifest: ManifestRecord
    plan: PlanRecord
    services: Mapping[str, Any]
    workload: Workload
    paths: JobPaths
    patches: Mapping[str, PatchBlock] = field(default_factory=dict)
    #: The nodes the configuration spans, the first serving the API (none or one: this host).
    nodes: Sequence[Node] = ()
    #: The trial file's ``hardware`` (allow_processes, health_check) and preflight's kernel-log baseline.
    hardware: HardwareBlock = field(default_factory=HardwareBlock)
    kernel_baseline: Sequence[str] = ()
    #: With failures.confirm: every other configuration's spec, which a failed one may be relaunched against.
    confirm_against: Mapping[str, ConfigurationSpec] = field(default_factory=dict)

    @property
    def gpus(self) -> list[SelectedGpu]:
        """The GPUs the trial selected (preflight's resolution of ``hardware.gpus``, via the plan)."""
        return list(self.plan.hardware.selected_gpus or [])

    @property
    def label(self) -> str:
        return f"{self.trial}/{self.spec.name}"

    @functools.cached_property
    def spread(self) -> Spread | None:
        """The configuration's nodes when it spans several, else None."""
        if len(self.nodes) < 2:
            return None
        return Spread(name=self.spec.name, label=self.label, trial=self.trial, nodes=self.nodes, port=self.spec.port,
                      launch=self.spec.spread_launch, manifest=self.manifest)

    @property
    def prefix_caching(self) -> bool:
        """The configuration's own args turn prefix caching on (the trial's servers otherwise have it off)."""
        return bool({**DEFAULT_ARGS, **self.spec.args}.get("enable_prefix_caching"))

    def serving_args(self, prefix_caching: bool = False, spec: ConfigurationSpec | None = None) -> ServingArgs:
        """The configuration's vLLM args, every rank's; ``prefix_caching``: the relaunch for the scenarios that
        need it on; ``spec``: another spec's args and env in place of the configuration's (a confirming relaunch)."""
        spec = spec or self.spec
        args = {**spec.args, **({"enable_prefix_caching": True} if prefix_caching else {})}
        return ServingArgs.from_config(args, spec.env)

    def argv(self, prefix_caching: bool = False, spec: ConfigurationSpec | None = None) -> list[str]:
        """The API server's argv (node 0's, with its launch arguments where the configuration spans nodes)."""
        return build_server_argv(model_dir=self.manifest.model_dir, served_model_name=self.workload.served_model_name,
                                 host=self.spec.host, port=self.spec.port, args=self.serving_args(prefix_caching, spec),
                                 launch=self.spread.server_args() if self.spread else None)

    def measurement(self, flags: Mapping[str, bool] | None = None,
                    relaunch: Callable[[], ServerProcess] | None = None) -> Measurement:
        return Measurement(
            name=self.spec.name, label=self.label, host=self.spec.host, port=self.spec.port,
            model_dir=self.manifest.model_dir, workload=self.workload,
            startup_timeout_s=self.spec.startup_timeout_s, paths=self.paths,
            gpus=[g.index for g in self.gpus], block_size=self.plan.figures.block_size,
            nodes=self.nodes, flags=dict(flags or {}), prefix_caching=self.prefix_caching, relaunch=relaunch,
            idle_watch_s=self.spec.idle_watch_s)

    def _flags_off_server(self, ledger: Ledger, env: Mapping[str, str]) -> ServerProcess:
        """The configuration's server with the patch flags off (``env``), for the answers alone."""
        return ServerProcess(self.argv(), ledger=ledger, host=self.spec.host, port=self.spec.port, log_path=self.paths.flags_off_log,
                             env=dict(env), stop_timeout=self.spec.stop_timeout_s,
                             label=f"{self.label} (patch flags off)")

    def run(self) -> ConfigurationRecord:
        """Run the configuration end to end and write its record; returns the record, and says its
        outcome on the terminal (:mod:`llmtrial.serve.progress`).

        The trial's ``patches`` are applied again first when a cleanup reverted them, the
        plugin folder goes on the server's PYTHONPATH, and the record says per patch whether
        its flag was on and which processes logged its behaviour."""
        record = self._run()
        say("%s", outcome_line(record, str(self.paths.record)))
        return record

    def _run(self) -> ConfigurationRecord:
        self.paths.fresh()
        job_start, argv = time.time(), self.argv()
        if self.plan.verdict == "does_not_fit" and not self.spec.force:
            return self._skip(job_start, argv)
        require_staged(self.manifest)
        ledger = Ledger(self.paths.ledger)
        ready = ready_host(results=self.paths.trial.root, services=self.services, ports=[self.spec.port], host=self.spec.host,
                           patches=self.patches, ledger=ledger, patches_dir=self.paths.trial.patches, gpus=self.gpus,
                           allow_processes=self.hardware.allow_processes)
        parts: dict[str, Any] = {} if ready.requieted is None else {"services_requieted": ready.requieted}
        spread = self.spread
        served_with = spread.envs(ledger, ready.patched, self.spec.env) if spread else None
        envs = served_with.envs if served_with else {"": host_env(self.gpus, self.spec.env, ready.patched)}
        env = envs[self.nodes[0].name] if spread else envs[""]
        parts["gpu_census"] = ready.census
        if ready.busy:
            return self._not_served(job_start, argv, "failed", PhaseFailure("gpu_check", "gpu_in_use", ready.busy), **parts)
        if spread:
            parts.update(spread.record(gpus=bool(self.plan.hardware.gpus))._asdict())
            if not parts["collective"].ok:
                return self._not_served(job_start, argv, "failed", PhaseFailure("sanity_check", "collective_failed",
                                                                           parts["collective"].diagnosis), **parts)
        job = ledger.append(Action.JOB_STARTED, label=self.label, pid=os.getpid(), create_time=psutil.Process().create_time())
        flags = patch_flags(ready.patched.patches, env)
        relaunch = functools.partial(self._server, ledger, env, envs, prefix_caching=True)
        served = self.measurement(flags, relaunch).serve(ledger, self._server(ledger, env, envs))
        parts.update(job_answers(self.workload, served, flags=flags, spread=self.spread is not None, env=env,
                                 patches=ready.patched.patches, server=functools.partial(self._flags_off_server, ledger),
                                 log_rel=self.paths.rel(self.paths.flags_off_log),
                                 startup_timeout_s=self.spec.startup_timeout_s))
        record = self._confirmed(self._served(job_start, argv, served, ledger=ledger, ready=ready, env=env,
                                              served_with=served_with, parts=parts), ledger, ready)
        write_record(self.paths.record, record, schema="configuration")
        ledger.append(Action.JOB_FINISHED, label=self.label, pid=os.getpid(), undoes=job.id)
        return record

    def _served(self, job_start: float, argv: list[str], served: Served, *, ledger: Ledger, ready: Readiness,
                env: Mapping[str, str], served_with: NodePatches | None, parts: dict[str, Any]) -> ConfigurationRecord:
        """The record of a configuration whose server was launched: the measurement's parts, what the log
        explains (the failure's line, the GPUs' health, each node's outcome) and the figures beside the plan."""
        job_end = time.time()
        ready_seconds = served.cold_start.ready_seconds
        timing = Timing(job_start=job_start, bench_import_s=served.bench_import_s, bench_workers=served.bench_workers,
                        bench_worker_pids=served.bench_worker_pids,
                        job_end=job_end, wall_s=job_end - job_start,
                        startup_s=ready_seconds.value if ready_seconds else None,
                        bench_s=sum(p.end - p.start for s in served.scenarios for _, p in s.runs()))
        source = self.paths.rel(self.paths.server_log)
        text = read_log(self.paths.server_log) if self.paths.server_log.exists() else ""
        failure, health = served.failure, {}
        if failure is not None:
            found = log_review.review_failure(failure, text, source=source, ready=served.ready, ledger=ledger, gpus=self.gpus,
                                         kernel_baseline=self.kernel_baseline, label=self.label,
                                         health_check=self.hardware.health_check)
            failure, health = found.failure, {"gpu_health": found.gpu_health}
        if "nodes" in parts and served_with is not None:
            parts["nodes"] = node_outcomes(parts["nodes"], ranks=served.server.ranks or {}, server_log=source,
                                           failed=failure is not None, ready=served.ready, served=served_with,
                                           out_dir=self.paths.out_dir)
        if failure is not None:
            ranks = [n.log for n in parts.get("nodes") or [] if n.rank and n.log]  # each fetched from its node
            logs = [(source, text), *((name, read_log(self.paths.out_dir / name)) for name in ranks
                                      if (self.paths.out_dir / name).is_file())]
            signature = signature_record(logs)
            failure = failure.model_copy(update={"signature": signature}) if signature is not None else failure
        if failure is not None and served.found_down_at is not None:  # exited after it was ready: idle or not
            failure.down = down_state(self.paths.telemetry, served.found_down_at, served.telemetry.sources,
                                      health.get("gpu_health"))
        reviewed = log_review.review(text, source=source, startup=served.startup, scenarios=served.scenarios,
                                      plan=self.plan, patched=ready.patched, env=env, ready_seconds=timing.startup_s)
        return self._record(
            status="failed" if failure else "ok", failure=failure,
            server=served.server.onto(self._server_part(argv, env)), startup=reviewed.startup,
            **({"prefix_caching_server": served.relaunch.onto(self._server_part(argv, env))} if served.relaunch else {}),
            engine_warnings=reviewed.engine_warnings, cold_start=served.cold_start, scenarios=served.scenarios,
            **({"startup_phases": reviewed.startup_phases, "compile_cache": reviewed.compile_cache}
               if reviewed.startup_phases else {}),
            telemetry=served.telemetry, timing=timing,
            prediction=reviewed.prediction, **parts, **health, patches=reviewed.patches,
            throughput_bound=reviewed.throughput_bound)

    def _confirmed(self, record: ConfigurationRecord, ledger: Ledger, ready: Readiness) -> ConfigurationRecord:
        """``record`` with the relaunches that confirm its crash's cause (:mod:`llmtrial.serve.confirm`),
        where failures.confirm is on and another configuration differs from this one in one knob."""
        failure = record.failure
        if not self.confirm_against or failure is None or failure.signature is None or self.spread:
            return record
        found = candidate(self.spec, self.confirm_against)
        if found is None:
            return record

        def server_for(spec: ConfigurationSpec, log_path: Path) -> ServerProcess:
            return ServerProcess(self.argv(spec=spec), ledger=ledger, host=spec.host, port=spec.port, log_path=log_path,
                                 env=host_env(self.gpus, spec.env, ready.patched), stop_timeout=spec.stop_timeout_s,
                                 label=f"{self.label} (confirming {found.knob})")

        confirmation = confirm(self.spec, failure.signature, found, server_for=server_for, out_dir=self.paths.out_dir,
                               timeout=self.spec.startup_timeout_s, rel=self.paths.rel)
        return record.model_copy(update={"confirmation": confirmation})

    def _server_part(self, argv: list[str], env: Mapping[str, str]) -> Server:
        """How the server was (or would have been) started."""
        return Server(argv=argv, env=redact_env(env), host=self.spec.host, port=self.spec.port,
                      log=self.paths.rel(self.paths.server_log))

    def _record(self, **parts: Any) -> ConfigurationRecord:
        """The configuration record of ``parts``, beside what every record says: the trial, the
        configuration, the plan's verdict, and empty parts where nothing was measured."""
        gpus = {"gpus": ",".join(str(g.index) for g in self.gpus)} if self.gpus else {}
        knobs = {**self.spec.knobs(), **gpus}
        return ConfigurationRecord(**{
            "trial": self.trial, "configuration": self.spec.name, "description": self.spec.description,
            **({"knobs": knobs} if knobs else {}),
            "failure": None, "startup": {}, "engine_warnings": [], "cold_start": {}, "scenarios": [], "prediction": [],
            "plan": PlanVerdict(verdict=self.plan.verdict, reasons=self.plan.reasons,
                                forced=self.spec.force),
            **parts})

    def _server(self, ledger: Ledger, env: Mapping[str, str], envs: Mapping[str, Mapping[str, str]],
                prefix_caching: bool = False) -> ServerProcess:
        """The configuration's server: on this host, or node 0's with the other nodes' ranks;
        ``prefix_caching``: launched again with it on, logging to its own file."""
        argv = self.argv(prefix_caching)
        make: Callable[..., ServerProcess] = functools.partial(
            self.spread.server, argv, ledger, envs, self.serving_args(prefix_caching)) if self.spread else \
            functools.partial(ServerProcess, argv, ledger=ledger)
        return make(host=self.spec.host, port=self.spec.port, env=dict(env),
                    log_path=self.paths.prefix_caching_log if prefix_caching else self.paths.server_log,
                    stop_timeout=self.spec.stop_timeout_s,
                    label=f"{self.label} (prefix caching on)" if prefix_caching else self.label)

    def _skip(self, job_start: float, argv: list[str]) -> ConfigurationRecord:
        log.warning("%s not launched: the planner says it cannot work: %s", self.spec.name,
                    "; ".join(self.plan.reasons))
        return self._not_served(job_start, argv, "skipped")

    def _not_served(self, job_start: float, argv: list[str], status: str, failure: PhaseFailure | None = None,
                    **parts: Any) -> ConfigurationRecord:
        """The record of a configuration whose server never started (skipped, or stopped by its
        sanity check), with an empty telemetry file."""
        if failure is not None:
            log.warning("configuration %s failed in %s: %s", self.spec.name, failure.phase, failure.message)
        job_end = time.time()
        record = self._record(status=status, failure=failure.as_record() if failure is not None else None,
                              server=self._server_part(argv, self.spec.env),
                              telemetry=Telemetry(file=self.paths.rel(self.paths.telemetry)),
                              timing=Timing(job_start=job_start, job_end=job_end, wall_s=job_end - job_start), **parts)
        self.paths.telemetry.write_text(",".join(CSV_HEADER) + "\n")
        write_record(self.paths.record, record, schema="configuration")
        return record
