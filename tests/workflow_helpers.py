"""Running the workflow from tests: snakemake in a working directory of the test's own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SNAKEFILE, free_base_port
from llmtrial.core.paths import TrialPaths

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

#: Two configurations that need no vLLM: the planner rejects one (skipped, never launched); the
#: other's server cannot even start its interpreter (a failure record, like any server that exits).
NO_VLLM = {
    "noenc": {"description": "The server's Python finds no standard library: it exits at startup.",
              "args": {"tensor_parallel_size": 1}, "env": {"PYTHONHOME": "/nonexistent-llmtrial-home"}},
    "tp3": {"description": "4 heads do not divide over 3 ranks: the planner rejects it.",
            "args": {"tensor_parallel_size": 3}},
}


def write_config(workdir: Path, config: dict) -> Path:
    """The trial file at <workdir>/config/config.yaml, where the Snakefile looks by default."""
    path = workdir / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def default_config(*, patch_off: bool = False) -> dict:
    """The default trial (config/config.yaml) as the tests serve it: its task set is asked of each
    server, but not again of a tp1 launched with the demo patch's flag off unless ``patch_off``
    (a launch of its own, about 40 s here; tests/answers/test_smollm2_e2e.py shows that launch). Its servers
    get ports of their own, free when asked, in a range of this pytest-xdist worker's (conftest.free_base_port): the README's trial, run as
    README shows it, serves on the default ones (8100-8101) meanwhile, and a trial's cleanup checks its ports."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    if config.get("outputs") and not patch_off:
        config["outputs"]["patch_off"] = False
    config["serving"]["base_port"] = free_base_port(18100, len(config["configurations"]))
    return config


