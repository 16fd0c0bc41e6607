"""Download throughput of the model stage against `hf download`, same server, same files.

    python benchmarks/hub_download.py [SHARDS] [SHARD_MIB] [ROUNDS]

Serves a repository of SHARDS weight shards of SHARD_MIB MiB each (default 4 x 64 MiB)
plus small files from the loopback Hub server (tests/hub_server.py) and, ROUNDS times
(default 3, alternating which goes first), downloads it into a fresh folder with the
model stage (llmtrial.weights.staging.stage_model: resolve, headroom, download, verify every
file's sha256) and with `hf download --local-dir` (huggingface_hub's CLI, which does not
hash). Both run as their own processes with the same HF_ENDPOINT and token, and both
must produce the same bytes. Prints seconds and MiB/s per round and the stage's
throughput as a ratio of hf's (median over rounds).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hub_server import HubServer, model_files  # noqa: E402

STAGE = ("import json, sys; from pathlib import Path; from llmtrial.weights.staging import stage_model; "
         "stage_model(json.loads(sys.argv[1]), Path(sys.argv[2]), "
         "disk={'reserve_fraction': 0, 'reserve_min_gib': 0})")


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not any(part.startswith(".") for part in p.parts[len(folder.parts):])}


def main() -> None:
    shards = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    shard_mib = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    files = model_files(0, shards=shards, shard_bytes=shard_mib << 20)
    total = sum(len(d) for d in files.values())
    hf = shutil.which("hf", path=str(Path(sys.executable).parent)) or "hf"
    with HubServer(token="hf_benchmark") as hub, tempfile.TemporaryDirectory() as tmp:
        sha = hub.add_commit("bench/model", files)
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_benchmark", "HF_HUB_DISABLE_XET": "1",
               "HF_HOME": str(Path(tmp) / "hf-home"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        source = json.dumps({"kind": "hub", "repo_id": "bench/model", "revision": "main", "max_workers": 8})
        runs: dict[str, list[float]] = {"stage": [], "hf download": []}
        print(f"{len(files)} files, {total / 2**20:,.0f} MiB, commit {sha[:12]}, loopback server at {hub.endpoint}")
        for i in range(rounds):
            order = ["stage", "hf download"] if i % 2 == 0 else ["hf download", "stage"]
            for name in order:
                dest = Path(tmp) / f"{name.replace(' ', '-')}-{i}"
                argv = [sys.executable, "-c", STAGE, source, str(dest)] if name == "stage" else \
                    [hf, "download", "bench/model", "--revision", "main", "--local-dir", str(dest), "--quiet"]
                started = time.perf_counter()
                subprocess.run(argv, env=env, check=True, capture_output=True)
                seconds = time.perf_counter() - started
                runs[name].append(seconds)
                got = digest(dest)
                assert got == {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}, f"{name}: wrong bytes"
                print(f"round {i + 1} {name:12} {seconds:6.2f} s  {total / 2**20 / seconds:8.1f} MiB/s")
                shutil.rmtree(dest)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"median: stage {total / 2**20 / med['stage']:.1f} MiB/s, hf download "
          f"{total / 2**20 / med['hf download']:.1f} MiB/s")
    print(f"stage throughput / hf download throughput = {med['hf download'] / med['stage']:.2f} "
          "(the stage also hashes every byte it fetched)")


if __name__ == "__main__":
    main()
