"""Telemetry sources beyond the host: NVML (through a double), vLLM's /metrics, the kernel log, the CPU
packages' RAPL counters (through a double of the kernel's powercap tree), and the window figures built
from them."""

from __future__ import annotations

import http.server
import time

import pytest

from conftest import DATA, NVMLError, NvmlTelemetryDouble, loopback, wait_until
from llmtrial.host.telemetry_sources import POWERCAP, KernelLogSource, MetricsSource, NvmlSource, RaplSource, job_sources
from llmtrial.serve.telemetry import Sampler, read_samples, window_figures


class TestNvml:
    def test_two_gpus_with_a_field_refused(self):
        nvml = NvmlTelemetryDouble()
        src = NvmlSource(nvml)
        assert src.available
        out = src.sample()
        assert out["gpu0.util_percent"] == 50 and out["gpu1.util_percent"] == 51
        assert out["gpu0.power_w"] == 300 and out["gpu0.power_limit_w"] == 700
        assert out["gpu1.sm_clock_mhz"] == 1980 and out["gpu1.mem_clock_mhz"] == 2619
        assert out["gpu0.pcie_tx_kbps"] == 1000 and out["gpu0.pcie_rx_kbps"] == 1001
        assert out["gpu0.processes"] == 1 and out["gpu0.processes_mem_bytes"] == 8 * 2**30
        assert "gpu0.temp_c" not in out and out["gpu1.temp_c"] == 60
        assert src.field_errors == 1

    def test_a_gpu_that_disappears_mid_run_is_marked_lost_and_the_other_goes_on(self, tmp_path):
        nvml = NvmlTelemetryDouble()
        src = NvmlSource(nvml)
        with Sampler(tmp_path / "t.csv", [src], interval=0.05) as sampler:
            wait_until(lambda: sampler.stats()["nvml"]["samples"] >= 2, "two samples of both GPUs")
            nvml.lose_gpu1 = True
            wait_until(lambda: src.lost, "GPU 1 marked lost")
            # the sample that found the loss may still be in flight; the two after the next one are later
            # than it by a slot or more
            later = sampler.stats()["nvml"]["samples"] + 4
            wait_until(lambda: sampler.stats()["nvml"]["samples"] >= later, "samples after the loss")
        df = read_samples(tmp_path / "t.csv")
        lost = df[df.metric == "gpu1.lost"]
        assert len(lost) == 1 and src.lost == [1]
        after = df[df.t > lost.t.iloc[0]]
        assert (after.metric == "gpu0.util_percent").sum() >= 2 and not after.metric.str.startswith("gpu1.").any()
        assert sampler.errors["nvml"] == [] and nvml.shut

    def test_energy_over_a_window_gives_joules_and_tokens_per_joule(self):
        nvml = NvmlTelemetryDouble()
        src = NvmlSource(nvml)
        rows = {"t": [], "source": [], "metric": [], "value": []}
        for t in (10.0, 11.0, 12.0):
            for k, v in src.sample().items():
                rows["t"].append(t), rows["source"].append("nvml"), rows["metric"].append(k), rows["value"].append(v)
        for t, v in ((10.0, 100.0), (12.0, 700.0)):
            rows["t"].append(t), rows["source"].append("metrics"), rows["metric"].append("generation_tokens_total")
            rows["value"].append(v)
        fig = window_figures(rows, 10.0, 12.0).model_dump(exclude_unset=True)
        assert fig["deltas"]["nvml.gpu0.energy_mj"] == 600_000 and fig["deltas"]["nvml.gpu1.energy_mj"] == 600_000
        assert fig["energy_j"] == 1200.0 and fig["deltas"]["metrics.generation_tokens_total"] == 600
        assert fig["tokens_per_joule"] == 0.5
        assert fig["summary"]["nvml.gpu0.util_percent"]["mean"] == 50

    def test_no_library_or_driver_is_absent_with_the_reason(self):
        class NoDriver(NvmlTelemetryDouble):
            def nvmlInit(self):
                raise NVMLError("Driver Not Loaded")

        src = NvmlSource(NoDriver())
        assert not src.available and "Driver Not Loaded" in src.reason


class MetricsHandler(http.server.BaseHTTPRequestHandler):
    body = (DATA / "vllm-0.32.0-cpu-metrics.txt").read_bytes()

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def metrics_server():
    with loopback(MetricsHandler) as (_host, port):
        yield port


class TestMetrics:
    def test_real_vllm_metrics_are_summed_over_labels(self, metrics_server):
        out = MetricsSource("127.0.0.1", metrics_server).sample()
        assert out["generation_tokens_total"] == 16 and out["prompt_tokens_total"] == 15
        assert out["preemptions_total"] == 0 and out["requests_finished_total"] == 1
        assert out["running"] == 0 and out["waiting"] == 0 and 0 <= out["kv_cache_usage"] <= 1

    def test_before_the_server_answers_a_sample_is_empty_then_a_failure_is_an_error(self, free_port):
        src = MetricsSource("127.0.0.1", free_port, timeout=0.5)
        assert src.sample() == {}
        src.seen = True
        with pytest.raises(OSError):
            src.sample()


