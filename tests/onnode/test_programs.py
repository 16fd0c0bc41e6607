"""The programs that run on a node (llmtrial.onnode): each imports the standard library only (and the
one package its node must have), and each runs from its source alone, as ``program_argv`` sends it,
under an interpreter that has none of this project's packages (``python -I -S``: no site-packages)."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO, wait_until
from llmtrial import onnode
from llmtrial.host.nodes import last_json_object, program_argv
from llmtrial.onnode import (
    file_hashes,
    gpu_health,
    headless_serve,
    node_facts,
    node_probe,
    plugin_folder,
    process_group,
    service_health,
    telemetry_sampler,
    weights_folder,
)

PROGRAMS = [file_hashes, gpu_health, headless_serve, node_facts, node_probe, plugin_folder, process_group,
            service_health, telemetry_sampler, weights_folder]
#: What a program may import beyond the standard library: what its node has by then (vLLM's serving
#: environment, torch for the GPU check) or what it uses where present (psutil).
BEYOND_STDLIB = {"gpu_health": {"torch"}, "headless_serve": {"vllm"}, "node_facts": {"psutil", "torch", "pynvml"}}
#: A Python with no site-packages, as on a node without this project's venv.
BARE = [sys.executable, "-I", "-S"]
#: What the node facts program reads on stdin, with no stale-process marker.
FACTS_INPUTS = {"interface": None, "master_addr": "127.0.0.1", "master_port": None, "connect_timeout": 3,
                "markers": {}, "cmdline_chars": 240}


def imported(module: ModuleType) -> set[str]:
    tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add((node.module or "").split(".")[0])
    return names


def run_bare(module: ModuleType, *args: str, inputs: object = None) -> dict:
    argv = program_argv(BARE[0], module, *args)
    proc = subprocess.run([*BARE, *argv[1:]], input=None if inputs is None else json.dumps(inputs),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return last_json_object(proc.stdout)


def test_every_module_of_the_package_is_a_program_here():
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in PROGRAMS) == sorted(onnode.__all__)


@pytest.mark.parametrize("module", PROGRAMS, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_a_program_imports_the_standard_library_and_what_its_node_has_only(module):
    allowed = set(sys.stdlib_module_names) | {"__future__"} | BEYOND_STDLIB.get(module.__name__.rsplit(".", 1)[1], set())
    assert imported(module) - allowed == set()


def test_program_argv_sends_the_modules_own_source_named_on_its_first_line_with_its_arguments():
    argv = program_argv("/opt/py/bin/python", node_probe, "a b", "--x")
    assert argv[:2] == ["/opt/py/bin/python", "-c"] and argv[3:] == ["a b", "--x"]
    first, source = argv[2].split("\n", 1)
    assert first == "# llmtrial.onnode.node_probe"
    assert source == Path(str(node_probe.__file__)).read_text(encoding="utf-8")


def test_hashes_and_probe_run_without_site_packages(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"abc")
    hashes = run_bare(file_hashes, inputs=[str(tmp_path / "a.bin"), str(tmp_path / "missing")])
    assert hashes == {str(tmp_path / "a.bin"): "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                      str(tmp_path / "missing"): None}
    probe = run_bare(node_probe)
    assert probe["hostname"] == socket.gethostname() and probe["python"] == sys.executable


def test_a_weights_delete_without_site_packages_removes_inside_the_root_only(tmp_path):
    root, outside = tmp_path / "staging", tmp_path / "elsewhere"
    (root / "m" / "sub").mkdir(parents=True)
    (root / "m" / "sub" / "w.bin").write_bytes(b"x" * 10)
    (root / "m" / "link").symlink_to(outside)
    outside.mkdir()
    (outside / "keep.bin").write_bytes(b"y")
    assert run_bare(weights_folder, inputs={"op": "size", "path": str(root / "m"), "root": None}) == \
        {"exists": True, "bytes": 10}
    refused = run_bare(weights_folder, inputs={"op": "delete", "path": str(outside), "root": str(root)})
    assert refused["action"] == "refused" and (outside / "keep.bin").exists()
    assert run_bare(weights_folder, inputs={"op": "delete", "path": str(root), "root": str(root)})["action"] == \
        "refused"
    done = run_bare(weights_folder, inputs={"op": "delete", "path": str(root / "m"), "root": str(root)})
    assert (done["action"], done["files_removed"], done["freed_bytes"]) == ("deleted", 2, 10)
    assert not (root / "m").exists() and (outside / "keep.bin").exists()  # the link went, not what it names


def test_the_plugin_folder_program_removes_a_marked_folder_only(tmp_path):
    marked, unmarked = tmp_path / "p", tmp_path / "q"
    marked.mkdir()
    (marked / "MARK").write_text("")
    unmarked.mkdir()
    assert run_bare(plugin_folder, inputs={"dir": str(unmarked), "mark": "MARK", "remove": True})["removed"] is False
    assert run_bare(plugin_folder, inputs={"dir": str(marked), "mark": "MARK", "remove": True})["removed"] is True
    assert unmarked.exists() and not marked.exists()


def test_a_tcp_health_check_without_site_packages():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        up = run_bare(service_health, inputs={"health": {"kind": "tcp", "port": port}, "timeout": 5})
    down = run_bare(service_health, inputs={"health": {"kind": "tcp", "port": port}, "timeout": 5})
    assert up == {"ok": True, "seen": f"127.0.0.1:{port} accepts connections"}
    assert down["ok"] is False and down["seen"].startswith("ConnectionRefusedError")


def test_a_process_group_spawned_listed_and_stopped_without_site_packages(tmp_path):
    common = {"env_name": "LLMTRIAL_GROUP", "token": "t-onnode"}
    started = run_bare(process_group, inputs={**common, "op": "spawn", "argv": ["sleep", "60"], "env": {},
                                              "log_path": str(tmp_path / "g.log")})
    group = {**common, "pgid": started["pgid"], "not_before": started["create_time"]}
    assert run_bare(process_group, inputs={**group, "op": "alive"})["pids"] == [started["pid"]]
    stopped = run_bare(process_group, inputs={**group, "op": "stop", "term_grace": 10, "kill_grace": 5})
    assert stopped["signals"] == ["SIGTERM"] and stopped["survivors"] == []


def test_node_facts_read_processes_from_proc_where_psutil_is_missing():
    """Without site-packages there is no psutil: the facts come from /proc, and name a process that
    carries a marker, never the program's own ancestors."""
    marker = "llmtrial-onnode-test-marker"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    # a Python -c program is known by its first line: one that names the marker there is found, one
    # whose text below mentions it (a docstring) is not
    named = subprocess.Popen([sys.executable, "-c", f"# {marker}\nimport time; time.sleep(60)"])
    mentions = subprocess.Popen([sys.executable, "-c", f"# other\n'Mentions {marker}.'\nimport time; time.sleep(60)"])
    try:
        facts = run_bare(node_facts, inputs={**FACTS_INPUTS, "markers": {marker: "a test marker"}})
    finally:
        for proc in (holder, named, mentions):
            proc.kill()
            proc.wait()
    assert facts["stale"]["source"] == "/proc"
    assert sorted(p["pid"] for p in facts["stale"]["processes"]) == sorted([holder.pid, named.pid])
    assert facts["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["vllm"] is None and facts["torch"] is None  # -S: the packages are not there to find


def test_node_facts_list_the_gpus_nvml_lists_on_the_node(tmp_path, monkeypatch):
    """The node's NVML played by the test double (tests/gpu_double.py): seed 000's node B with its one card."""
    card = {"uuid": "GPU-5eed0000-b", "name": "NVIDIA RTX PRO 6000 Blackwell Max-Q", "memory_gib": 96}
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"gpus": [card]}))
    double = str(REPO / "tests" / "gpu_double.py")
    monkeypatch.setenv("LLMTRIAL_GPU_DOUBLE", double)
    monkeypatch.setenv("GPU_DOUBLE_SCENARIO", str(scenario))
    assert run_bare(node_facts, inputs=FACTS_INPUTS)["gpus"] == {
        "present": True, "count": 1, "source": f"nvml double ({double})", "reason": None,
        "devices": [{"index": 0, "name": card["name"], "uuid": card["uuid"], "memory_total_bytes": 96 * 2**30}]}


