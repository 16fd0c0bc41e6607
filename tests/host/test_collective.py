"""Tests for llmtrial.host.collective: the all_reduce sanity check run before any server starts.

Real gloo ranks (real torch processes) on loopback, and across two network namespaces joined
by a veth pair when this host lets the test make them (root and ``ip``). Rendezvous ports
come from 29500-29999.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hosts import INTERFACE
from llmtrial.host import collective
from llmtrial.host.collective import (
    busbw_factor,
    diagnose_rank,
    free_port,
    main,
    rank_argv,
    run_local_group,
    summarize,
)
from llmtrial.host.nodes import last_json_object, program_argv
from llmtrial.logs.failures import diagnose_failure
from llmtrial.logs.lines import read_log
from llmtrial.serve.multinode import sanity_check

pytestmark = pytest.mark.stale_sources  # starts sanity-check ranks, which a multi-node trial's stale-process check reports


def rendezvous_port() -> int:
    return free_port(shuffle=True)


def _result(rank: int, **kw) -> dict:
    """One rank's successful result, as a rank writes it."""
    base = {"rank": rank, "world_size": 2, "backend": "gloo", "interface": None, "master_addr": "10.0.0.1",
            "master_port": 29500, "size_bytes": 16 << 20, "iters": 5, "hostname": f"node{rank}", "python": "3.11.7",
            "torch": "2.13.0+cpu", "ok": True, "phase": "done", "init_s": 0.5, "times_s": [0.1] * 5,
            "median_s": 0.1, "error": None, "diagnosis": None}
    return {**base, **kw}


def within_timeout(rank: dict, timeout: float) -> bool:
    """Whether a rank failed at the init phase by a timeout of its own, as its record says: torch's
    store timeout, set below ``timeout``, or the rank's own deadline of ``timeout`` (a slow torch import)."""
    store = re.search(r"Timed out after (\d+) seconds waiting for clients", rank["error"] or "")
    fired = int(store[1]) < timeout if store else (rank["error"] or "").startswith(f"deadline of {timeout:g} s reached")
    return rank["phase"] == "init" and fired


# ------------------------------------------------------------------ summarize: pure data


def test_busbw_factor_is_nccl_tests_all_reduce():
    assert busbw_factor(2) == 1.0
    assert busbw_factor(4) == 1.5
    assert busbw_factor(8) == 1.75


def test_summarize_uses_the_slowest_rank_and_nccl_tests_bus_bandwidth():
    ranks = [_result(r, world_size=4, median_s=0.1 + 0.1 * (r == 2)) for r in range(4)]
    s = summarize(ranks)
    assert s["ok"] and s["diagnosis"] is None and s["missing"] == []
    assert s["median_s"] == pytest.approx(0.2)
    assert s["algbw_gbps"] == pytest.approx((16 << 20) / 0.2 / 1e9)
    assert s["busbw_gbps"] == pytest.approx(s["algbw_gbps"] * 2 * 3 / 4)


def test_summarize_flags_differing_torch_versions_even_when_the_collective_worked():
    s = summarize([_result(0), _result(1, torch="2.12.1+cpu")])
    assert not s["ok"]
    assert s["phase"] == "versions"
    assert "torch versions differ" in s["diagnosis"]
    assert "rank 0 2.13.0+cpu" in s["diagnosis"] and "rank 1 2.12.1+cpu" in s["diagnosis"]


def test_summarize_flags_differing_python_patch_levels():
    s = summarize([_result(0, python="3.12.3"), _result(1, python="3.12.13")])
    assert not s["ok"] and "Python versions differ" in s["diagnosis"]


def test_summarize_names_ranks_that_never_reported():
    rank0 = _result(0, world_size=3, ok=False, phase="init", median_s=None,
                    error="DistStoreError: Timed out after 9 seconds waiting for clients. 2/3 clients joined.")
    s = summarize([rank0, _result(1, world_size=3, ok=False, phase="init", median_s=None, error="x")], world_size=3)
    assert not s["ok"] and s["missing"] == [2] and s["reported"] == [0, 1]
    assert s["diagnosis"].startswith("A peer never joined: rank(s) 2 of 3")
    assert "2/3 clients joined" in s["diagnosis"]


