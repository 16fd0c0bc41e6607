"""Start-up, sanity check and throughput across two hosts against one, on this machine.

    PYTHONPATH=workflow:tests python benchmarks/two_hosts.py [--work DIR]

Makes the two hosts of the tests (tests/hosts.py: two network namespaces joined by a veth
pair, sshd in the second), runs config/trials/two-hosts-cpu.yaml as it is (tensor parallel 2
on host A alone, across A and B with vLLM's native launch, and across a Ray cluster) with
snakemake on host A, and prints from the records: each configuration's status, its server's
launch-to-ready time, the gloo sanity check's time and bus bandwidth, and each pass's output
throughput, TTFT and TPOT. Needs root and Debian's sshd (``make test`` installs it); takes
about three minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hosts import two_hosts

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def trial_file(h, work: Path) -> Path:
    """The trial file with the two hosts' addresses, key and staging folders."""
    config = yaml.safe_load((REPO / "config" / "trials" / "two-hosts-cpu.yaml").read_text())
    config["staging_dir"] = str(work / "staging")
    config["nodes"]["a"]["address"] = h.addr_a
    b = config["nodes"]["b"]
    b.update(python=sys.executable, staging_dir=str(h.staging_b))
    b["ssh"].update(address=h.addr_b, port=h.port, identity_file=str(h.key),
                    options=[f"UserKnownHostsFile={h.known_hosts}"])
    b["env"]["VLLM_CPU_OMP_THREADS_BIND"] = "1"  # one machine: each host's rank its own core
    path = work / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def show(results: Path) -> None:
    print(f"{'configuration':<20} {'status':<8} {'ready s':>8} {'check s':>8} {'busbw GB/s':>10}  passes: "
          "output tok/s, median TTFT ms, median TPOT ms")
    for record_path in sorted(results.glob("configs/*/record.json")):
        r = json.loads(record_path.read_text())
        ready = (r["cold_start"].get("ready_seconds") or {}).get("value")
        check = r.get("collective") or {}
        passes = [p["summary"] for s in r["scenarios"] for p in s["pass_results"] if p.get("summary")]
        figures = "; ".join(f"{p['output_throughput']:.1f}, {p['median_ttft_ms']:.1f}, {p['median_tpot_ms']:.1f}"
                            for p in passes)
        print(f"{r['configuration']:<20} {r['status']:<8} {ready if ready is not None else '-':>8} "
              f"{check.get('wall_s', '-'):>8} {round(check['busbw_gbps'], 3) if check.get('busbw_gbps') else '-':>10}"
              f"  {figures or (r['failure'] or {}).get('message', '')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=None, help="folder for the trial (default: a temporary one)")
    a = p.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="two-hosts-bench-"))
    with two_hosts() as h:
        trial_file(h, work)
        started = time.monotonic()
        run = subprocess.run(h.on_a([SNAKEMAKE, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(work),
                                     "--cores", "all"]), capture_output=True, text=True, check=False)
        print(f"trial: exit {run.returncode} in {time.monotonic() - started:.0f} s ({work})")
        if run.returncode:
            print(run.stderr[-3000:])
        show(work / "results" / "two-hosts")


if __name__ == "__main__":
    main()
