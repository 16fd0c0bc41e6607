"""Nodes: the trial file's ``nodes``, argv on a node, and two real hosts made on this machine
(tests/hosts.py: two network namespaces, host B reached over ssh from host A)."""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hosts import PREFIX, SSHD, clean_stale, namespaces, two_hosts
from llmtrial.config import ConfigError, check_config, validate_config
from llmtrial.core.fileio import sha256_file
from llmtrial.host.nodes import (
    LOCAL_NAME,
    Node,
    NodeDefaults,
    NodeError,
    configuration_nodes,
    last_json_object,
    local_node,
    spanned_nodes,
    trial_nodes,
)

BASE = {
    "trial": "t",
    "model": {"name": "m", "source": {"kind": "tiny"}},
    "configurations": {"one": {}, "two": {"nodes": ["a", "b"]}},
    "scenarios": {"s": {}},
    "nodes": {"a": {}, "b": {"reach": "ssh", "ssh": {"user": "root", "address": "10.0.0.2"}}},
}


def config(**changes) -> dict:
    out = copy.deepcopy(BASE)
    out.update(changes)
    return out


def ssh_node(**ssh) -> Node:
    return Node.from_config("b", {"reach": "ssh", "ssh": {"user": "u", "address": "h", **ssh}}, NodeDefaults(staging_dir="st"))


# --- the trial file ---------------------------------------------------------------------------


def test_a_trial_without_nodes_runs_on_one_local_node():
    cfg = validate_config(config(nodes={}, configurations={"one": {}}))
    assert cfg["nodes"] == {} and cfg["configurations"]["one"]["nodes"] == []
    assert list(trial_nodes(cfg)) == [LOCAL_NAME]
    [node] = configuration_nodes(check_config(cfg), "one")
    assert node.is_local and node.python == sys.executable and node.staging_dir == "staging"
    assert node.address == "127.0.0.1"


def test_node_defaults_are_filled_and_resolved():
    cfg = validate_config(config(staging_dir="/srv/staging"))
    assert cfg["nodes"]["b"] == {
        "reach": "ssh", "slurm_index": None, "python": None, "staging_dir": None, "interface": None, "address": None,
        "env": {}, "gpus": None,
        "ssh": {"user": "root", "address": "10.0.0.2", "port": 22, "identity_file": None, "options": []},
    }
    assert cfg["nodes"]["a"]["reach"] == "local"
    a, b = configuration_nodes(check_config(cfg), "two")
    assert (a.name, a.python, a.staging_dir, a.address) == ("a", sys.executable, "/srv/staging", "127.0.0.1")
    assert (b.name, b.python, b.staging_dir, b.address, b.port) == ("b", "python3", "/srv/staging", "10.0.0.2", 22)
    assert [n.name for n in configuration_nodes(check_config(cfg), "one")] == ["a"]  # the trial's first node


def test_a_configuration_naming_an_unknown_node_is_rejected_naming_the_key():
    cfg = config(configurations={"two": {"nodes": ["a", "c"]}})
    with pytest.raises(ConfigError, match=r"config key 'configurations\.two\.nodes': 'c' is not a node of this trial \(a, b\)"):
        validate_config(cfg)
    with pytest.raises(ConfigError, match=r"'configurations\.two\.nodes': 'a' is not a node of this trial \(the trial lists no"):
        validate_config(config(nodes={}, configurations={"two": {"nodes": ["a"]}}))


def test_a_service_naming_an_unknown_node_is_rejected_naming_the_key():
    cfg = config(services={"web": {"kind": "systemd", "node": "c"}})
    with pytest.raises(ConfigError, match=r"config key 'services\.web\.node': 'c' is not a node of this trial \(a, b\)"):
        validate_config(cfg)
    assert validate_config(config(services={"web": {"kind": "systemd", "node": "b"}}))["services"]["web"]["node"] == "b"


def test_spanned_nodes_are_the_nodes_of_any_configuration_in_the_trials_order():
    assert list(spanned_nodes(check_config(config(configurations={"two": {"nodes": ["b", "a"]}, "one": {}})))["nodes"]) \
        == ["a", "b"]
    assert list(spanned_nodes(check_config(config(configurations={"one": {}})))["nodes"]) == ["a"]


def test_a_bad_reach_is_rejected_naming_the_key():
    with pytest.raises(ConfigError, match=r"'nodes\.b\.reach': 'telnet': Input should be 'local', 'ssh' or 'slurm'"):
        validate_config(config(nodes={"a": {}, "b": {"reach": "telnet"}}))


def test_an_ssh_node_needs_an_address_and_refuses_options_that_run_a_local_shell():
    nodes = {"a": {}, "b": {"reach": "ssh", "ssh": {"options": ["ConnectTimeout=3", "proxycommand=nc %h %p"]}}}
    with pytest.raises(ConfigError) as err:
        validate_config(config(nodes=nodes))
    assert "'nodes.b.ssh.address': a node reached over ssh needs an address" in str(err.value)
    assert "'nodes.b.ssh.options.1': ssh option proxycommand runs a command through a shell on this host" in str(err.value)
    with pytest.raises(ValueError, match="node b: ssh option BatchMode is always yes"):
        ssh_node(options=["BatchMode=no"])


