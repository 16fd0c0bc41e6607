"""Cross-node preflight: the checks over per-node facts, and the facts of two real hosts made on
this machine (tests/hosts.py: host B reached over ssh from host A).

The two hosts are network namespaces: they share this machine's processes, so a process of
either (or of anything else running here) is seen from both, and the tests look only for the
processes they plant.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmtrial.core.preflight_model import NodeReport
from llmtrial.core.trial_config import ProbesBlock
from llmtrial.core.units import GiB
from llmtrial.host import collective
from llmtrial.host.collective import rank_argv
from llmtrial.host.crossnode import (
    STALE_MARKERS,
    cross_checks,
    node_facts,
    preflight_nodes,
    same_files,
    select_node_gpus,
)
from llmtrial.host.nodes import local_node, program_argv
from llmtrial.host.probes import probe_argv
from llmtrial.onnode import headless_serve
from llmtrial.onnode import node_facts as node_facts_program
from llmtrial.onnode.node_facts import command_line

# --- the checks over facts --------------------------------------------------------------------

#: Seed 000's two nodes as the cross-node facts would show them. From the seed: Node A ran
#: the Ray head on Python 3.12.3, Node B's worker was on 3.12.13 and could not join until its
#: environment was rebuilt; Ray 2.52.1 spanned the nodes; NCCL was pinned to the 200G path on
#: both; /dev/shm had to be remounted larger. The seed names no vLLM, torch or NCCL version,
#: no interface and no /dev/shm size: those values below are placeholders.
SEED_FACTS = {
    "node-a": {
        "hostname": "node-a", "python": "/opt/serve/.venv/bin/python", "python_version": "3.12.3",
        "vllm": "0.0.0-placeholder", "vllm_distribution": "vllm", "torch": "0.0.0-placeholder+cu128",
        "torch_cuda": "12.8", "nccl": "0.0.0-placeholder", "ray": "2.52.1",
        "interface": {"name": "fabric200g", "exists": True, "addresses": ["10.200.0.1/24"]},
        "master": {"address": "10.200.0.1", "port": None, "ip": "10.200.0.1", "method": "subnet", "route_dev": "lo",
                   "ok": True, "error": None},
        "dev_shm": {"size_bytes": 256 * GiB, "free_bytes": 256 * GiB, "min_bytes": GiB},
        "stale": {"source": "psutil", "processes": []},
        "vllm_files": {"distribution": "vllm", "checked": 2642, "changed_count": 0, "changed": []},
    },
}
SEED_FACTS["node-b"] = {
    **copy.deepcopy(SEED_FACTS["node-a"]), "hostname": "node-b", "python_version": "3.12.13",
    "interface": {"name": "fabric200g", "exists": True, "addresses": ["10.200.0.2/24"]},
    "master": {"address": "10.200.0.1", "port": None, "ip": "10.200.0.1", "method": "subnet",
               "route_dev": "fabric200g", "ok": True, "error": None},
}


def seed(**changes_b) -> dict:
    """Seed 000's facts, node B's changed; node B on node A's Python unless changed."""
    facts = copy.deepcopy(SEED_FACTS)
    facts["node-b"]["python_version"] = "3.12.3"
    facts["node-b"].update(copy.deepcopy(changes_b))
    return facts


def checks_of(facts: dict, **kwargs) -> list[dict]:
    """:func:`cross_checks` of facts given as the record has them, each check as the record has it."""
    reports = {name: NodeReport.model_validate({"node": {"name": name}, **f}) for name, f in facts.items()}
    return [c.model_dump(exclude_unset=True) for c in cross_checks(reports, **kwargs)]


def facts_of(node, **kwargs) -> dict:
    """:func:`node_facts` as the record has them."""
    return node_facts(node, **kwargs).model_dump(exclude_unset=True)


def by_name(checks: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in checks}


def test_seed_000s_python_patch_mismatch_fails_naming_both_versions():
    checks = by_name(checks_of(SEED_FACTS, uses_ray=True))
    python = checks["python_patch_level"]
    assert python["status"] == "fail"
    assert python["detail"].startswith("Python differs across nodes: node-a 3.12.3, node-b 3.12.13; Ray refuses")
    assert python["versions"] == {"node-a": "3.12.3", "node-b": "3.12.13"}
    assert [c["status"] for n, c in checks.items() if n != "python_patch_level"] == ["ok"] * 8