def snakemake(workdir: Path, *args: str, timeout: float = 300, configfile: Path | None = None,
              via: list[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run snakemake on the trial in ``workdir``; ``via`` is an argv prefix (``ip netns exec A``
    runs it on host A of tests/hosts.py). ``timeout`` only guards against a hang: a dry run takes
    seconds on an idle machine, and many times that beside a busy one."""
    cmd = [*via, SNAKEMAKE, "--snakefile", str(SNAKEFILE), "--directory", str(workdir)]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    run = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if run.returncode != 0:  # the failed jobs' logs, read now: a later run of the same rule empties them
        run.stderr += failed_job_logs(workdir, run.stdout + run.stderr)
    return run


#: Snakemake's line naming the log of a job that failed.
_FAILED_LOG = re.compile(r"^\s*log: (\S+) \(check log file\(s\) for error details\)", re.M)


def failed_job_logs(workdir: Path, output: str, chars: int = 4000) -> str:
    """The end of the log of every job a run's ``output`` says failed, each under its path."""
    parts = []
    for name in dict.fromkeys(_FAILED_LOG.findall(output)):
        path = workdir / name
        text = path.read_text(errors="replace")[-chars:] if path.is_file() else "(no such file)"
        parts.append(f"\n--- {name} (the failed job's log) ---\n{text}")
    return "".join(parts)


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


def _spread(values: list[float]) -> float | None:
    """(max - min) / mean, None below two values: how far a scenario's passes disagree."""
    return (max(values) - min(values)) / (sum(values) / len(values)) if len(values) >= 2 else None


def assert_stopped_as_its_passes_say(scenario: dict) -> None:
    """A scenario entry of a configuration record (every pass ok, passes ``{min, max, agreement}``) stopped
    where its own output tok/s say it must, whatever they are: ``agreed`` at the first count from ``min`` on
    whose spread is within ``agreement``, else ``max_reached`` at ``max``; the recorded spread is theirs."""
    rep = scenario["repetition"]
    tok_s = [p["summary"]["output_throughput"] for p in scenario["pass_results"]]
    assert all(p["status"] == "ok" for p in scenario["pass_results"]) and rep.get("interval") is None
    assert rep["min"] <= rep["passes_run"] == len(tok_s) <= rep["max"]
    assert rep["spread"] == pytest.approx(_spread(tok_s))

    def agree(n: int) -> bool:
        return _spread(tok_s[:n]) is not None and _spread(tok_s[:n]) <= rep["agreement"]

    assert not any(agree(n) for n in range(rep["min"], rep["passes_run"])), (rep, tok_s)  # it stopped at the first
    assert rep["stopped"] == ("agreed" if agree(rep["passes_run"]) else "max_reached"), (rep, tok_s)
    if rep["stopped"] == "max_reached":
        assert rep["passes_run"] == rep["max"]


def demo_service(state_dir: Path, port: int) -> dict:
    """The resident demo service as a trial config's ``command`` service, run by this venv."""
    base = [sys.executable, "-m", "llmtrial.host.demo_service"]
    opts = ["--port", str(port), "--state", str(state_dir)]
    return {"kind": "command", "status": [*base, "status", *opts], "stop": [*base, "stop", *opts],
            "start": [*base, "start", *opts], "health": {"kind": "http", "url": f"http://127.0.0.1:{port}/health"},
            "timeouts": {"stop_s": 60, "start_s": 60, "health_s": 60}}  # bounds for a busy machine


def snakemake_report(zip_path: Path) -> dict:
    """What ``snakemake --report <zip>`` bundled: ``members`` (the zip's file names); from its
    report.html the ``results`` (path -> name, labels, caption, data_uri), the ``categories``
    (category -> subcategory -> paths) and the rules of the ``rulegraph``; and ``files``, the
    bytes bundled for each result path."""
    with zipfile.ZipFile(zip_path) as archive:
        members = archive.namelist()
        [page] = [n for n in members if n.endswith("/report.html") and "/data/" not in n]
        html = archive.read(page).decode()

        def variable(name: str):
            found = re.search(rf"var {name} = (?=\{{)", html)
            assert found, f"no {name} in {page}"
            return json.JSONDecoder().raw_decode(html, found.end())[0]

        results = variable("results")
        root = page.rsplit("/", 1)[0]
        files = {path: archive.read(f"{root}/{entry['data_uri']}") for path, entry in results.items()}
    graph = variable("rulegraph_spec")
    nodes = next(d["values"] for d in graph["data"] if d["name"] == "node-data")
    return {"members": members, "results": results, "categories": variable("categories"),
            "rulegraph": [n["rule"] for n in nodes], "files": files}


#: The rules every trial's rule graph shows.
RULES = ["preflight", "plan", "stage_model", "quiet", "patch", "trial", "cleanup_trial", "report", "export", "all"]


def assert_snakemake_report_bundles(workdir: Path, zip_path: Path, trial: str, configurations: list[str]) -> dict:
    """The zip holds, byte for byte, report.html, its charts, every trial-wide record and each
    configuration's plan, record and telemetry (nothing else), filed by category, and the rule graph."""
    bundled = snakemake_report(zip_path)
    paths = TrialPaths.of(trial)
    trial_wide = [paths.report, paths.preflight, paths.manifest, paths.quieted, paths.patches_record, paths.cleanup,
                  paths.provenance]
    per_configuration = [p for c in configurations for p in (paths.plan(c), paths.config_record(c), paths.telemetry(c))]
    charts = sorted((workdir / paths.charts).glob("*.svg"))
    assert charts, "the report rule wrote no chart"
    expected = [str(p) for p in trial_wide + per_configuration] + [str(c.relative_to(workdir)) for c in charts]
    assert sorted(bundled["files"]) == sorted(expected)
    for path in expected:
        assert bundled["files"][path] == (workdir / path).read_bytes(), path
    categories = bundled["categories"]
    assert categories["Report"] == {"Other": [str(paths.report)]}
    assert sorted(categories["Records"]) == sorted(["Trial", *configurations])
    for c in configurations:
        assert sorted(categories["Records"][c]) == sorted([str(paths.plan(c)), str(paths.config_record(c))])
        assert bundled["results"][str(paths.config_record(c))]["labels"] == {"configuration": c, "record": "outcome"}
    assert sorted(categories["Telemetry"]["Other"]) == sorted(str(paths.telemetry(c)) for c in configurations)
    assert sorted(categories["Charts"]["Other"]) == [str(c.relative_to(workdir)) for c in charts]
    assert bundled["rulegraph"] == RULES, bundled["rulegraph"]
    return bundled


def open_pass(telemetry_csv: Path) -> str | None:
    """The pass whose telemetry window is open (its start mark written, its end not yet): the benchmark in flight."""
    marks = [line.split(",")[2] for line in (telemetry_csv.read_text().splitlines() if telemetry_csv.exists() else [])
             if line.count(",") == 3 and line.split(",")[1] == "window"]
    return next((m.removesuffix(":start") for m in marks if m.endswith(":start")
                 and f"{m.removesuffix(':start')}:end" not in marks), None)