# ------------------------------------------------------------------ one rank, in process


def test_rank_with_a_missing_interface_fails_before_importing_torch(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    for name in ("torch", "torch.distributed"):  # an import of torch now raises: the rank must not get there
        monkeypatch.setitem(sys.modules, name, None)
    rc = main(["--rank", "0", "--world-size", "2", "--master-addr", "127.0.0.1", "--master-port", "29999",
               "--interface", "nosuch0", "--timeout-s", "30", "--out", str(out)])
    assert rc == 1
    r = json.loads(out.read_text())
    assert r["ok"] is False and r["phase"] == "init" and r["torch"] is None
    assert r["error"] == "GLOO_SOCKET_IFNAME=nosuch0: no such interface"
    assert r["diagnosis"].startswith("GLOO_SOCKET_IFNAME=nosuch0: no such interface")


def test_a_standalone_rank_runs_where_llmtrial_cannot_be_imported():
    """The rank a node without llmtrial runs (its module's source as ``python -c``, ``--out -``): here with
    every llmtrial import refused, it still answers, its result the last line it prints."""
    argv = rank_argv(0, 2, backend="gloo", master_addr="127.0.0.1", port=29999, out="-", interface="nosuch0",
                     program=program_argv(sys.executable, collective))
    assert argv[1] == "-c" and "llmtrial.host.collective" not in argv[:2]
    refusing = ("import sys; sys.modules['llmtrial'] = None; "
                "exec(compile(sys.argv.pop(1), 'collective', 'exec'), {'__name__': '__main__'})")
    proc = subprocess.run([argv[0], "-c", refusing, *argv[2:]], capture_output=True, text=True, timeout=120,
                          check=False)
    result = last_json_object(proc.stdout)
    assert (proc.returncode, result["ok"], result["phase"]) == (1, False, "init"), proc.stderr
    assert result["diagnosis"].startswith("GLOO_SOCKET_IFNAME=nosuch0: no such interface")


# ------------------------------------------------------------------ real ranks on loopback


@pytest.mark.slow
def test_two_gloo_ranks_on_loopback_all_reduce(tmp_path):
    s = run_local_group(2, backend="gloo", master_addr="127.0.0.1", port=rendezvous_port(), size_mib=2, iters=3,
                        timeout_s=60, workdir=tmp_path)
    assert s["ok"], s["diagnosis"]
    assert s["reported"] == [0, 1] and s["missing"] == [] and s["killed"] == []
    assert s["size_bytes"] == 2 << 20
    assert s["median_s"] > 0 and s["algbw_gbps"] > 0
    assert s["busbw_gbps"] == pytest.approx(s["algbw_gbps"] * 2 * (2 - 1) / 2)
    for r in s["ranks"]:
        assert r["ok"] and len(r["times_s"]) == 3 and r["init_s"] >= 0
        assert r["algbw_bytes_per_s"] > 0
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * busbw_factor(2))
        assert r["torch"] and r["hostname"] == socket.gethostname()
        assert Path(s["logs"][str(r["rank"])]).exists()


@pytest.mark.slow
def test_a_rank_that_never_starts_fails_within_the_timeout(tmp_path):
    timeout = 15
    s = run_local_group(2, port=rendezvous_port(), size_mib=1, iters=1, timeout_s=timeout, workdir=tmp_path,
                        ranks=[0])
    # rank 0 ended on its own (nothing was killed at the group's deadline), by a timeout within its own
    assert not s["ok"] and s["phase"] == "init"
    assert s["missing"] == [1] and s["reported"] == [0] and s["killed"] == []
    assert within_timeout(s["ranks"][0], timeout)
    assert s["diagnosis"].startswith("A peer never joined: rank(s) 1 of 2")
    assert "ranks that reported: 0" in s["diagnosis"]


