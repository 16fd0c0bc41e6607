"""What the pre-serving sanity check costs and shows: two local gloo ranks at a few sizes.

    PYTHONPATH=workflow python benchmarks/collective.py [SIZE_MIB ...] [--iters N] [--port P]

For each size (default 1, 4, 16 and 64 MiB of float32) it runs
:func:`llmtrial.host.collective.run_local_group` with two ranks on loopback and prints the wall
time of the whole check (process start, torch import, rendezvous, warm-up, iterations), the
rendezvous time, the slowest rank's median all_reduce time, and the algorithm and bus
bandwidths as nccl-tests defines them for all_reduce (busbw = algbw * 2(n-1)/n; equal for
n = 2). With ``--failures`` it also prints how long two broken groups take to fail against
their targets: a missing interface (seconds: the ranks stop before importing torch) and a rank
that never starts (within ``--fail-timeout-s``, the ranks' own timeout).
"""

from __future__ import annotations

import argparse
import tempfile

from llmtrial.host.collective import free_port, run_local_group


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sizes", nargs="*", type=float, default=[1, 4, 16, 64])
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--timeout-s", type=float, default=120)
    p.add_argument("--failures", action="store_true", help="also time a missing interface and a missing rank")
    p.add_argument("--fail-timeout-s", type=float, default=15)
    a = p.parse_args()
    print(f"{'size':>8} {'wall s':>8} {'init s':>8} {'median s':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for size in a.sizes:
        with tempfile.TemporaryDirectory(prefix="collective-bench-") as work:
            s = run_local_group(2, backend="gloo", master_addr="127.0.0.1", port=a.port or free_port(),
                                size_mib=size, iters=a.iters, timeout_s=a.timeout_s, workdir=work)
        if not s["ok"]:
            print(f"{size:>6g} MiB  failed: {s['diagnosis']}")
            continue
        init = max(r["init_s"] for r in s["ranks"])
        print(f"{size:>6g} MiB {s['wall_s']:>8.2f} {init:>8.3f} {s['median_s']:>10.4f} {s['algbw_gbps']:>11.3f} "
              f"{s['busbw_gbps']:>11.3f}")
    if a.failures:
        failures(a.port, a.fail_timeout_s)


def failures(port: int | None, timeout_s: float) -> None:
    """How long a broken group takes to fail, with the rank's own timeout ``timeout_s``."""
    cases = (("missing interface", {"interface": "nosuch0"}, "a few seconds"),
             ("a rank never starts", {"ranks": [0]}, f"under {timeout_s:g} s"))
    for label, broken, target in cases:
        with tempfile.TemporaryDirectory(prefix="collective-bench-") as work:
            s = run_local_group(2, backend="gloo", master_addr="127.0.0.1", port=port or free_port(), size_mib=1,
                                iters=1, timeout_s=timeout_s, workdir=work, **broken)
        print(f"{label}: failed in {s['wall_s']:.2f} s (target: {target}; killed {s['killed']}): {s['diagnosis']}")


if __name__ == "__main__":
    main()
