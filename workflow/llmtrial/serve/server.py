"""The vLLM server process: argv building, launch in its own session, readiness, teardown.

A server is started with ``start_new_session=True`` so that it and every process it
spawns (engine core, workers) share one process group, which is what :meth:`stop`
signals. Nothing is killed by name. Readiness is ``GET /health`` answering 200 while the
process is still alive. Every launch is written to the trial's ledger before it happens.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from llmtrial.core.configuration_model import ServerStop
from llmtrial.core.ledger import Action, Ledger
from llmtrial.host.process_groups import port_open, stop_group
from llmtrial.host.scratch import make_scratch, remove_scratch, scratch_for
from llmtrial.plan.plan_inputs import ServingArgs

log = logging.getLogger(__name__)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: Flags every trial server gets first; a configuration's own args can override them.
DEFAULT_ARGS: dict[str, Any] = {"enable_prefix_caching": False}


class ServerStartError(RuntimeError):
    """The server did not become ready; ``reason`` is ``exited`` or ``timeout``."""

    def __init__(self, reason: str, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.returncode = returncode


def args_to_flags(args: Mapping[str, Any]) -> list[str]:
    """Turn ``{"max_num_seqs": 4, "enforce_eager": True}`` into vLLM CLI flags.

    Underscores become dashes; ``True`` gives ``--flag``, ``False`` gives ``--no-flag``,
    ``None`` drops the flag, a list repeats its values after one flag, a mapping is
    passed as JSON, anything else as ``str(value)``.
    """
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).lstrip("-").replace("_", "-")
        if value is None:
            continue
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            out.append(flag)
            out.extend(str(v) for v in value)
        elif isinstance(value, Mapping):
            out.extend([flag, json.dumps(value, separators=(",", ":"))])
        else:
            out.extend([flag, str(value)])
    return out


def vllm_flags(args: ServingArgs, launch: Mapping[str, Any] | None = None) -> list[str]:
    """The serving flags of every vLLM process this project starts (a server, a headless rank): the
    trial's defaults, every argument the configuration gave as
    :class:`~llmtrial.plan.plan_inputs.ServingArgs` read them, then ``launch`` (a multi-node rank's)."""
    return args_to_flags({**DEFAULT_ARGS, **args.given, **(launch or {})})


def build_server_argv(
    *,
    model_dir: str,
    served_model_name: str,
    host: str,
    port: int,
    args: ServingArgs,
    launch: Mapping[str, Any] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The argv that starts one configuration's server (no shell involved), its flags
    :func:`vllm_flags`'s."""
    return [
        python, "-m", SERVER_MODULE,
        "--model", model_dir,
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(port),
        *vllm_flags(args, launch),
    ]



class ServerProcess:
    """One vLLM server, as a context manager that always stops its process group."""

    def __init__(
        self,
        argv: list[str],
        *,
        host: str,
        port: int,
        log_path: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        ledger: Ledger | None = None,
        stop_timeout: float = 30.0,
        label: str = "server",
    ) -> None:
        self.argv = argv
        self.host = host
        self.port = port
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.ledger = ledger
        self.stop_timeout = stop_timeout
        self.label = label
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.launched_at: float | None = None
        self.ready_at: float | None = None
        self.stop_result: ServerStop | None = None
        self.started_id: str | None = None  # the ledger entry of the launch, which the stop undoes
        self.scratch: Path | None = None  # its temporary folder, for its IPC sockets (llmtrial.host.scratch)

    # lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if port_open(self.host, self.port):
            raise ServerStartError("port_in_use", f"port {self.host}:{self.port} is already in use before launch")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.scratch, scratch_vars = scratch_for(self.env)
        scratch = {"scratch": str(self.scratch)} if self.scratch else {}
        if self.ledger:
            self.ledger.append(Action.SERVER_LAUNCH, label=self.label, host=self.host, port=self.port,
                               argv=[str(a) for a in self.argv], env_keys=sorted(self.env), **scratch)
        if self.scratch:
            make_scratch(self.scratch)
        logfile = open(self.log_path, "ab")  # noqa: SIM115 - handed to the server process, closed once it is started
        self.launched_at = time.time()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **scratch_vars, **self.env},
                start_new_session=True,
            )
        except BaseException:
            remove_scratch(self.scratch)
            raise
        finally:
            logfile.close()
        self.pgid = self.proc.pid  # session leader: its pid is the group id
        if self.ledger:
            self.started_id = self.ledger.append(Action.SERVER_STARTED, label=self.label, pid=self.proc.pid, pgid=self.pgid,
                               host=self.host, port=self.port, launched_at=self.launched_at, **scratch).id
        log.info("started %s pid=%d on %s:%d", self.label, self.proc.pid, self.host, self.port)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def down_reason(self) -> str:
        """Why :meth:`alive` is false, in words."""
        return f"server exited with code {self.exit_code()}"

    def wait_ready(self, timeout: float, poll: float = 0.5, watch: Callable[[], str | None] | None = None,
                   watch_every: float = 5.0, progress: Callable[[], None] | None = None) -> float:
        """Poll /health until 200; return seconds from launch to ready.

        ``watch`` (called every ``watch_every`` seconds) says why the start cannot succeed any
        more, or None: a rank on another node that died ends the wait as ``exited``. ``progress``
        (called every 2 s and once when ready) tells a person how the start goes; without it, a
        line every 30 s in the log says how long it has taken."""
        assert self.proc is not None and self.launched_at is not None
        deadline = time.monotonic() + timeout
        url = f"http://{self.host}:{self.port}/health"
        last_note = last_watch = last_progress = time.monotonic()
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerStartError("exited", f"server exited with code {rc} before it was ready", rc)
            if watch is not None and time.monotonic() - last_watch >= watch_every:
                last_watch = time.monotonic()
                if (why := watch()) is not None:
                    raise ServerStartError("exited", f"{why} before the server was ready")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        self.ready_at = time.time()
                        if progress is not None:
                            progress()
                        return self.ready_at - self.launched_at
            except (urllib.error.URLError, OSError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError("timeout", f"server not ready after {timeout:.0f} s")
            if progress is not None and time.monotonic() - last_progress >= 2:
                progress()
                last_progress = time.monotonic()
            elif progress is None and time.monotonic() - last_note > 30:
                log.info("waiting for %s: %.0f s since launch", self.label, time.time() - self.launched_at)
                last_note = time.monotonic()
            time.sleep(poll)

    def stop(self) -> ServerStop:
        """Stop the whole process group (idempotent) and confirm the port is closed."""
        if self.stop_result is not None:
            return self.stop_result
        if self.proc is None or self.pgid is None:
            self.stop_result = ServerStop(signals=[], stop_seconds=0.0, survivors=[], port_closed=True)
            return self.stop_result
        stopped = stop_group(self.pgid, host=self.host, port=self.port, timeout=self.stop_timeout,
                             not_before=self.launched_at, leader=self.proc)
        stopped["returncode"] = self.proc.poll()
        if not stopped["survivors"]:  # a survivor may still use its sockets: the folder stays with the open change
            remove_scratch(self.scratch)
        if self.ledger:
            self.ledger.append(Action.SERVER_STOPPED, label=self.label, pgid=self.pgid, port=self.port,
                               **({"undoes": self.started_id} if self.started_id and not stopped["survivors"] else {}),
                               **stopped)
        log.info("stopped %s: %s", self.label, stopped)
        self.stop_result = ServerStop.model_validate(stopped)
        return self.stop_result

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
