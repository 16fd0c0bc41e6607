"""The server process: argv building, readiness, and teardown by process group.

A small real HTTP server (Python's http.server, with a child process of its own) stands
in for vLLM here, so the lifecycle is tested in seconds; the end-to-end test runs vLLM.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import child_pid, fake_server, reported
from llmtrial.core.ledger import Ledger
from llmtrial.host.process_groups import group_members, port_open
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.serve.server import (
    ServerProcess,
    ServerStartError,
    args_to_flags,
    build_server_argv,
)


class TestArgs:
    def test_flags_from_a_mapping(self):
        assert args_to_flags({
            "tensor_parallel_size": 2, "enforce_eager": True, "enable_prefix_caching": False,
            "served_model_name": ["a", "b"], "compilation_config": {"level": 0}, "skipped": None,
        }) == [
            "--tensor-parallel-size", "2", "--enforce-eager", "--no-enable-prefix-caching",
            "--served-model-name", "a", "b", "--compilation-config", '{"level":0}',
        ]

    def test_server_argv_turns_prefix_caching_off_unless_overridden(self):
        argv = build_server_argv(model_dir="/m", served_model_name="x", host="127.0.0.1", port=9000,
                                 args=ServingArgs.from_config({"max_model_len": 512}), python="py")
        assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
        assert argv[argv.index("--model") + 1] == "/m"
        assert argv[argv.index("--port") + 1] == "9000"
        assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
        on = build_server_argv(model_dir="/m", served_model_name="x", host="h", port=1,
                               args=ServingArgs.from_config({"enable_prefix_caching": True}), python="py")
        assert "--enable-prefix-caching" in on and "--no-enable-prefix-caching" not in on

    def test_config_values_stay_single_arguments(self):
        argv = build_server_argv(model_dir="/m", served_model_name="x", host="h", port=1,
                                 args=ServingArgs.from_config({"chat_template": "a b; rm -rf /"}), python="py")
        assert "a b; rm -rf /" in argv


@pytest.fixture
def own() -> Iterator[Path]:
    """An operator's folder for a server's sockets, of a short path as such a folder must be (a socket's path holds
    at most 107 bytes, and a test's own folder under pytest's is longer than that with a socket's name)."""
    folder = Path(tempfile.mkdtemp(prefix="llmt-own-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


class TestLifecycle:
    def test_ready_then_stop_kills_the_whole_group_and_closes_the_port(self, tmp_path, free_port):
        ledger = Ledger(tmp_path / "ledger.jsonl")
        server = fake_server(tmp_path, free_port, ledger=ledger)
        with server:
            ready = server.wait_ready(timeout=60, poll=0.1)
            assert ready == server.ready_at - server.launched_at  # launch to the first /health 200
            assert ready > 0.4  # the double opens its port 0.5 s after it starts
            child = child_pid(server.log_path)
            assert os.getpgid(child) == server.pgid
        stop = server.stop_result
        assert stop.port_closed and stop.survivors == [] and stop.signals == ["SIGTERM"]
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        actions = [e.action for e in ledger.entries()]
        assert actions == ["server_launch", "server_started", "server_stopped"]
        assert ledger.entries()[1].pgid == server.pgid

    def test_its_sockets_and_temporary_files_go_to_a_folder_of_its_own_named_in_the_ledger_and_removed_with_it(
            self, tmp_path, free_port):
        ledger = Ledger(tmp_path / "ledger.jsonl")
        with fake_server(tmp_path, free_port, ledger=ledger) as server:
            server.wait_ready(timeout=60, poll=0.1)
            rpc, store = Path(reported(server.log_path, "rpc")), Path(reported(server.log_path, "store"))
            launch, started = ledger.entries()
            assert launch.scratch == started.scratch == str(server.scratch) == str(rpc.parent) == str(store.parent)
            assert rpc.parent.name.startswith("llmtrial-vllm-") and rpc.is_socket() and store.is_file()
            assert len(str(rpc)) < 108  # what a unix socket's path may hold
        assert not rpc.parent.exists()

    def test_an_operators_own_ipc_folder_is_left_as_it_is(self, tmp_path, free_port, own):
        ledger = Ledger(tmp_path / "ledger.jsonl")
        with fake_server(tmp_path, free_port, ledger=ledger, env={"VLLM_RPC_BASE_PATH": str(own)}) as server:
            server.wait_ready(timeout=60, poll=0.1)
            rpc, store = Path(reported(server.log_path, "rpc")), Path(reported(server.log_path, "store"))
            assert rpc.parent == own and store.parent == server.scratch  # its temporary files still in its own
        assert rpc.is_socket() and not store.exists()

    def test_an_operators_own_temporary_and_ipc_folders_are_left_as_they_are(self, tmp_path, free_port, own):
        ledger = Ledger(tmp_path / "ledger.jsonl")
        env = {"VLLM_RPC_BASE_PATH": str(own), "TMPDIR": str(own)}
        with fake_server(tmp_path, free_port, ledger=ledger, env=env) as server:
            server.wait_ready(timeout=60, poll=0.1)
            rpc, store = Path(reported(server.log_path, "rpc")), Path(reported(server.log_path, "store"))
        assert rpc.parent == store.parent == own and rpc.is_socket() and store.is_file()
        assert server.scratch is None and all(e.scratch is None for e in ledger.entries())

    def test_a_server_ignoring_sigterm_gets_sigkill(self, tmp_path, free_port):
        server = fake_server(tmp_path, free_port, stubborn=True, stop_timeout=1.0)
        with server:
            server.wait_ready(timeout=60, poll=0.1)
        assert server.stop_result.signals == ["SIGTERM", "SIGKILL"]
        assert server.stop_result.survivors == [] and not port_open("127.0.0.1", free_port)

    def test_orphaned_children_are_stopped_after_the_leader_died(self, tmp_path, free_port):
        server = fake_server(tmp_path, free_port)
        server.start()
        server.wait_ready(timeout=60, poll=0.1)
        child = child_pid(server.log_path)
        server.proc.kill()  # the leader dies; its child lives on in the group
        server.proc.wait()
        assert [p.pid for p in group_members(server.pgid)] == [child]
        result = server.stop()
        assert result.survivors == [] and group_members(server.pgid) == []

    def test_exit_before_ready_is_a_start_error_with_the_code(self, tmp_path, free_port):
        server = ServerProcess([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                               host="127.0.0.1", port=free_port, log_path=tmp_path / "s.log")
        with server, pytest.raises(ServerStartError) as err:
            server.wait_ready(timeout=60, poll=0.1)
        assert err.value.reason == "exited" and err.value.returncode == 3
        assert "boom" in (tmp_path / "s.log").read_text()

    def test_no_health_within_the_timeout_is_a_start_error(self, tmp_path, free_port):
        server = fake_server(tmp_path, free_port, delay=30)
        with server, pytest.raises(ServerStartError) as err:
            server.wait_ready(timeout=1.0, poll=0.1)
        assert err.value.reason == "timeout"
        assert server.stop_result.survivors == []

    def test_a_port_already_in_use_is_refused_before_launch(self, tmp_path, free_port):
        first = fake_server(tmp_path, free_port)
        with first:
            first.wait_ready(timeout=60, poll=0.1)
            second = ServerProcess([sys.executable, "-c", "pass"], host="127.0.0.1", port=free_port,
                                   log_path=tmp_path / "second.log")
            with pytest.raises(ServerStartError) as err:
                second.start()
            assert err.value.reason == "port_in_use" and second.proc is None