@pytest.mark.slow
def test_a_master_that_is_not_there_is_a_refused_connection(tmp_path):
    port = rendezvous_port()
    s = run_local_group(2, port=port, size_mib=1, iters=1, timeout_s=15, workdir=tmp_path, ranks=[1])
    assert not s["ok"] and s["killed"] == [] and s["ranks"][0]["phase"] == "init"  # it ended on its own
    assert s["diagnosis"].startswith(f"rank 1: Connection refused at 127.0.0.1:{port}")
    # what torch printed on the rank's stderr is what the failure catalogue knows
    found = diagnose_failure(read_log(s["logs"]["1"]), source="rank1.log")
    assert found["pattern"] == "master_unreachable", found
    assert f"(127.0.0.1, {port})" in found["line"]


@pytest.mark.slow
def test_a_missing_interface_is_diagnosed_in_seconds(tmp_path):
    s = run_local_group(2, port=rendezvous_port(), timeout_s=30, workdir=tmp_path, interface="nosuch0")
    for r in s["ranks"]:  # each stopped at the interface check, before importing torch or waiting for a peer,
        # or, when the other rank failed first, was stopped then (not at the deadline)
        stopped = f"rank {r['rank']} was stopped after rank {1 - r['rank']} failed without writing a result"
        assert (r["phase"], r.get("torch"), r["error"]) == ("init", None, "GLOO_SOCKET_IFNAME=nosuch0: no such "
                                                            "interface") or r["error"] == stopped, r
    assert not s["ok"] and s["phase"] == "init"
    assert "GLOO_SOCKET_IFNAME=nosuch0: no such interface" in s["diagnosis"]


# ------------------------------------------------------------------ two "hosts": network namespaces

