"""The host's other services: quiet them before a trial, give them back after it.

A service has a kind (how to ask whether it runs, stop it and start it) and a health
check (how to tell that it really answers). Every command is an argv list; nothing goes
through a shell. Quieting writes each service's state to the trial ledger *before*
stopping it, so a restore needs nothing but the ledger: only a service that was running
is stopped, and only a service the ledger says this trial stopped is started again.
What does not come back healthy is a residue with what was tried and what was seen.

Kinds: ``systemd`` (systemctl), ``docker`` (a container), ``supervisor`` (a
supervisorctl program) and ``command`` (argv lists of your own). Health checks: ``http``
(URL and expected status), ``tcp`` (host and port), ``command`` (exit status 0) and
``completion`` (a short completion against an OpenAI-compatible endpoint).
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from llmtrial.ledger import Ledger

log = logging.getLogger(__name__)

Runner = Callable[..., subprocess.CompletedProcess[str]]


def run_argv(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one command (argv list, no shell), capturing its output."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)


@dataclass
class Service:
    """One service as the trial config describes it."""

    name: str
    kind: str
    target: str = ""  # systemd unit, docker container or supervisor program
    supervisor_config: str | None = None  # supervisorctl -c FILE
    status_argv: list[str] = field(default_factory=list)  # kind command
    stop_argv: list[str] = field(default_factory=list)
    start_argv: list[str] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)
    stop_timeout_s: float = 60.0
    start_timeout_s: float = 120.0
    health_timeout_s: float = 120.0

    @property
    def has_health(self) -> bool:
        return bool(self.health.get("kind"))

    @classmethod
    def from_config(cls, name: str, entry: Mapping[str, Any]) -> "Service":
        timeouts = entry.get("timeouts") or {}
        return cls(
            name=name, kind=entry["kind"], target=str(entry.get("target") or name),
            supervisor_config=entry.get("supervisor_config"),
            status_argv=list(entry.get("status") or []), stop_argv=list(entry.get("stop") or []),
            start_argv=list(entry.get("start") or []), health=dict(entry.get("health") or {}),
            stop_timeout_s=float(timeouts.get("stop_s", 60)), start_timeout_s=float(timeouts.get("start_s", 120)),
            health_timeout_s=float(timeouts.get("health_s", 120)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "target": self.target, "supervisor_config": self.supervisor_config,
            "status": self.status_argv, "stop": self.stop_argv, "start": self.start_argv, "health": self.health,
            "timeouts": {"stop_s": self.stop_timeout_s, "start_s": self.start_timeout_s, "health_s": self.health_timeout_s},
        }

    # the commands of each kind ----------------------------------------------------------
    def _supervisorctl(self, *args: str) -> list[str]:
        cfg = ["-c", self.supervisor_config] if self.supervisor_config else []
        return ["supervisorctl", *cfg, *args]

    def argv(self, action: str) -> list[str]:
        """The argv for ``status``, ``stop`` or ``start``."""
        if self.kind == "systemd":
            return {"status": ["systemctl", "is-active", "--quiet", self.target],
                    "stop": ["systemctl", "stop", self.target],
                    "start": ["systemctl", "start", self.target]}[action]
        if self.kind == "docker":
            return {"status": ["docker", "inspect", "--format", "{{.State.Running}}", self.target],
                    "stop": ["docker", "stop", "--time", str(int(self.stop_timeout_s)), self.target],
                    "start": ["docker", "start", self.target]}[action]
        if self.kind == "supervisor":
            return self._supervisorctl(action, self.target)
        if self.kind == "command":
            chosen = {"status": self.status_argv, "stop": self.stop_argv, "start": self.start_argv}[action]
            if not chosen:
                raise ValueError(f"service {self.name}: kind command needs a {action!r} argv list")
            return list(chosen)
        raise ValueError(f"service {self.name}: unknown kind {self.kind!r}")

    def is_running(self, runner: Runner = run_argv) -> bool:
        out = runner(self.argv("status"), timeout=30)
        if self.kind == "docker":
            return out.returncode == 0 and out.stdout.strip() == "true"
        if self.kind == "supervisor":
            # supervisorctl status exits 0 only for RUNNING (3 for stopped, 4 for no such process)
            return out.returncode == 0 and "RUNNING" in out.stdout
        return out.returncode == 0


def healthy(service: Service, timeout: float = 5.0) -> tuple[bool, str]:
    """One health probe: (answered as expected, what was seen)."""
    h = service.health
    kind = h.get("kind")
    if not kind:
        return True, "no health check configured"
    try:
        if kind == "http":
            try:
                with urllib.request.urlopen(h["url"], timeout=timeout) as resp:
                    status = resp.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            want = int(h.get("expect_status", 200))
            return status == want, f"HTTP {status} from {h['url']} (want {want})"
        if kind == "tcp":
            with socket.create_connection((h.get("host", "127.0.0.1"), int(h["port"])), timeout=timeout):
                return True, f"{h.get('host', '127.0.0.1')}:{h['port']} accepts connections"
        if kind == "command":
            out = run_argv(list(h["argv"]), timeout=timeout)
            return out.returncode == 0, f"exit {out.returncode}: {(out.stdout + out.stderr).strip()[-200:]}"
        if kind == "completion":
            body = json.dumps({"model": h["model"], "prompt": h.get("prompt", "Hello"),
                               "max_tokens": int(h.get("max_tokens", 4))}).encode()
            req = urllib.request.Request(h["url"].rstrip("/") + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=float(h.get("timeout_s", timeout))) as resp:
                text = json.loads(resp.read())["choices"][0].get("text", "")
            return True, f"completion answered ({len(text)} characters)"
        return False, f"unknown health check kind {kind!r}"
    except (OSError, subprocess.SubprocessError, KeyError, ValueError, json.JSONDecodeError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


def _wait(predicate: Callable[[], tuple[bool, str]], timeout: float, poll: float = 0.5) -> tuple[bool, str, float]:
    t0 = time.monotonic()
    ok, seen = predicate()
    while not ok and time.monotonic() - t0 < timeout:
        time.sleep(poll)
        ok, seen = predicate()
    return ok, seen, time.monotonic() - t0


def quiet(services: list[Service], ledger: Ledger, runner: Runner = run_argv) -> dict[str, Any]:
    """Stop every running service, ledger first, and wait until each is really down.

    Returns the quieted-state record: per service its state before, what was done, when,
    and how long it took to go down; residues for a service that would not.
    """
    items, residues = [], []
    for svc in services:
        was_running = svc.is_running(runner)
        ledger.append("service_quiet", service=svc.to_json(), was_running=was_running)
        item: dict[str, Any] = {"name": svc.name, "kind": svc.kind, "was_running": was_running}
        if not was_running:
            item["action"] = "left stopped (was not running)"
            items.append(item)
            continue
        item["stopped_at"] = time.time()
        out = runner(svc.argv("stop"), timeout=svc.stop_timeout_s)
        down, seen, took = _wait(lambda: _down(svc, runner), svc.stop_timeout_s)
        item.update(action="stopped", stop_exit=out.returncode, down_after_s=round(took, 3), seen=seen)
        if not down:
            residues.append({"kind": "service", "what": svc.name, "tried": " ".join(svc.argv("stop")),
                             "seen": f"still up after {svc.stop_timeout_s:g} s: {seen}"})
        ledger.append("service_stopped", name=svc.name, down=down)
        log.info("quieted %s: %s", svc.name, item["action"])
        items.append(item)
    return {"services": items, "residues": residues, "quieted_at": time.time()}


def _down(svc: Service, runner: Runner) -> tuple[bool, str]:
    running = svc.is_running(runner)
    ok, seen = healthy(svc, timeout=2.0) if svc.has_health else (False, "no health check")
    return (not running and not (svc.has_health and ok)), f"running={running}; health: {seen}"


def restore(entries: list[dict[str, Any]], ledger: Ledger, runner: Runner = run_argv) -> dict[str, Any]:
    """Start again, in reverse order, each service the ledger says this trial stopped and has
    not restored yet, and health-check it. Idempotent: a second call finds nothing to do."""
    restored_names = {e["name"] for e in entries if e.get("action") == "service_restored"}
    quieted = [e for e in entries if e.get("action") == "service_quiet" and e.get("was_running")]
    items, residues = [], []
    for entry in reversed(quieted):
        svc = Service.from_config(entry["service"]["name"], entry["service"])
        if svc.name in restored_names:
            continue
        item: dict[str, Any] = {"name": svc.name, "kind": svc.kind, "started_at": time.time()}
        running = svc.is_running(runner)
        if not running:
            out = runner(svc.argv("start"), timeout=svc.start_timeout_s)
            item["start_exit"] = out.returncode
        ok, seen, took = _wait(lambda: healthy(svc) if svc.has_health else (svc.is_running(runner), "no health check"),
                               svc.health_timeout_s)
        item.update(healthy=ok, health_seen=seen, healthy_after_s=round(took, 3))
        if ok:
            ledger.append("service_restored", name=svc.name, healthy_after_s=round(took, 3))
        else:
            residues.append({"kind": "service", "what": svc.name, "tried": " ".join(svc.argv("start")),
                             "seen": f"not healthy after {svc.health_timeout_s:g} s: {seen}"})
        log.info("restored %s: healthy=%s (%s)", svc.name, ok, seen)
        items.append(item)
    return {"services": items, "residues": residues}