class TestKernelLog:
    def test_new_xid_lines_after_the_baseline_are_counted(self, tmp_path):
        log = tmp_path / "dmesg.txt"
        log.write_text("[1.0] boot\n[2.0] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus\n")
        src = KernelLogSource(command=["cat", str(log)])
        assert src.available and src.sample() == {"xid_events": 0.0, "nvrm_events": 0.0}
        with open(log, "a") as fh:
            fh.write("[9.0] NVRM: Xid (PCI:0000:02:00): 48, pid=1, DBE\n[9.1] eth0 up\n")
        assert src.sample() == {"xid_events": 1.0, "nvrm_events": 1.0}
        assert src.events == ["[9.0] NVRM: Xid (PCI:0000:02:00): 48, pid=1, DBE"]

    def test_an_unreadable_kernel_log_is_recorded_not_forced(self):
        src = KernelLogSource(command=["sh", "-c", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1"])
        assert not src.available and "Operation not permitted" in src.reason


def test_sample_now_takes_an_immediate_sample_between_scheduled_ones(tmp_path, metrics_server):
    src = MetricsSource("127.0.0.1", metrics_server)
    with Sampler(tmp_path / "t.csv", [src], interval=10.0) as sampler:
        wait_until(lambda: sampler.stats()["metrics"]["samples"], "the scheduled first sample")
        t0 = time.time()
        sampler.sample_now("metrics")
    df = read_samples(tmp_path / "t.csv")
    times = sorted(set(df[df.metric == "generation_tokens_total"].t))
    assert len(times) == 2 and times[1] >= t0 - 0.001
    assert sampler.stats()["metrics"]["samples"] == 1


def test_a_retired_source_is_not_sampled_again(tmp_path, metrics_server):
    src = MetricsSource("127.0.0.1", metrics_server)
    with Sampler(tmp_path / "t.csv", [src], interval=0.05) as sampler:
        wait_until(lambda: sampler.stats()["metrics"]["samples"] >= 2, "two samples before retiring")
        sampler.retire("metrics")
        retired_at = time.time()
        # at its next slot the source's thread finds it retired and ends, the sampler still open
        wait_until(lambda: not any(t.is_alive() for t in sampler.threads), "the retired source's thread ending")
        taken = sampler.stats()["metrics"]["samples"]
    df = read_samples(tmp_path / "t.csv")
    assert taken >= 2 and len(df) > 0 and (df.t <= retired_at).all()


def powercap_double(root, packages: dict[str, int], span: int = 262_143_328_850):
    """A double of the kernel's powercap interface (this machine has no /sys/class/powercap): a tree of
    ``intel-rapl:<n>`` zones as sysfs lays them out, each package with ``name``, ``energy_uj`` and
    ``max_energy_range_uj``, and a core subzone beside it (a part of its package's figure)."""
    for i, (name, energy) in enumerate(packages.items()):
        zone = root / f"intel-rapl:{i}"
        zone.mkdir(parents=True)
        (zone / "name").write_text(name + "\n")
        (zone / "energy_uj").write_text(f"{energy}\n")
        (zone / "max_energy_range_uj").write_text(f"{span}\n")
        core = root / f"intel-rapl:{i}:0"
        core.mkdir()
        (core / "name").write_text("core\n")
        (core / "energy_uj").write_text("5\n")
    return root


class TestRapl:
    def test_each_package_is_read_and_a_wrapped_counter_is_unwrapped(self, tmp_path):
        span = 262_143_328_850
        root = powercap_double(tmp_path / "powercap", {"package-0": span - 1_000_000, "package-1": 7_000_000}, span)
        src = RaplSource(root)
        assert src.available and src.name == "rapl"
        assert src.sample() == {"package-0.energy_uj": span - 1_000_000, "package-1.energy_uj": 7_000_000}
        (root / "intel-rapl:0" / "energy_uj").write_text("2000000\n")  # passed the range: 3 J later
        (root / "intel-rapl:1" / "energy_uj").write_text("9000000\n")
        out = src.sample()
        assert out["package-0.energy_uj"] - (span - 1_000_000) == 3_000_000  # 1 J to the range's end, 2 J after
        assert out["package-1.energy_uj"] == 9_000_000 and "core.energy_uj" not in out

    def test_a_window_gives_cpu_package_joules_never_gpu_energy(self, tmp_path):
        root = powercap_double(tmp_path / "powercap", {"package-0": 1_000_000})
        src = RaplSource(root)
        rows = {"t": [], "source": [], "metric": [], "value": []}
        for t, uj in ((10.0, 1_000_000), (11.0, 41_000_000), (12.0, 91_000_000)):
            (root / "intel-rapl:0" / "energy_uj").write_text(f"{uj}\n")
            for k, v in src.sample().items():
                rows["t"].append(t), rows["source"].append(src.name), rows["metric"].append(k), rows["value"].append(v)
        fig = window_figures(rows, 10.0, 12.0).model_dump(exclude_unset=True)
        assert fig["cpu_package_energy_j"] == (91_000_000 - 1_000_000) / 1e6
        assert "energy_j" not in fig and "energy_check" not in fig and "tokens_per_joule" not in fig

    def test_no_powercap_or_an_unreadable_counter_is_absent_with_the_reason(self, tmp_path):
        missing = RaplSource(tmp_path / "nothing")
        assert not missing.available and str(tmp_path / "nothing") in missing.reason
        root = powercap_double(tmp_path / "powercap", {"package-0": 1})
        (root / "intel-rapl:0" / "energy_uj").unlink()
        unreadable = RaplSource(root)
        assert not unreadable.available and "not readable" in unreadable.reason

    def test_a_job_samples_rapl_where_the_host_has_it_and_lists_it_absent_where_not(self, tmp_path):
        root = powercap_double(tmp_path / "powercap", {"package-0": 1})
        sampled, absent = job_sources(powercap=root)
        assert "rapl" in [s.name for s in sampled]
        sampled, absent = job_sources()  # this machine: no /sys/class/powercap
        if not POWERCAP.exists():
            assert [s.reason for s in absent if s.name == "rapl"] == [
                f"no RAPL package zone under {POWERCAP} (no powercap energy counters on this host)"]
