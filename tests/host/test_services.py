"""Quieting and restoring the host's services, against a real supervisord on loopback.

systemctl and docker are absent here (no systemd, no Docker engine): their kinds are tested
for the exact argv they run and for how their documented exit codes read, through a runner
double that records calls and answers as each tool does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_ports
from hosts import WORKFLOW
from llmtrial.core.ledger import RUN_ENV, Action, Ledger
from llmtrial.core.paths import TrialPaths
from llmtrial.core.trial_config import ServiceBlock, TrialConfig
from llmtrial.host.services import (
    RUNNING,
    STOPPED,
    UNKNOWN,
    Service,
    ServiceStateUnknown,
    healthy,
    quiet,
    restore,
    services_on_nodes,
)

SUPERVISORD = str(Path(sys.executable).parent / "supervisord")
SUPERVISORCTL = str(Path(sys.executable).parent / "supervisorctl")

#: A loopback HTTP service that refuses to start while a "broken" marker file exists.
DEMO = r"""
import http.server, os, sys
port, marker = int(sys.argv[1]), sys.argv[2]
if os.path.exists(marker):
    sys.exit("broken on purpose")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


#: Longest waits for a real supervisord and its programs: bounds, not expectations (each wait ends
#: as soon as the state is reached), wide enough for a machine busy with other work.
WAIT_S = 60


@pytest.fixture
def supervisor(tmp_path):
    """A real supervisord with two demo programs: ``web`` (running) and ``idle`` (stopped)."""
    script = tmp_path / "demo.py"
    script.write_text(DEMO)
    ports = dict(zip(("web", "idle"), free_ports(2), strict=True))
    conf = tmp_path / "supervisord.conf"
    sock = tmp_path / "supervisor.sock"
    programs = "".join(
        f"""
[program:{name}]
command={sys.executable} {script} {port} {tmp_path / (name + '.broken')}
autostart={'true' if name == 'web' else 'false'}
autorestart=false
startsecs=1
startretries=0
stopwaitsecs=5
stdout_logfile={tmp_path / (name + '.log')}
redirect_stderr=true
""" for name, port in ports.items())
    conf.write_text(f"""
[unix_http_server]
file={sock}
[supervisord]
pidfile={tmp_path / 'supervisord.pid'}
logfile={tmp_path / 'supervisord.log'}
nodaemon=false
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://{sock}
{programs}""")
    subprocess.run([SUPERVISORD, "-c", str(conf)], check=True, timeout=30)
    deadline = time.monotonic() + WAIT_S
    seen = ""
    while "RUNNING" not in seen and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = subprocess.run([SUPERVISORCTL, "-c", str(conf), "status", "web"], capture_output=True, text=True).stdout
    assert "RUNNING" in seen, f"supervisord's web program not running after {WAIT_S} s: {seen}"
    yield {"conf": str(conf), "ports": ports, "dir": tmp_path, "sock": sock}
    subprocess.run([SUPERVISORCTL, "-c", str(conf), "shutdown"], capture_output=True, timeout=30)


def supervised(sup, name: str, **timeouts) -> Service:
    return Service.from_config(name, {
        "kind": "supervisor", "target": name, "supervisor_config": sup["conf"],
        "health": {"kind": "http", "url": f"http://127.0.0.1:{sup['ports'][name]}/health", "expect_status": 200},
        "timeouts": {"stop_s": WAIT_S, "start_s": WAIT_S, "health_s": WAIT_S, **timeouts},
    })


def status(sup, name: str) -> str:
    out = subprocess.run([SUPERVISORCTL, "-c", sup["conf"], "status", name], capture_output=True, text=True)
    return out.stdout.split()[1]


@pytest.fixture(autouse=True)
def venv_supervisorctl_first(monkeypatch):
    """The supervisor kind runs `supervisorctl`; here that is the venv's."""
    import os

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


