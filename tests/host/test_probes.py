"""The host probes: the real probe program on this host (CPU torch: host memory measured, every
GPU probe skipped with the reason), and the link checks on inventories shaped as preflight
records them (NvmlDouble: a double of NVML, this host having no GPU)."""

from __future__ import annotations

import pytest

from conftest import NvmlDouble
from llmtrial.config import load_schema, validate_config
from llmtrial.core.preflight_model import Gpus, ProbeResult, Probes
from llmtrial.core.records import check_record
from llmtrial.core.trial_config import DiskBlock, ProbesBlock, SourceBlock
from llmtrial.host import probes
from llmtrial.lifecycle.preflight import gpu_inventory, run_preflight

SMALL = {"host_memory": {"bytes": 8 << 20, "repeats": 3}}


@pytest.fixture(scope="module")
def on_this_host() -> dict:
    """One run of the real probe program here, with the device_memory probe disabled."""
    return run({**SMALL, "device_memory": {"enabled": False}}, [0, 1])


def run(settings: dict, devices: list[int], **kwargs) -> dict:
    """:func:`probes.run_probes` of a partial ``probes`` block, as the record has it."""
    return probes.run_probes(probes.settings_with_defaults(settings), devices, **kwargs).model_dump(exclude_unset=True)


def by_name(record: dict, name: str) -> list[dict]:
    return [r for r in record["results"] if r["name"] == name]


def test_host_memory_is_measured_with_its_method(on_this_host):
    [hm] = by_name(on_this_host, "host_memory")
    assert hm["status"] == "measured" and hm["kind"] == "measured"
    assert hm["gbps"] > 0 and hm["seconds_median"] > 0 and hm["bytes"] == 8 << 20 and hm["repeats"] == 3
    assert "copy_" in hm["method"] and "median of 3" in hm["method"]


def test_every_gpu_probe_is_skipped_with_the_reason_on_a_host_without_cuda(on_this_host):
    import torch

    assert not torch.cuda.is_available()
    reason = f"torch {torch.__version__}: torch.cuda.is_available() is False"
    assert on_this_host["cuda_available"] is False and on_this_host["reason"] == reason
    for name in ("host_to_device", "device_to_host", "device_to_device", "all_reduce"):
        [r] = by_name(on_this_host, name)
        assert (r["status"], r["kind"], r["reason"], r["gbps"]) == ("skipped", "measured", reason, None)


def test_a_disabled_probe_is_skipped_naming_its_key(on_this_host):
    [r] = by_name(on_this_host, "device_memory")
    assert r["status"] == "skipped" and r["reason"] == "disabled in the trial file (probes.device_memory.enabled)"


def test_every_probe_disabled_runs_nothing():
    off = {name: {"enabled": False} for name in probes.PROBES}
    record = run(off, [0])
    assert record["torch"] is None and all(r["status"] == "skipped" for r in record["results"])
    assert {r["reason"] for r in record["results"]} == {f"disabled in the trial file (probes.{n}.enabled)"
                                                        for n in probes.PROBES}


def test_a_program_that_cannot_start_skips_every_probe_with_the_reason(tmp_path):
    record = run(SMALL, [], python=str(tmp_path / "no-python"))
    assert all(r["status"] == "skipped" and "could not start" in r["reason"] for r in record["results"])


def test_the_defaults_are_the_schemas():
    config = validate_config({"trial": "t", "model": {"name": "m", "source": {"kind": "tiny"}},
                              "configurations": {"a": {}}, "scenarios": {"s": {}}})
    assert config["probes"] == ProbesBlock().model_dump()  # the loader fills the block as the probes read it
    assert probes.settings_with_defaults({"host_memory": {"repeats": 2}}).host_memory.model_dump() == {
        **ProbesBlock().host_memory.model_dump(), "repeats": 2}
    assert set(load_schema()["properties"]["probes"]["properties"]) == {"timeout_s", "far_below", *probes.PROBES}


