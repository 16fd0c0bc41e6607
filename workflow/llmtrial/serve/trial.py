"""One serving configuration's job: make the host ready, serve and measure, compare, stop.

The job runs three phases, each in its own module and each giving its part of the record:
host readiness (:mod:`llmtrial.borrow.readiness`: quiet again, patch again, the GPU census, the serving
environment), measurement (:mod:`llmtrial.serve.measure`: start, cold request, warm-ups, passes,
sweeps, telemetry windows) and comparison (:mod:`llmtrial.serve.comparison`: diagnosis, engine
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
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from llmtrial.borrow.readiness import host_env, ready_host
from llmtrial.core.ledger import Action, Ledger
from llmtrial.core.paths import JobPaths
from llmtrial.core.records import redact_env, write_record
from llmtrial.host.nodes import Node
from llmtrial.logs.lines import read_log
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve import comparison
from llmtrial.serve.measure import Failure, Measurement, Workload
from llmtrial.serve.multinode_job import Spread, node_outcomes
from llmtrial.serve.scenarios import runs_of
from llmtrial.serve.server import ServerProcess, build_server_argv
from llmtrial.serve.telemetry import CSV_HEADER
from llmtrial.weights.manifest import verify_manifest

log = logging.getLogger(__name__)


@dataclass
class TrialJob:
    """One serving configuration's job, built once from the trial's config: :meth:`run` serves,
    measures and stops, and writes the record; each phase returns its own part of it."""

    trial: str
    spec: Mapping[str, Any]
    manifest: Mapping[str, Any]
    plan: Mapping[str, Any]
    services: Mapping[str, Any]
    workload: Workload
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

    @functools.cached_property
    def spread(self) -> Spread | None:
        """The configuration's nodes when it spans several, else None."""
        if len(self.nodes) < 2:
            return None
        return Spread(name=self.spec["name"], label=self.label, trial=self.trial, nodes=self.nodes, port=self.port,
                      launch=str(self.spec.get("launch") or "native"), manifest=self.manifest)

    def argv(self) -> list[str]:
        args = {**self.spec["args"], **(self.spread.server_args() if self.spread else {})}
        return build_server_argv(model_dir=self.model_dir, served_model_name=self.workload.served_model_name,
                                 host=self.host, port=self.port, args=ServingArgs.from_config(args, self.spec["env"]))

    def measurement(self) -> Measurement:
        return Measurement(
            name=self.spec["name"], label=self.label, host=self.host, port=self.port,
            model_dir=self.model_dir, workload=self.workload,
            startup_timeout_s=float(self.spec["startup_timeout_s"]), paths=self.paths,
            gpus=[g["index"] for g in self.gpus], block_size=(self.plan.get("plan") or {}).get("block_size"),
            nodes=self.nodes)

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
        ledger = Ledger(self.paths.ledger)
        ready = ready_host(results=self.paths.trial.root, services=self.services, ports=[self.port], host=self.host,
                           patches=self.patches, ledger=ledger, patches_dir=self.paths.trial.patches, gpus=self.gpus,
                           allow_processes=self.hardware.get("allow_processes") or [])
        if ready.requieted is not None:
            record["services_requieted"] = ready.requieted
        spread = self.spread
        envs = spread.envs(ledger, ready.patched, self.spec["env"]) if spread else \
            {"": host_env(self.gpus, self.spec["env"], ready.patched)}
        env = envs[self.nodes[0].name] if spread else envs[""]
        record["gpu_census"] = ready.census
        if ready.busy:
            return self._not_served(record, "failed", Failure("gpu_check", "gpu_in_use", ready.busy))
        if spread:
            record.update(spread.record(gpus=bool((self.plan.get("hardware") or {}).get("gpus"))))
            if not record["collective"]["ok"]:
                return self._not_served(record, "failed", Failure("sanity_check", "collective_failed",
                                                                  record["collective"]["diagnosis"]))
        record["server"]["env"] = redact_env(env)
        job = ledger.append(Action.JOB_STARTED, label=self.label, pid=os.getpid(), create_time=psutil.Process().create_time())
        self._measured(record, self.measurement().serve(ledger, self._server(ledger, env, envs)))
        text = read_log(self.paths.server_log) if self.paths.server_log.exists() else ""
        if record["failure"]:
            record.update(comparison.diagnosis(record, text, ledger=ledger, gpus=self.gpus,
                                               kernel_baseline=self.kernel_baseline, label=self.label,
                                               health_check=self.hardware.get("health_check")))
        node_outcomes(record, ready.patched["patches"], envs, self.paths.out_dir)
        record.update(comparison.compare(record, text, plan=self.plan, patched=ready.patched, env=env))
        write_record(self.paths.record, record, schema="configuration")
        ledger.append(Action.JOB_FINISHED, label=self.label, pid=os.getpid(), undoes=job["id"])
        return record

    def _measured(self, record: dict[str, Any], served: dict[str, Any]) -> None:
        """The measurement's parts into the record, with its status and timings."""
        record["server"].update(served.pop("server"))
        record["timing"].update(served.pop("bench_worker"))
        record["telemetry"].update(served.pop("telemetry"))
        record.update(served)
        record["status"] = "failed" if record["failure"] else "ok"
        record["timing"].update(self._timing(record))

    def _server(self, ledger: Ledger, env: Mapping[str, str], envs: Mapping[str, Mapping[str, str]]) -> ServerProcess:
        """The configuration's server: on this host, or node 0's with the other nodes' ranks."""
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port, "log_path": self.paths.server_log,
                                  "env": dict(env), "stop_timeout": float(self.spec["stop_timeout_s"]),
                                  "label": self.label}
        if self.spread:
            return self.spread.server(self.argv(), ledger, envs, self.spec["args"], **kwargs)
        return ServerProcess(self.argv(), ledger=ledger, **kwargs)

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