class TestSupervisor:
    def test_quiet_then_restore_with_health_checks(self, supervisor, tmp_path):
        ledger = Ledger(tmp_path / "ledger.jsonl")
        web = supervised(supervisor, "web")
        assert healthy(web)[0]
        state = quiet([web], ledger)
        [item] = state.services
        assert item.was_running and item.action == "stopped" and state.residues == []
        assert status(supervisor, "web") == "STOPPED" and not healthy(web)[0]
        actions = [e.action for e in ledger.entries()]
        assert actions == ["service_quiet", "service_stopped"]  # the state was written before the stop

        back = restore(ledger.entries(), ledger)
        assert back.residues == [] and back.services[0].healthy
        assert status(supervisor, "web") == "RUNNING" and healthy(web)[0]

        again = restore(ledger.entries(), ledger)  # idempotent
        assert again.services == [] and again.residues == []

    def test_a_service_that_was_stopped_stays_stopped(self, supervisor, tmp_path):
        ledger = Ledger(tmp_path / "ledger.jsonl")
        idle = supervised(supervisor, "idle")
        state = quiet([idle], ledger)
        [item] = state.services
        assert item.model_dump(exclude_unset=True) == {
            "name": "idle", "kind": "supervisor", "was_running": False, "state_seen": item.state_seen,
            "action": "left stopped (was not running)"}
        assert item.state_seen.endswith("exited 3: idle STOPPED Not started")
        assert restore(ledger.entries(), ledger).services == []
        assert status(supervisor, "idle") == "STOPPED"

    @pytest.mark.slow  # waits out the health check's timeout of a service that stays down
    def test_a_service_that_will_not_come_back_is_a_residue(self, supervisor, tmp_path):
        ledger = Ledger(tmp_path / "ledger.jsonl")
        web = supervised(supervisor, "web", health_s=3)
        quiet([web], ledger)
        (supervisor["dir"] / "web.broken").write_text("")  # it now exits at start
        back = restore(ledger.entries(), ledger)
        [residue] = back.residues
        assert residue.what == "web" and "not running and healthy" in residue.seen and "supervisorctl" in residue.tried
        assert not back.services[0].healthy
        # not marked restored: a later cleanup tries again, and succeeds once the cause is gone
        (supervisor["dir"] / "web.broken").unlink()
        assert restore(ledger.entries(), ledger).residues == []
        assert healthy(web)[0]


class TestUnknownState:
    """A state that cannot be read is unknown: the quiet stage stops nothing, names the service
    and quotes what was seen; after a restore it is a residue."""

    def test_supervisord_without_its_socket(self, supervisor, tmp_path):
        web = supervised(supervisor, "web")
        away = supervisor["sock"].with_suffix(".away")
        supervisor["sock"].rename(away)  # supervisord runs on; supervisorctl cannot reach it
        try:
            state, seen = web.state()
            assert state == UNKNOWN and "exited 4" in seen and "no such file" in seen
            ledger = Ledger(tmp_path / "ledger.jsonl")
            with pytest.raises(ServiceStateUnknown, match=r"service web \(supervisor\): state unknown: .*no such file"):
                quiet([web], ledger)
            assert ledger.entries() == [] and healthy(web)[0]  # nothing stopped, nothing written
        finally:
            away.rename(supervisor["sock"])
        assert status(supervisor, "web") == "RUNNING"

    def test_supervisor_no_such_program(self, supervisor):
        ghost = Service.from_config("ghost", {"kind": "supervisor", "supervisor_config": supervisor["conf"]})
        state, seen = ghost.state()
        assert state == UNKNOWN and "exited 4" in seen and "no such process" in seen

    def test_command_whose_status_executable_is_missing(self, tmp_path):
        svc = Service.from_config("tts", {"kind": "command", "status": [str(tmp_path / "no-such-status")],
                                          "stop": ["true"], "start": ["true"]})
        ledger = Ledger(tmp_path / "ledger.jsonl")
        with pytest.raises(ServiceStateUnknown, match="service tts \\(command\\): state unknown: .*FileNotFoundError"):
            quiet([svc], ledger)
        assert ledger.entries() == []

    @pytest.mark.parametrize("argv,expected", [
        (["true"], RUNNING),
        ([sys.executable, "-c", "raise SystemExit(3)"], STOPPED),  # the LSB "not running" default
        ([sys.executable, "-c", "raise SystemExit(1)"], UNKNOWN),  # e.g. "No module named ..."
    ])
    def test_command_exit_codes(self, argv, expected):
        svc = Service.from_config("x", {"kind": "command", "status": argv, "stop": ["true"], "start": ["true"]})
        assert svc.state()[0] == expected

    def test_a_status_command_that_times_out_is_unknown(self, monkeypatch):
        import llmtrial.host.services as services

        real = services.run_argv  # a status that never answers, cut off after 1 s instead of the 30 s it is given
        monkeypatch.setattr(services, "run_argv", lambda a, timeout: real(a, timeout=1))
        svc = Service.from_config("x", {"kind": "command", "status": ["sleep", "600"], "stop": ["true"], "start": ["true"]})
        assert svc.state(services.run_argv) == (UNKNOWN, "`sleep 600` timed out after 30 s")

    def test_a_status_of_stopped_while_the_health_check_answers_is_unknown(self, tmp_path):
        svc = Service.from_config("x", {"kind": "command", "status": [sys.executable, "-c", "raise SystemExit(3)"],
                                        "stop": ["true"], "start": ["true"], "health": {"kind": "command", "argv": ["true"]}})
        with pytest.raises(ServiceStateUnknown, match="stopped.*yet the health check answers"):
            quiet([svc], Ledger(tmp_path / "ledger.jsonl"))

    def test_the_python_placeholder_is_this_interpreter(self):
        from workflow_helpers import default_config

        svc = Service.from_config("demo-web", default_config()["services"]["demo-web"])
        assert svc.status_argv[:3] == [sys.executable, "-m", "llmtrial.host.demo_service"]
        assert svc.state()[0] in (RUNNING, STOPPED)  # never "No module named llmtrial"