def test_the_preflight_record_carries_the_probes_and_their_checks(tmp_path):
    record = run_preflight(source=SourceBlock(kind="tiny"), staging_dir=tmp_path, disk=DiskBlock(reserve_fraction=0.0,
                           reserve_min_gib=0), nvml=NvmlDouble(), probes=ProbesBlock.model_validate(SMALL))
    check_record(record, "preflight")
    names = [c.name for c in record.checks]
    assert names[-2:] == ["pcie_link", "link_bandwidth"]
    assert record.probes.devices == [0, 1]  # no selection: every GPU the inventory lists


# --------------------------------------------------------------------------- checks


def devices(**changes: dict) -> Gpus:
    """An inventory as preflight records it (NvmlDouble: gen 5 x16, GPU 1 without its width)."""
    gpus = gpu_inventory(NvmlDouble())
    for d in gpus["devices"]:
        d.update(changes.get(str(d["index"]), {}))
    return Gpus.model_validate(gpus)


def measured(name: str, index: int, gbps: float, memory: str = "pinned", **extra) -> ProbeResult:
    return ProbeResult(name=name, status="measured", kind="measured", method="a copy", devices=[index], bytes=1 << 20,
                       repeats=3, gbps=gbps, seconds_median=1e-3, reason=None, memory=memory, **extra)


def test_a_link_below_its_generation_warns_saying_it_was_idle():
    gpus = devices(**{"0": {"pcie_gen": 1}})
    c = probes.pcie_check(gpus.devices, [])
    assert c.status == "warn" and c.below == [0]
    assert "GPU 0 gen 1/5 x16/x16 (idle)" in c.detail and "idle GPU may drop" in c.detail


def test_the_link_read_under_load_is_preferred():
    gpus = devices(**{"0": {"pcie_gen": 1}})
    loaded = [measured("host_to_device", 0, 50.0, pcie_gen_under_load=5, pcie_width_under_load=16)]
    assert probes.pcie_check(gpus.devices, loaded).status == "ok"
    narrow = [measured("host_to_device", 0, 50.0, pcie_gen_under_load=5, pcie_width_under_load=8)]
    c = probes.pcie_check(gpus.devices, narrow)
    assert c.status == "warn" and "GPU 0 gen 5/5 x8/x16 (under load)" in c.detail


def test_a_width_nvml_will_not_give_is_not_a_warning():
    gpus = devices()
    assert gpus.devices[1].pcie_width is None
    assert probes.pcie_check(gpus.devices, []).status == "ok"


def test_peer_access_off_warns_only_when_a_configuration_splits():
    off = {"0-1": False}
    assert probes.peer_check(off, [0, 1], {"tp1": 1}).status == "skip"
    c = probes.peer_check(off, [0, 1], {"tp1": 1, "tp2": 2})
    assert c.status == "warn" and "0-1" in c.detail and c.configurations == ["tp2"]
    assert probes.peer_check({"0-1": True}, [0, 1], {"tp2": 2}).status == "ok"
    assert probes.peer_check({"0-2": False}, [0, 1], {"tp2": 2}).status == "ok"  # GPU 2 not selected


def test_link_bandwidth_far_below_the_promise_warns_with_the_numbers():
    gpus = devices()
    # gen 5 x16 promises 3.938 x 16 = 63.01 GB/s; 3.26 GB/s (the seed's RTX 3060 host) is far below it
    results = [measured("host_to_device", 0, 3.26), measured("host_to_device", 0, 2.84, memory="pageable")]
    c = probes.bandwidth_check(gpus.devices, results, 0.5)
    assert c.status == "warn"
    assert "GPU 0 host_to_device 3.26 GB/s of 63.01 GB/s promised (gen 5 x16)" in c.detail
    assert probes.bandwidth_check(gpus.devices, [measured("host_to_device", 0, 40.0)], 0.5).status == "ok"
    assert probes.bandwidth_check(gpus.devices, [], 0.5).status == "skip"


def test_link_checks_use_the_selected_gpus_only():
    gpus = devices(**{"1": {"pcie_gen": 3}}).model_copy(update={"selected": [0]})
    none = Probes(torch=None, cuda_available=None, devices=[0], reason=None, results=[])
    checks = probes.link_checks(none, gpus)
    assert [(c.name, c.status) for c in checks] == [("pcie_link", "ok"), ("link_bandwidth", "skip")]