def test_node_facts_without_nvml_list_no_gpu_and_say_why(monkeypatch):
    monkeypatch.delenv("LLMTRIAL_GPU_DOUBLE", raising=False)
    gpus = run_bare(node_facts, inputs=FACTS_INPUTS)["gpus"]  # -S: no pynvml to import
    assert (gpus["present"], gpus["count"], gpus["devices"]) == (False, 0, [])
    assert gpus["reason"].startswith("nvidia-ml-py (pynvml) is not installed: ")


def test_the_sampler_writes_rows_until_told_to_stop(tmp_path):
    out = tmp_path / "t" / "node.csv"
    argv = program_argv(sys.executable, telemetry_sampler, str(out), "n1", "0.05", "", "60")
    proc = subprocess.Popen([*BARE, *argv[1:]])
    try:
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 3, "two sampled rows")
    finally:
        proc.terminate()
    assert proc.wait(timeout=30) == 0
    header, *rows = out.read_text().splitlines()
    assert header == telemetry_sampler.HEADER.strip()
    assert {row.split(",")[1] for row in rows} == {"n1"} and all(len(row.split(",")) == 7 for row in rows)


def test_the_gpu_check_answers_skipped_or_failed_without_torch():
    env = {k: v for k, v in os.environ.items() if k != "LLMTRIAL_GPU_DOUBLE"}
    argv = program_argv(sys.executable, gpu_health, "1024")
    proc = subprocess.run([*BARE, *argv[1:]], capture_output=True, text=True, env=env, timeout=60, check=False)
    answer = last_json_object(proc.stdout)
    assert answer["status"] == "failed" and answer["evidence"].startswith("ModuleNotFoundError")