# --- argv -------------------------------------------------------------------------------------


def test_a_local_node_runs_the_argv_unchanged():
    assert local_node().argv(["echo", "a b", ";x"]) == ["echo", "a b", ";x"]
    assert local_node(via=["ip", "netns", "exec", "n"]).argv(["true"]) == ["ip", "netns", "exec", "n", "true"]


def test_an_ssh_node_quotes_the_argv_into_one_remote_string():
    node = ssh_node(identity_file="/k", port=2200, options=["ServerAliveInterval=5"])
    assert node.argv(["python3", "-c", "print(1)", "a b", ";rm -rf x", "$HOME"]) == [
        "ssh", "-i", "/k", "-p", "2200", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
        "-o", "ConnectTimeout=10", "-o", "IdentitiesOnly=yes", "-o", "ServerAliveInterval=5", "u@h", "--",
        "python3 -c 'print(1)' 'a b' ';rm -rf x' '$HOME'",
    ]


def test_given_options_replace_the_defaults_and_a_known_hosts_file_makes_checking_strict():
    argv = ssh_node(options=["ConnectTimeout=3", "UserKnownHostsFile=/kh"]).argv(["true"])
    assert argv[argv.index("--") - 1] == "u@h"
    options = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert options == ["BatchMode=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=3", "UserKnownHostsFile=/kh"]


def test_describe_names_the_node_without_secrets():
    node = ssh_node(identity_file="/keys/id", options=["ConnectTimeout=3"])
    node = dataclasses.replace(node, env=(("HF_TOKEN", "hf_secret"),))
    assert node.describe() == {
        "name": "b", "reach": "ssh", "address": "h", "python": "python3", "staging_dir": "st", "interface": None,
        "env_keys": ["HF_TOKEN"],
        "ssh": {"user": "u", "address": "h", "port": 22, "identity_file": "/keys/id", "options": ["ConnectTimeout=3"]},
    }
    assert "ssh" not in local_node().describe()


def test_a_local_node_runs_hashes_and_copies(tmp_path):
    node = local_node()
    assert node.run(["sh", "-c", 'echo "$X"'], timeout=10, env={"X": "a b"}).stdout == "a b\n"
    with pytest.raises(NodeError, match=r"node local \(this host\): false exited 1"):
        node.run(["false"], timeout=10, check=True)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(os.urandom(4096))
    (src / ".hidden").write_text("h")
    manifest = node.copy_to(src, str(tmp_path / "dst"))
    assert manifest == {".hidden": sha256_file(src / ".hidden"), "sub/w.bin": sha256_file(src / "sub" / "w.bin")}
    assert node.sha256([str(tmp_path / "dst" / "sub" / "w.bin"), str(tmp_path / "nope")]) == {
        str(tmp_path / "dst" / "sub" / "w.bin"): manifest["sub/w.bin"], str(tmp_path / "nope"): None}


# --- two hosts on this machine ----------------------------------------------------------------


def test_the_ssh_node_runs_exactly_the_argv_on_host_b(hosts):
    args = ["a b", ";rm -rf x", "$HOME", "it's", "*"]
    proc = hosts.node_b().run(["python3", "-c", "import sys; print(sys.argv[1:])", *args], timeout=30, check=True)
    assert ast.literal_eval(proc.stdout.strip()) == args
    proc = hosts.node_b().run(["python3", "-c", "import os; print(os.environ['X'])"], timeout=30, check=True,
                              env={"X": "a b;$y"})
    assert proc.stdout == "a b;$y\n"


def test_a_command_over_ssh_runs_on_host_b_and_comes_from_host_a(hosts):
    proc = hosts.node_b().run(["sh", "-c", 'ip -o -4 addr; echo "from $SSH_CONNECTION"'], timeout=30, check=True)
    assert f"inet {hosts.addr_b}/24" in proc.stdout and f"inet {hosts.addr_a}/" not in proc.stdout
    assert f"from {hosts.addr_a} " in proc.stdout  # the client's address: host A, over the veth pair
    for ns in (hosts.ns_a, hosts.ns_b):  # neither host has a route out of the pair
        routes = subprocess.run(["ip", "-n", ns, "-4", "route"], capture_output=True, text=True, check=True).stdout
        assert routes.splitlines() == [f"{hosts.addr_a.rsplit('.', 1)[0]}.0/24 dev llmt0 proto kernel scope link "
                                       f"src {hosts.addr_a if ns == hosts.ns_a else hosts.addr_b} "]
    assert hosts.node_a().run(["ip", "-o", "-4", "addr"], timeout=10).stdout.count(f"inet {hosts.addr_a}/24") == 1