def test_equal_versions_are_ok_on_every_check():
    checks = checks_of(seed(), uses_ray=True)
    assert [(c["name"], c["status"]) for c in checks] == [
        ("python_patch_level", "ok"), ("vllm_version", "ok"), ("vllm_files", "ok"), ("torch_version", "ok"),
        ("nccl_version", "ok"), ("ray_version", "ok"), ("node_interface", "ok"), ("node_dev_shm", "ok"),
        ("stale_processes", "ok")]
    assert by_name(checks)["python_patch_level"]["detail"] == "Python 3.12.3 on every node (node-a, node-b)"
    assert "node-b: fabric200g (10.200.0.2/24) reaches the master 10.200.0.1 (on its subnet)" in checks[6]["detail"]


@pytest.mark.parametrize(("key", "value", "name", "text"), [
    ("vllm", None, "vllm_version", "vLLM differs across nodes: node-a 0.0.0-placeholder (vllm), node-b not installed"),
    ("torch", "0.0.1-placeholder+cu128", "torch_version", "node-b 0.0.1-placeholder+cu128"),
    ("nccl", None, "nccl_version", "NCCL differs across nodes: node-a 0.0.0-placeholder, node-b not installed"),
    ("ray", "2.60.0", "ray_version", "Ray differs across nodes: node-a 2.52.1, node-b 2.60.0; the configuration uses Ray"),
])
def test_a_version_differing_on_one_node_fails_naming_it(key, value, name, text):
    check = by_name(checks_of(seed(**{key: value}), uses_ray=True))[name]
    assert check["status"] == "fail" and text in check["detail"]


#: Seed 000's local patch, in the file it changed (GPUModelRunner.may_reinitialize_input_batch), on node A only.
RUNNER = "vllm/v1/worker/gpu_model_runner.py"


def test_a_vllm_file_patched_on_one_node_only_fails_naming_the_node_and_the_file():
    facts = seed()
    facts["node-a"]["vllm_files"] = {"distribution": "vllm", "checked": 2642, "changed_count": 1, "changed": [RUNNER]}
    check = by_name(checks_of(facts))["vllm_files"]
    assert check["status"] == "fail"
    assert check["detail"].startswith(f"vLLM's files differ across nodes: node-a 1 changed from RECORD ({RUNNER}); "
                                      "node-b none; every rank must run the same engine code")
    assert check["changed"] == {"node-a": [RUNNER], "node-b": []}
    facts["node-b"]["vllm_files"] = facts["node-a"]["vllm_files"]  # the same change on both: the same code
    same = by_name(checks_of(facts))["vllm_files"]
    assert same["status"] == "ok" and f"the same files changed: node-a 1 changed from RECORD ({RUNNER})" in same["detail"]