#: What systemctl and docker print and exit with, from their documentation and sources.
SYSTEMD_ANSWERS = [
    ((0, "active\n", ""), RUNNING),
    ((3, "inactive\n", ""), STOPPED),
    ((3, "failed\n", ""), STOPPED),
    ((3, "activating\n", ""), UNKNOWN),  # on its way up: not "stopped"
    ((4, "", "Unit tts@1.service could not be found.\n"), UNKNOWN),
    ((1, "", "System has not been booted with systemd as init system (PID 1). Can't operate.\n"), UNKNOWN),
]
DOCKER_ANSWERS = [
    ((0, "true\n", ""), RUNNING),
    ((0, "false\n", ""), STOPPED),
    ((1, "\n", "Error: No such object: comfyui\n"), UNKNOWN),
    ((1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n"), UNKNOWN),
]


class TestSystemdAndDockerStates:
    """Through the runner double (no systemd, no Docker engine here)."""

    @pytest.mark.parametrize("answer,expected", SYSTEMD_ANSWERS)
    def test_systemctl_is_active(self, answer, expected):
        svc = Service.from_config("tts", {"kind": "systemd", "target": "tts@1.service"})
        assert svc.state(RunnerDouble(running=True, status=answer))[0] == expected

    @pytest.mark.parametrize("answer,expected", DOCKER_ANSWERS)
    def test_docker_inspect(self, answer, expected):
        svc = Service.from_config("img", {"kind": "docker", "target": "comfyui"})
        assert svc.state(RunnerDouble(running=True, status=answer))[0] == expected

    @pytest.mark.parametrize("error", [FileNotFoundError(2, "No such file or directory", "systemctl"),
                                       PermissionError(13, "Permission denied", "systemctl"),
                                       subprocess.TimeoutExpired(["systemctl"], 30)])
    def test_a_status_command_that_cannot_run(self, error):
        def raising(argv, timeout):
            raise error

        state, seen = Service.from_config("tts", {"kind": "systemd"}).state(raising)
        assert state == UNKNOWN and type(error).__name__.replace("Expired", "") in seen.replace("timed out", "Timeout")

    @pytest.mark.parametrize("kind,answer,quoted", [
        ("systemd", SYSTEMD_ANSWERS[-1][0], "System has not been booted with systemd"),
        ("docker", DOCKER_ANSWERS[-1][0], "Cannot connect to the Docker daemon"),
        ("docker", DOCKER_ANSWERS[-2][0], "No such object: comfyui"),
    ])
    def test_quiet_stops_nothing_when_one_state_is_unknown(self, tmp_path, kind, answer, quoted):
        from llmtrial.host.services import quiet_host

        class OneToolBroken(RunnerDouble):
            def __call__(self, argv, timeout):
                if argv[0] == {"systemd": "systemctl", "docker": "docker"}[kind] and argv[1] in ("is-active", "inspect"):
                    self.calls.append(list(argv))
                    return subprocess.CompletedProcess(argv, *answer)
                return super().__call__(argv, timeout)

        runner = OneToolBroken(running=True)
        other = "docker" if kind == "systemd" else "systemd"  # a healthy service of the other kind, listed first
        services = {"fine": {"kind": other, "target": "fine"}, "gpu-tts": {"kind": kind, "target": "comfyui"}}
        with pytest.raises(ServiceStateUnknown, match=f"service gpu-tts \\({kind}\\): state unknown: .*{quoted}"):
            quiet_host(tmp_path, services, runner=runner)
        assert not any(c[1] in ("stop", "start") for c in runner.calls) and runner.running  # the host unchanged
        assert Ledger(tmp_path / "ledger.jsonl").entries() == []

    def test_an_unknown_state_after_restore_is_a_residue(self, tmp_path):
        runner = RunnerDouble(running=True)
        svc = Service.from_config("tts", {"kind": "systemd", "target": "tts@1.service", "timeouts": {"health_s": 1}})
        ledger = Ledger(tmp_path / "ledger.jsonl")
        quiet([svc], ledger, runner=runner)
        runner.status = SYSTEMD_ANSWERS[-1][0]  # systemd stops answering
        back = restore(ledger.entries(), ledger, runner=runner)
        [residue] = back.residues
        assert residue.what == "tts" and "state unknown" in residue.seen and "booted with systemd" in residue.seen
        assert [e.action for e in ledger.entries()] == ["service_quiet", "service_stopped"]  # still outstanding


class RunnerDouble:
    """A double of systemctl and docker (absent here): records each argv and answers as told,
    by default like a service that starts and stops on request."""

    def __init__(self, running: bool, status: tuple[int, str, str] | None = None):
        self.calls: list[list[str]] = []
        self.running = running
        self.status = status  # a fixed (exit code, stdout, stderr) for every status call

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        if argv[:2] in (["systemctl", "is-active"], ["docker", "inspect"]):
            if self.status is not None:
                return subprocess.CompletedProcess(argv, *self.status)
            if argv[0] == "systemctl":
                return subprocess.CompletedProcess(argv, 0 if self.running else 3,
                                                   "active\n" if self.running else "inactive\n", "")
            return subprocess.CompletedProcess(argv, 0, "true\n" if self.running else "false\n", "")
        if argv[1] in ("stop", "start"):
            self.running = argv[1] == "start"
        return subprocess.CompletedProcess(argv, 0, "", "")


class TestArgv:
    def test_systemd(self, tmp_path):
        runner = RunnerDouble(running=True)
        svc = Service.from_config("tts", {"kind": "systemd", "target": "tts@1.service", "timeouts": {"stop_s": 1}})
        ledger = Ledger(tmp_path / "l.jsonl")
        quiet([svc], ledger, runner=runner)
        restore(ledger.entries(), ledger, runner=runner)
        assert runner.calls == [
            ["systemctl", "is-active", "tts@1.service"],
            ["systemctl", "stop", "tts@1.service"],
            ["systemctl", "is-active", "tts@1.service"],
            ["systemctl", "is-active", "tts@1.service"],
            ["systemctl", "start", "tts@1.service"],
            ["systemctl", "is-active", "tts@1.service"],
        ]

    def test_docker(self, tmp_path):
        runner = RunnerDouble(running=True)
        svc = Service.from_config("img", {"kind": "docker", "target": "comfyui", "timeouts": {"stop_s": 20}})
        ledger = Ledger(tmp_path / "l.jsonl")
        quiet([svc], ledger, runner=runner)
        assert runner.calls[:2] == [["docker", "inspect", "--format", "{{.State.Running}}", "comfyui"],
                                    ["docker", "stop", "--time", "20", "comfyui"]]
        restore(ledger.entries(), ledger, runner=runner)
        assert ["docker", "start", "comfyui"] in runner.calls

    def test_command_kind_runs_the_given_argv(self, tmp_path):
        flag = tmp_path / "up"
        flag.write_text("")
        svc = Service.from_config("x", {"kind": "command", "status": ["test", "-f", str(flag)], "stopped_exit_codes": [1],
                                        "stop": ["rm", str(flag)], "start": ["touch", str(flag)],
                                        "health": {"kind": "command", "argv": ["test", "-f", str(flag)]},
                                        "timeouts": {"stop_s": 5, "health_s": 5}})
        ledger = Ledger(tmp_path / "l.jsonl")
        quiet([svc], ledger)
        assert not flag.exists()
        assert restore(ledger.entries(), ledger).services[0].healthy and flag.exists()

    def test_command_kind_without_an_argv_is_refused_by_name(self):
        svc = Service.from_config("x", {"kind": "command", "status": ["true"]})
        with pytest.raises(ValueError, match="service x: kind command needs a 'stop' argv list"):
            svc.argv("stop")


# --- a service on another node: host B of tests/hosts.py, reached over ssh from host A ----------

#: The quiet stage and `snakemake cleanup` as they run on host A (one run: LLMTRIAL_RUN).
QUIET_ON_A = ("import json, sys; from llmtrial.host.services import quiet_host; "
              "print(quiet_host(sys.argv[1], json.loads(sys.argv[2])).model_dump_json(exclude_unset=True))")
CLEANUP_ON_A = ("import json, sys; from llmtrial.lifecycle.cleanup import run_cleanup; "
                "print(run_cleanup(sys.argv[1], stop_timeout=5).model_dump_json(exclude_unset=True))")


def trial(parts: dict) -> TrialConfig:
    """A trial file of one configuration and one scenario, with ``parts``."""
    return TrialConfig.model_validate({"trial": "t", "model": {"name": "m", "source": {"kind": "tiny"}},
                                       "scenarios": {"s": {}}, "configurations": {"a": {}}, **parts})


def demo_on_b(action: str, port: int, state: Path) -> list[str]:
    """The demo service's argv on host B, with its own Python ({python}: node b's)."""
    return ["env", f"PYTHONPATH={WORKFLOW}", "{python}", "-m", "llmtrial.host.demo_service", action, "--port", str(port),
            "--state", str(state)]


@pytest.mark.slow
def test_a_service_on_node_b_is_quieted_and_restored_there_from_the_ledger(hosts, tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_ENV, "test-services-on-b")
    port, state = free_ports(1)[0], tmp_path / "state"
    config = {"nodes": hosts.node_blocks(sys.executable), "staging_dir": "staging", "services": {"web-b": {
        "kind": "command", "node": "b", "status": demo_on_b("status", port, state), "stop": demo_on_b("stop", port, state),
        "start": demo_on_b("start", port, state), "health": {"kind": "http", "url": f"http://127.0.0.1:{port}/health"},
        "timeouts": {"stop_s": WAIT_S, "start_s": WAIT_S, "health_s": WAIT_S}}}}
    services = services_on_nodes(trial(config))
    web = Service.from_config("web-b", services["web-b"])
    assert web.node.name == "b" and web.start_argv[2] == sys.executable
    node_b = hosts.node_b()
    run_b = [sys.executable if a == "{python}" else a for a in demo_on_b("start", port, state)]
    assert node_b.run(run_b, timeout=30).returncode == 0
    try:
        quieted = hosts.python_on_a(QUIET_ON_A, str(tmp_path), json.dumps(services))
        [item] = quieted["services"]
        assert item["was_running"] and item["action"] == "stopped" and quieted["residues"] == []
        status = [sys.executable if a == "{python}" else a for a in demo_on_b("status", port, state)]
        assert node_b.run(status, timeout=30).returncode == 3  # stopped, on host B
        [entry] = [e for e in Ledger(TrialPaths(tmp_path).ledger).entries() if e.action == Action.SERVICE_QUIET]
        assert entry.node == "b" and entry.reach["ssh"]["address"] == hosts.addr_b
        record = hosts.python_on_a(CLEANUP_ON_A, str(tmp_path))
        [back] = record["services_restored"]
        assert back["healthy"] and record["restored"] and record["host"]["services"][0]["running_and_healthy"]
        assert "HTTP 200 from" in back["health_seen"]  # asked on host B: nothing listens on A's loopback
        assert node_b.run(status, timeout=30).returncode == 0
    finally:
        node_b.run([sys.executable if a == "{python}" else a for a in demo_on_b("stop", port, state)], timeout=30)


def test_services_of_a_trial_without_nodes_stay_on_this_host():
    services = {"web": {"kind": "command", "status": ["true"]}}
    assert services_on_nodes(trial({"services": services})) == {"web": ServiceBlock.model_validate(services["web"]).model_dump()}
    assert Service.from_config("web", services["web"]).to_json().get("node") is None
