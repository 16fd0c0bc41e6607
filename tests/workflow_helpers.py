"""Running the workflow from tests: snakemake in a working directory of the test's own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def write_config(workdir: Path, config: dict) -> Path:
    """The trial file at <workdir>/config/config.yaml, where the Snakefile looks by default."""
    path = workdir / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def default_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def snakemake(workdir: Path, *args: str, timeout: float = 120, configfile: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, check=False)


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run: rule -> number of jobs."""
    counts: dict[str, int] = {}
    if "Job stats:" not in output:
        return counts
    table = output.split("Job stats:", 1)[1]
    for line in table.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


def demo_service(state_dir: Path, port: int) -> dict:
    """The resident demo service as a trial config's ``command`` service, run by this venv."""
    base = [sys.executable, "-m", "llmtrial.demo_service"]
    opts = ["--port", str(port), "--state", str(state_dir)]
    return {"kind": "command", "status": [*base, "status", *opts], "stop": [*base, "stop", *opts],
            "start": [*base, "start", *opts], "health": {"kind": "http", "url": f"http://127.0.0.1:{port}/health"},
            "timeouts": {"stop_s": 10, "start_s": 20, "health_s": 20}}
