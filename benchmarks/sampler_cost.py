"""The telemetry sampler's own cost: CPU time per sample and the achieved interval.

    python benchmarks/sampler_cost.py [SECONDS]

Samples the host source and the /metrics source (against a loopback server serving a
real vLLM /metrics page) at 1 Hz and at 10 Hz for SECONDS each (default 10), and prints
per source the CPU time one sample costs (against its target, :data:`CPU_TARGET_S`) and the
interval actually achieved, plus the CSV's size per hour of sampling (the storage question:
long-format CSV against its read-back time with pandas). The host source watches this
process's tree, as a job's watches the server's.
"""

from __future__ import annotations

import http.server
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from llmtrial.host.telemetry_sources import HostSource, MetricsSource
from llmtrial.serve.telemetry import Sampler, read_samples

METRICS = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm-0.32.0-cpu-metrics.txt"
#: CPU seconds one sample may cost: a tenth of the 1 s default interval (the sampler runs beside the server).
CPU_TARGET_S = 0.1


class Handler(http.server.BaseHTTPRequestHandler):
    body = METRICS.read_bytes()

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    with tempfile.TemporaryDirectory() as tmp:
        for hz in (1, 10):
            csv = Path(tmp) / f"{hz}hz.csv"
            sources = [HostSource(pid=os.getpid()), MetricsSource("127.0.0.1", port)]
            with Sampler(csv, sources, interval=1.0 / hz) as sampler:
                time.sleep(seconds)
            stats = sampler.stats()
            t0 = time.perf_counter()
            df = read_samples(csv)
            read_s = time.perf_counter() - t0
            size_per_hour = csv.stat().st_size / seconds * 3600
            print(f"{hz:>2} Hz over {seconds:g} s:")
            for name, st in stats.items():
                cpu = st["cpu_seconds_per_sample"]
                print(f"   {name:8} {st['samples']:5.0f} samples, {cpu * 1000:7.3f} ms CPU per sample "
                      f"({'within' if cpu < CPU_TARGET_S else 'OVER'} its {CPU_TARGET_S * 1000:.0f} ms target), "
                      f"achieved interval {st['achieved_interval_s']:.4f} s (target {1 / hz:.3f} s), "
                      f"{st['skipped_slots']} skipped slots, {st['errors']} errors")
            print(f"   CSV: {len(df)} rows, {size_per_hour / 2**20:.1f} MiB per hour, read back in {read_s * 1000:.0f} ms")
    server.shutdown()


if __name__ == "__main__":
    main()
