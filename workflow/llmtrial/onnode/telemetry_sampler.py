"""On a node: its CPU, memory, load and network, one CSV row per interval until SIGTERM or SIGINT
(or ``MAX_S`` seconds). Run as ``python -c <this file> OUT NODE INTERVAL INTERFACE MAX_S`` (Python
3.8 or later, the standard library, Linux /proc); INTERFACE "" means every interface but lo."""

from __future__ import annotations

import os
import signal
import sys
import time

HEADER = "time,node,cpu_percent,mem_used_bytes,load1,net_rx_bytes,net_tx_bytes\n"
#: The longest sleep between looks at the clock and at a stop signal.
TICK_S = 0.05


def cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v[:8]) - idle, sum(v[:8])


def mem() -> int:
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            m[key] = int(rest.split()[0]) * 1024
    return m["MemTotal"] - m.get("MemAvailable", m.get("MemFree", 0))


def net(iface: str) -> tuple[int, int] | tuple[str, str]:
    """(received, sent) bytes on ``iface`` (every interface but lo for ""), or blanks where none is."""
    rx = tx = 0
    seen = False
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, rest = line.split(":", 1)
            name = name.strip()
            if (iface and name == iface) or (not iface and name != "lo"):
                v = rest.split()
                rx, tx, seen = rx + int(v[0]), tx + int(v[8]), True
    return (rx, tx) if seen else ("", "")


def sample(node: str, iface: str, before: tuple[int, int]) -> tuple[str, tuple[int, int]]:
    """One CSV row, and the CPU counters the next row's percentage starts from."""
    busy, total = cpu()
    pct = 100.0 * (busy - before[0]) / (total - before[1]) if total > before[1] else 0.0
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[0]
    rx, tx = net(iface)
    return f"{time.time():.3f},{node},{pct:.2f},{mem()},{load1},{rx},{tx}\n", (busy, total)


def run(out: str, node: str, interval: float, iface: str, max_s: float, stop: list) -> None:
    """Write rows to ``out`` every ``interval`` seconds (on a fixed grid) until ``stop`` holds anything."""
    folder = os.path.dirname(out)
    if folder:
        os.makedirs(folder, exist_ok=True)
    start, k, counters = time.monotonic(), 1, cpu()
    with open(out, "w") as fh:
        fh.write(HEADER)
        fh.flush()
        while not stop and time.monotonic() - start < max_s:
            due = start + k * interval
            while not stop and time.monotonic() < due:
                time.sleep(min(TICK_S, max(0.0, due - time.monotonic())))
            if stop:
                break
            row, counters = sample(node, iface, counters)
            fh.write(row)
            fh.flush()
            k = max(k + 1, int((time.monotonic() - start) / interval) + 1)


def main() -> None:
    stop: list = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    out, node, interval, iface, max_s = sys.argv[1:6]
    run(out, node, float(interval), iface, float(max_s), stop)


if __name__ == "__main__":
    main()