def test_the_node_program_names_the_vllm_files_that_differ_from_record(tmp_path: Path):
    """The fact program on a distribution of its own (site-packages of a dist-info and its RECORD, first on the
    path), one file edited after install, one removed."""
    site = tmp_path / "site"
    files = {"vllm/__init__.py": b"", "vllm/engine.py": b"x = 1\n", "vllm/gone.py": b"y = 2\n"}
    lines = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{rel},sha256={digest},{len(data)}")
    info = site / "vllm-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    (info / "RECORD").write_text("\n".join([*lines, "vllm-9.9.9.dist-info/RECORD,,"]) + "\n")
    run = [sys.executable, "-c", "import json, llmtrial.onnode.node_facts as f; print(json.dumps(f.vllm_files()))"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    def reported() -> dict:
        return json.loads(subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout)
    assert reported() == {"distribution": "vllm", "checked": 3, "changed_count": 0, "changed": []}
    (site / "vllm" / "engine.py").write_bytes(b"x = 2\n")
    (site / "vllm" / "gone.py").unlink()
    assert reported() == {"distribution": "vllm", "checked": 3, "changed_count": 2,
                          "changed": ["vllm/engine.py", "vllm/gone.py (missing)"]}


def test_ray_missing_on_one_node_fails_only_when_the_configuration_uses_ray():
    assert by_name(checks_of(seed(ray=None), uses_ray=True))["ray_version"]["status"] == "fail"
    assert by_name(checks_of(seed(ray=None), uses_ray=False))["ray_version"]["status"] == "warn"
    nowhere = seed(ray=None)
    nowhere["node-a"]["ray"] = None
    assert by_name(checks_of(nowhere, uses_ray=False))["ray_version"]["status"] == "skip"
    assert by_name(checks_of(nowhere, uses_ray=True))["ray_version"]["status"] == "fail"


def test_a_small_dev_shm_fails_naming_the_node_and_both_sizes():
    small = seed(dev_shm={"size_bytes": 64 * 2**20, "free_bytes": 64 * 2**20, "min_bytes": 8 * GiB})
    check = by_name(checks_of(small))["node_dev_shm"]
    assert check["status"] == "fail"
    assert check["detail"].startswith("node-b: /dev/shm is 0.06 GiB, below the 8.00 GiB minimum; remount /dev/shm larger")
    assert check["size_bytes"] == {"node-a": 256 * GiB, "node-b": 64 * 2**20}


def test_a_stale_ray_process_fails_with_its_pid():
    raylet = {"pid": 4242, "marker": "raylet", "what": STALE_MARKERS["raylet"], "age_s": 86400.0, "user": "serve",
              "cmdline": "/opt/serve/.venv/lib/python3.12/site-packages/ray/core/src/ray/raylet/raylet --node_id=..."}
    check = by_name(checks_of(seed(stale={"source": "psutil", "processes": [raylet]})))["stale_processes"]
    assert check["status"] == "fail"
    assert check["detail"].startswith("node-b: pid 4242 (Ray node daemon, 86400 s old, serve): /opt/serve/")
    assert check["processes"] == {"node-b": [raylet]}


def test_an_interface_that_is_missing_or_not_on_the_way_to_the_master_fails_naming_node_and_interface():
    missing = seed(interface={"name": "fabric200g", "exists": False, "addresses": []})
    check = by_name(checks_of(missing))["node_interface"]
    assert (check["status"], check["detail"]) == ("fail", "node-b: interface fabric200g does not exist")
    other_way = seed()
    other_way["node-b"]["master"]["route_dev"] = "eno1"
    check = by_name(checks_of(other_way))["node_interface"]
    assert check["detail"] == "node-b: traffic to the master 10.200.0.1 leaves by eno1, not by fabric200g"
    unnamed = seed(interface={"name": None, "exists": False, "addresses": []})
    assert by_name(checks_of(unnamed))["node_interface"]["status"] == "warn"


def test_a_node_that_did_not_answer_is_left_out_of_the_comparison():
    facts = {**copy.deepcopy(SEED_FACTS), "node-c": {"node": {"name": "node-c"}, "error": "node node-c: gone"}}
    assert by_name(checks_of(facts))["python_patch_level"]["versions"] == {"node-a": "3.12.3", "node-b": "3.12.13"}


def test_same_files_detects_a_differing_hash_and_a_missing_file():
    a = {"config.json": "a" * 64, "model-00001.safetensors": "1" * 64, "tokenizer.json": "t" * 64}
    assert same_files({"a": a, "b": dict(a)}).status == "ok"
    b = {**a, "model-00001.safetensors": "2" * 64}
    del b["tokenizer.json"]
    check = same_files({"a": a, "b": b})
    assert check.status == "fail"
    assert check.detail == ("2 of 3 staged files differ across nodes: model-00001.safetensors: a 111111111111, "
                               "b 222222222222; tokenizer.json: a tttttttttttt, b missing")
    assert [d["path"] for d in check.differing] == ["model-00001.safetensors", "tokenizer.json"]
    assert same_files({"a": a, "b": {**a, "config.json": None}}).differing[0]["sha256"]["b"] is None
    assert same_files({}).status == "skip"


def test_the_fact_program_carries_no_marker_so_it_never_finds_itself():
    [source] = [arg for arg in program_argv("python", node_facts_program) if "def stale(" in arg]
    assert not [m for m in STALE_MARKERS if m in source]


def test_a_program_is_known_by_the_module_it_runs_not_by_what_its_docstring_mentions():
    """The probe program's docstring names the sanity-check ranks; a trial's probes running beside a
    multi-node trial's preflight are no stale rank. A standalone rank and a headless vLLM rank are."""
    def stale(argv: list[str]) -> list[str]:
        return [m for m in STALE_MARKERS if m in command_line(argv)]

    probe = probe_argv(ProbesBlock(), [0])
    assert "llmtrial.host.collective" in probe[2]
    assert stale(probe) == []
    rank = rank_argv(1, 2, backend="gloo", master_addr="10.200.0.1", port=29500, out="-",
                     program=program_argv("python3", collective))
    assert stale(rank) == ["llmtrial.host.collective"]
    assert stale(program_argv("python3", headless_serve, "{}")) == ["llmtrial.onnode.headless_serve"]
    assert stale(["bash", "-c", "sleep 1\nvllm serve /models/x"]) == ["vllm serve"]  # only Python's -c is cut


# --- each node's GPUs (nodes.<name>.gpus) ----------------------------------------------------

def gpu_inventory(*names: str) -> dict:
    """A node's GPUs as its fact program lists them from NVML, one per name; a double's figures (this machine
    has no NVML): the seed names neither the cards' UUIDs nor their memory."""
    return {"present": bool(names), "count": len(names), "source": "nvml double (test facts)", "reason": None,
            "devices": [{"index": i, "name": name, "uuid": f"GPU-{i}{len(names)}", "memory_total_bytes": 98 * GiB}
                        for i, name in enumerate(names)]}


#: Seed 000's GPUs: two on node A, one (the Max-Q card) on node B.
SEED_GPUS = {"node-a": gpu_inventory("RTX PRO 6000", "RTX PRO 6000"), "node-b": gpu_inventory("RTX PRO 6000 Max-Q")}
NO_NVML = {"present": False, "count": 0, "source": "nvml", "reason": "NVML unavailable: Driver Not Loaded",
           "devices": []}


def gpu_reports(**gpus: dict | None) -> dict[str, NodeReport]:
    """Seed 000's node facts (each node on node A's Python) with ``gpus`` as each node's inventory."""
    return {name: NodeReport.model_validate({"node": {"name": name}, **f, **({"gpus": gpus[name]} if gpus[name] else {})})
            for name, f in seed().items()}


def test_each_node_selects_its_own_count_among_its_own_gpus():
    facts = gpu_reports(**SEED_GPUS)
    check = select_node_gpus(facts, {"node-a": 2, "node-b": 1})
    assert check.status == "ok"
    assert check.detail == ("node node-a: nodes.node-a.gpus 2: GPU 0 (RTX PRO 6000), 1 (RTX PRO 6000) of its 2; "
                            "node node-b: nodes.node-b.gpus 1: GPU 0 (RTX PRO 6000 Max-Q) of its 1")
    assert check.nodes == {"node-a": {"status": "ok", "count": 2, "selected": [0, 1]},
                           "node-b": {"status": "ok", "count": 1, "selected": [0]}}
    for name, given in SEED_GPUS.items():  # each node's report carries its selection, by the node's own UUIDs
        assert [g.uuid for g in facts[name].gpus.selected_gpus] == [d["uuid"] for d in given["devices"]]


def test_a_node_with_fewer_gpus_than_its_count_fails_naming_the_node_and_its_count():
    facts = gpu_reports(**SEED_GPUS)
    label = "node node-b (ssh 192.0.2.2:22)"
    check = select_node_gpus(facts, {"node-a": 2, "node-b": 2}, labels={"node-b": label})
    assert check.status == "fail"
    assert check.detail == (f"nodes.node-b.gpus: 2 GPUs asked for, {label} has 1: give nodes.node-b.gpus at most 1, "
                            "or free the node's GPUs for the trial")
    assert check.nodes["node-b"] == {"status": "fail", "count": 2, "selected": []}
    assert check.nodes["node-a"]["selected"] == [0, 1]


def test_a_node_whose_nvml_lists_no_gpu_has_its_count_assumed_with_the_reason():
    check = select_node_gpus(gpu_reports(**{**SEED_GPUS, "node-b": NO_NVML}), {"node-a": 2, "node-b": 1})
    assert check.status == "warn"
    assert check.detail == ("node node-b: nodes.node-b.gpus 1 assumed, not checked: the node lists no GPU (NVML "
                            "unavailable: Driver Not Loaded)")


def test_a_node_that_did_not_answer_or_listed_no_inventory_is_not_selected_on():
    facts = gpu_reports(**{**SEED_GPUS, "node-b": None})  # an older fact program: no gpus
    facts["node-c"] = NodeReport(node={"name": "node-c"}, error="node node-c: gone")
    check = select_node_gpus(facts, {"node-a": 2, "node-b": 1, "node-c": 1})
    assert check.status == "warn" and set(check.nodes) == {"node-a", "node-b"}
    assert check.detail == ("node node-b: nodes.node-b.gpus 1 not checked: the node reported no GPU inventory (an "
                            "older node program)")


# --- two hosts on this machine ----------------------------------------------------------------

#: A TCP listener in host A: prints its port, then accepts and closes connections.
LISTENER = """\
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()
"""
#: A second real interpreter of another patch level than this one (no torch, vLLM nor psutil).
OTHER_PYTHON = "/usr/bin/python3.11"


@pytest.fixture
def listener(hosts):
    """The port of a TCP listener in host A, on A's address; stopped at the end."""
    proc = subprocess.Popen(hosts.on_a([sys.executable, "-c", LISTENER, hosts.addr_a]), stdout=subprocess.PIPE,
                            text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=10)


def venv_node_b(hosts, **changes):
    """Host B over ssh, on this test's interpreter (the repository's venv, as host A's node)."""
    return dataclasses.replace(hosts.node_b(), **{"python": sys.executable, **changes})


def test_host_b_over_ssh_reports_its_interface_and_reaches_the_master_on_host_a(hosts, listener):
    b = facts_of(venv_node_b(hosts), master_addr=hosts.addr_a, master_port=listener)
    a = facts_of(hosts.node_a(), master_addr=hosts.addr_a, master_port=listener)
    assert b["interface"] == {"name": "llmt0", "exists": True, "addresses": [f"{hosts.addr_b}/24"]}
    assert a["interface"] == {"name": "llmt0", "exists": True, "addresses": [f"{hosts.addr_a}/24"]}
    assert b["master"] == {"address": hosts.addr_a, "port": listener, "ip": hosts.addr_a, "method": "tcp",
                           "route_dev": "llmt0", "ok": True, "error": None}
    assert b["node"]["ssh"]["address"] == hosts.addr_b and b["stale"]["source"] == "psutil"
    for key in ("python", "python_version", "vllm", "vllm_distribution", "torch", "nccl", "ray"):
        assert a[key] == b[key], key
    assert b["python_version"] == ".".join(map(str, sys.version_info[:3])) and b["torch"] and b["vllm"]
    checks = by_name(checks_of({"a": a, "b": b}))
    for name in ("python_patch_level", "vllm_version", "torch_version", "node_interface", "node_dev_shm"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["nccl_version"]["status"] == "skip"  # the CPU build of torch: no NCCL


def test_a_master_not_reachable_from_host_b_fails_naming_node_and_interface(hosts):
    b = facts_of(venv_node_b(hosts), master_addr=hosts.addr_a, master_port=9)  # nothing listens on 9 in A
    check = by_name(checks_of({"b": b}))["node_interface"]
    assert check["status"] == "fail"
    assert check["detail"].startswith(f"b: the master {hosts.addr_a}:9 is not reachable from llmt0 (TCP connect to "
                                      f"{hosts.addr_a}:9 from {hosts.addr_b}: [Errno 111] Connection refused")
    on_subnet = facts_of(venv_node_b(hosts), master_addr=hosts.addr_a)
    assert on_subnet["master"]["method"] == "subnet" and on_subnet["master"]["ok"]
    elsewhere = facts_of(venv_node_b(hosts), master_addr="10.99.0.1")
    assert elsewhere["master"]["error"] == f"10.99.0.1 is not on a subnet of llmt0 ({hosts.addr_b}/24)"


def test_a_python_patch_mismatch_planted_on_host_b_fails_with_torch_and_vllm_missing(hosts):
    other = Path(OTHER_PYTHON)
    version = subprocess.run([str(other), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True).stdout.strip() if other.is_file() else None
    mine = ".".join(map(str, sys.version_info[:3]))
    if not version or version == mine:
        pytest.skip(f"no second Python of another patch level than {mine} at {OTHER_PYTHON}")
    record = preflight_nodes([hosts.node_a(), venv_node_b(hosts, python=OTHER_PYTHON)], master_addr=hosts.addr_a).model_dump(exclude_unset=True)
    checks = by_name(record["checks"])
    assert checks["node_reachable"]["status"] == "ok"
    assert checks["python_patch_level"]["status"] == "fail"
    assert checks["python_patch_level"]["detail"].startswith(f"Python differs across nodes: a {mine}, b {version};")
    assert checks["vllm_version"]["status"] == checks["torch_version"]["status"] == "fail"
    assert f"torch differs across nodes: a {record['nodes']['a']['torch']}, b not installed" in checks["torch_version"]["detail"]
    b = record["nodes"]["b"]
    assert (b["python"], b["vllm"], b["torch"], b["stale"]["source"]) == (OTHER_PYTHON, None, None, "/proc")


@pytest.mark.hostwide
def test_a_stale_vllm_process_planted_on_host_b_is_found_with_its_pid_and_left_running(hosts):
    argv = [sys.executable, "-c", "import time; time.sleep(300)", "vllm.entrypoints.openai.api_server"]
    before = time.monotonic()
    planted = subprocess.Popen(hosts.on_b(argv))  # ip netns exec execs: the pid is python's
    try:
        time.sleep(0.5)
        for python in (sys.executable, OTHER_PYTHON):  # psutil, then /proc
            if not Path(python).is_file():
                continue
            facts = facts_of(venv_node_b(hosts, python=python), master_addr=hosts.addr_a)
            [found] = [p for p in facts["stale"]["processes"] if p["pid"] == planted.pid]
            assert found["marker"] == "vllm.entrypoints" and found["what"] == "vLLM server" and found["user"] == "root"
            assert found["cmdline"].endswith("import time; time.sleep(300) vllm.entrypoints.openai.api_server")
            # its age spans the 0.5 s slept since it was planted, and no more than the time since then
            # (plus 1 s: psutil dates a process from the boot time, which /proc/stat gives in whole seconds)
            assert 0.4 <= found["age_s"] <= time.monotonic() - before + 1.1
            check = by_name(checks_of({"b": facts}))["stale_processes"]
            assert check["status"] == "fail" and f"b: pid {planted.pid} (vLLM server, " in check["detail"]
        assert planted.poll() is None  # found, never killed
    finally:
        planted.send_signal(signal.SIGKILL)
        planted.wait(timeout=10)


def test_a_small_dev_shm_on_host_b_fails(hosts):
    facts = facts_of(venv_node_b(hosts), master_addr=hosts.addr_a, shm_min_bytes=1 << 50)
    check = by_name(checks_of({"b": facts}))["node_dev_shm"]
    size = os.statvfs("/dev/shm")
    assert check["status"] == "fail"
    assert check["detail"].startswith(f"b: /dev/shm is {size.f_blocks * size.f_frsize / GiB:.2f} GiB, below the "
                                      "1048576.00 GiB minimum")


def test_a_node_that_cannot_be_reached_is_a_failed_check_naming_it(hosts):
    record = preflight_nodes([hosts.node_a(), hosts.node_b(identity_file=str(hosts.wrong_key))],
                             master_addr=hosts.addr_a, timeout=30).model_dump(exclude_unset=True)
    check = record["checks"][0]
    assert check["name"] == "node_reachable" and check["status"] == "fail"
    assert "did not finish within" not in check["detail"]  # ssh's refusal, not the 30 s timeout
    assert check["detail"].startswith(f"node b (ssh root@{hosts.addr_b}:{hosts.port}): ssh could not run ")
    assert "Permission denied (publickey)" in check["detail"] and list(check["errors"]) == ["b"]
    assert record["nodes"]["b"]["node"]["ssh"]["identity_file"] == str(hosts.wrong_key)
    assert record["nodes"]["a"]["python_version"] and "error" not in record["nodes"]["a"]
    assert by_name(record["checks"])["python_patch_level"]["versions"] == {"a": record["nodes"]["a"]["python_version"]}


def test_a_node_that_does_not_answer_in_time_is_a_failed_check_naming_it(tmp_path):
    hang = tmp_path / "python"
    pid_file = tmp_path / "pid"
    hang.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 300\n")
    hang.chmod(0o755)
    record = preflight_nodes([local_node("slow", python=str(hang))], master_addr="127.0.0.1", timeout=1).model_dump(exclude_unset=True)
    check = record["checks"][0]
    assert check["status"] == "fail" and check["detail"].startswith("node slow (this host): ")
    assert "did not finish within 1 s" in check["detail"]  # the 1 s timeout fired, long before the program ended
    if pid_file.exists() and pid_file.read_text().strip():  # it got that far before the timeout: it was stopped
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)
    assert record["checks"][1] == {"name": "cross_node", "status": "fail", "detail": "no node answered: nothing to compare"}