PREFIX = "llco"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _remove_stale_namespaces() -> None:
    """Namespaces of earlier runs whose test process is gone (the name carries its pid)."""
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _ip("netns", "del", name, check=False)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: ``(ns_a, ns_b, addr_a, addr_b, if_a, if_b)``."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    _remove_stale_namespaces()
    ns_a, ns_b = f"{PREFIX}{os.getpid()}a", f"{PREFIX}{os.getpid()}b"
    if_a, if_b = f"{PREFIX}{os.getpid() % 100000}x", f"{PREFIX}{os.getpid() % 100000}y"
    subnet = f"10.232.{os.getpid() % 250 + 1}"
    try:
        for ns in (ns_a, ns_b):
            _ip("netns", "add", ns)
        _ip("link", "add", if_a, "netns", ns_a, "type", "veth", "peer", "name", if_b, "netns", ns_b)
        for ns, ifname, host in ((ns_a, if_a, 1), (ns_b, if_b, 2)):
            _ip("-n", ns, "addr", "add", f"{subnet}.{host}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield ns_a, ns_b, f"{subnet}.1", f"{subnet}.2", if_a, if_b
    finally:
        for ns in (ns_a, ns_b):  # the veth pair goes with its namespaces
            _ip("netns", "del", ns, check=False)
        assert not {ns_a, ns_b} & {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line}


@pytest.mark.slow
def test_the_collective_crosses_two_network_namespaces(two_hosts, tmp_path):
    ns_a, ns_b, addr_a, addr_b, if_a, if_b = two_hosts
    # the namespaces reach each other, and only each other
    assert _ip("-n", ns_b, "route", "get", addr_a).stdout.split()[2] == if_b
    s = run_local_group(2, master_addr=addr_a, port=rendezvous_port(), size_mib=2, iters=3, timeout_s=60,
                        workdir=tmp_path, interface=[if_a, if_b],
                        prefix=[["ip", "netns", "exec", ns_a], ["ip", "netns", "exec", ns_b]])
    assert s["ok"], s["diagnosis"]
    assert [r["interface"] for r in s["ranks"]] == [if_a, if_b]
    assert {r["master_addr"] for r in s["ranks"]} == {addr_a}
    assert s["busbw_gbps"] > 0


@pytest.mark.slow
def test_a_rank_on_the_wrong_interface_in_a_namespace(two_hosts, tmp_path):
    ns_a, _, addr_a, _, if_a, _ = two_hosts
    # rank 1 runs in namespace A too but names B's interface, which A does not have
    s = run_local_group(2, master_addr=addr_a, port=rendezvous_port(), timeout_s=30, workdir=tmp_path,
                        interface=[if_a, two_hosts[5]],
                        prefix=[["ip", "netns", "exec", ns_a], ["ip", "netns", "exec", ns_a]])
    # rank 0, which cannot finish without rank 1, is stopped once rank 1 failed, not at the deadline
    assert not s["ok"] and s["killed"] == [0] and s["ranks"][1]["torch"] is None
    assert s["ranks"][0]["error"] == "rank 0 was stopped after rank 1 failed without writing a result"
    assert f"GLOO_SOCKET_IFNAME={two_hosts[5]}: no such interface" in s["diagnosis"]


# ------------------------------------------------------------------ diagnoses of errors seen on GPUs


@pytest.mark.parametrize("phase", ["init", "all_reduce"])
def test_two_ranks_on_one_gpu_is_named(phase):
    # torch 2.11.0+cu130 / NCCL 2.28.9 on a one-GPU H200 host, two ranks on cuda:0: at the first
    # all_reduce, or at init once the rank binds its device there (device_id)
    error = ("DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage "
             "(run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects "
             "invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA "
             "device 60")
    d = diagnose_rank(phase, error, rank=1, world_size=2, master_addr="127.0.0.1", port=29512,
                      backend="nccl", interface=None, timeout_s=40)
    assert d.startswith("Two ranks use the same GPU")
    s = summarize([{**_result(r), "ok": False, "phase": phase, "error": error, "diagnosis": d} for r in (0, 1)])
    assert s["diagnosis"] == f"rank 0: {d}"


def test_an_unknown_error_names_its_first_and_last_lines():
    d = diagnose_rank("all_reduce", "DistBackendError: NCCL error in: x.cpp:1, unhandled system error\nLast error:\n"
                      "socket closed", rank=0, world_size=2, master_addr="a", port=1, backend="nccl", interface=None,
                      timeout_s=5)
    assert d == "The all_reduce phase failed on rank 0: DistBackendError: NCCL error in: x.cpp:1, unhandled system " \
                "error (socket closed)"


def test_one_rank_has_a_time_but_no_bandwidth():
    s = summarize([_result(0, world_size=1)])
    assert s["ok"] and s["median_s"] == 0.1
    assert s["algbw_gbps"] is None and s["busbw_gbps"] is None


# ------------------------------------------------------------ the sanity check across a trial's nodes


@pytest.mark.slow
def test_the_sanity_check_runs_one_rank_on_each_node_over_ssh(hosts):
    a, b = hosts.node_a(), dataclasses.replace(hosts.node_b(), python=sys.executable)
    s = sanity_check([a, b], port=rendezvous_port(), size_mib=2, iters=3, timeout_s=60)
    assert s["ok"], s["diagnosis"]
    assert [(r["node"], r["rank"], r["interface"], r["master_addr"]) for r in s["ranks"]] == [
        ("a", 0, INTERFACE, hosts.addr_a), ("b", 1, INTERFACE, hosts.addr_a)]
    assert s["busbw_gbps"] > 0 and s["nodes"] == ["a", "b"]
    assert s["wall_s"] >= max(r["elapsed_s"] for r in s["ranks"])  # the check's time spans each rank's own


@pytest.mark.slow
def test_a_node_naming_a_missing_interface_fails_the_sanity_check_with_its_diagnosis(hosts):
    a = hosts.node_a()
    b = dataclasses.replace(hosts.node_b(), python=sys.executable, interface="nosuch0")
    s = sanity_check([a, b], port=rendezvous_port(), size_mib=1, iters=1, timeout_s=10)
    # each rank answered with its own result (none cut off by ssh's timeout): rank 1 at once, rank 0 by its timeout
    assert not s["ok"] and [r["node"] for r in s["ranks"]] == ["a", "b"]
    assert s["ranks"][1]["torch"] is None and within_timeout(s["ranks"][0], 10)
    assert "rank 1: GLOO_SOCKET_IFNAME=nosuch0: no such interface" in s["diagnosis"]