def test_copy_to_host_b_verifies_every_file_by_sha256(hosts, tmp_path):
    src = tmp_path / "model"
    (src / "shards").mkdir(parents=True)
    for i in range(3):
        (src / "shards" / f"w {i}.safetensors").write_bytes(os.urandom(50_000 + i))
    (src / "config.json").write_text('{"a": 1}')
    (src / ".llmtrial-manifest.json").write_text("{}")
    node = hosts.node_b()
    dest = f"{hosts.staging_b}/t/model"
    manifest = node.copy_to(src, dest)
    local = {f.relative_to(src).as_posix(): sha256_file(f) for f in src.rglob("*") if f.is_file()}
    assert manifest == local and len(local) == 5
    there = node.sha256([f"{dest}/{rel}" for rel in local])
    assert {k.removeprefix(f"{dest}/"): v for k, v in there.items()} == local
    assert node.copy_to(src / "config.json", f"{hosts.staging_b}/one/renamed.json") == {
        "renamed.json": local["config.json"]}
    assert (hosts.staging_b / "one" / "renamed.json").read_text() == '{"a": 1}'


def test_a_wrong_key_fails_fast_naming_the_node(hosts):
    node = hosts.node_b(identity_file=str(hosts.wrong_key))
    with pytest.raises(NodeError) as err:
        node.run(["true"], timeout=60, check=True)
    msg = str(err.value)  # ssh's own refusal (exit 255), not the 60 s timeout
    assert msg.startswith(f"node b (ssh root@{hosts.addr_b}:{hosts.port}): ssh could not run true (exit 255")
    assert "Permission denied (publickey)" in msg
    assert node.run(["true"], timeout=60).returncode == 255


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("fail", [False, True], ids=["clean exit", "body raised"])
def test_two_hosts_leave_nothing_behind(fail):
    needs_sshd()
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext(), two_hosts(subnet="10.231.7") as h:
        made = (h.ns_a, h.ns_b, h.sshd.pid, h.tmp)
        assert {h.ns_a, h.ns_b} <= set(namespaces()) and not _gone(h.sshd.pid) and h.tmp.is_dir()
        assert h.node_b().run(["true"], timeout=30).returncode == 0
        if fail:
            raise RuntimeError("a failing test")
    ns_a, ns_b, pid, tmp = made
    assert ns_a not in namespaces() and ns_b not in namespaces()
    assert _gone(pid) and not tmp.exists()
    assert not Path("/root/.ssh/known_hosts").exists() or f"{h.addr_b}" not in Path("/root/.ssh/known_hosts").read_text()


def needs_sshd() -> None:
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing: `make test` installs openssh-server (as root)")


def in_namespace(pid: int, ns: str, wait: float = 30.0) -> None:
    """Wait until process ``pid`` has entered network namespace ``ns``."""
    deadline = time.monotonic() + wait
    while subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.split() != [ns]:
        assert time.monotonic() < deadline, f"pid {pid} never entered {ns}"
        time.sleep(0.05)


def test_a_stale_namespace_of_a_dead_run_is_removed():
    needs_sshd()
    gone = subprocess.Popen(["true"])
    gone.wait()
    ns = f"{PREFIX}a-{gone.pid}-0"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
    folder = Path(tempfile.gettempdir()) / f"{PREFIX}hosts-{gone.pid}-0-x"
    folder.mkdir()
    try:
        in_namespace(sleeper.pid, ns)  # inside it before the cleanup looks, whatever the machine's speed
        removed = clean_stale()
        assert ns in removed and str(folder) in removed
        assert ns not in namespaces() and not folder.exists()
        assert sleeper.wait(timeout=10) == -9
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)



def test_a_rank_gets_the_nodes_interface_and_address_under_its_own_env():
    block = {"reach": "ssh", "ssh": {"address": "10.0.0.2"}, "interface": "ib0",
             "env": {"VLLM_CPU_OMP_THREADS_BIND": "1", "NCCL_SOCKET_IFNAME": "=ib0"}}
    node = Node.from_config("b", block, NodeDefaults(staging_dir="st"))
    assert node.rank_env() == {"VLLM_HOST_IP": "10.0.0.2", "GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "=ib0",
                               "VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert local_node().rank_env() == {"VLLM_HOST_IP": "127.0.0.1"}


def test_the_answer_of_a_program_is_its_last_json_object_line():
    """What a program prints after its answer (a library's warning at exit) and before it is passed over;
    nothing that is an object is an error quoting what was printed."""
    printed = 'loading\n{"a": 1}\n{"b": 2}\n[3]\nWARNING: leaked semaphore\n'
    assert last_json_object(printed) == {"b": 2}
    with pytest.raises(ValueError, match="no JSON object in what it printed: .*Traceback"):
        last_json_object("[1]\n{not json\nTraceback (most recent call last)\n")
