"""llmtrial used from another workflow with Snakemake's ``module``: a host Snakefile in a folder of its own,
with its own trial file, run by an interpreter that has snakemake and vLLM but no installed llmtrial. What
the workflow is made of is found from its own folder; what the trial names (results, staging) lands in
the host's working directory."""

from __future__ import annotations

import json
import subprocess
import sysconfig

import pytest
import yaml

from conftest import REPO, SNAKEFILE
from llmtrial.core.record_models import PlanRecord
from workflow_helpers import default_config, job_counts

pytestmark = pytest.mark.workflow

HOST_SNAKEFILE = """\
configfile: "config/llmtrial.yaml"


module llmtrial:
    snakefile:
        {snakefile!r}
    config:
        config


use rule * from llmtrial


# the module's own onsuccess/onerror are not the host's: the host gives the host back through them
onsuccess:
    llmtrial.cleanup_if_unfinished()


onerror:
    llmtrial.cleanup_on_error()


rule library:
    output:
        "library.txt",
    params:
        python=sys.executable,
    shell:
        "{{params.python}} -c 'import llmtrial; print(llmtrial.__file__)' > {{output}}"
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The host workflow's folder and a python that sees this venv's packages but not the editable
    llmtrial: a .pth in a bare venv names the packages' folder, whose own .pth files are not read."""
    root = tmp_path_factory.mktemp("module")
    py = root / "py"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(py)], check=True)
    [site] = (py / "lib").glob("python3*/site-packages")
    (site / "packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = root / "host"
    (work / "config").mkdir(parents=True)
    (work / "Snakefile").write_text(HOST_SNAKEFILE.format(snakefile=str(SNAKEFILE)))
    config = default_config() | {"trial": "hosted"}
    config["configurations"]["tp1"]["args"]["max_model_len"] = 256
    (work / "config" / "llmtrial.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return {"work": work, "python": str(py / "bin" / "python")}


def host_snakemake(host: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([host["python"], "-m", "snakemake", *args], cwd=host["work"], capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_hosts_interpreter_has_no_installed_llmtrial(host):
    found = subprocess.run([host["python"], "-c", "import snakemake, yaml; import llmtrial"],
                           capture_output=True, text=True, check=False)
    assert found.returncode != 0 and "No module named 'llmtrial'" in found.stderr


def test_a_process_a_job_starts_imports_the_library_from_the_modules_folder(host):
    run = host_snakemake(host, "--cores", "1", "library.txt")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (host["work"] / "library.txt").read_text().strip() == str(SNAKEFILE.parent / "llmtrial" / "__init__.py")


def test_a_dry_run_from_the_host_plans_every_stage_of_its_own_trial(host):
    run = host_snakemake(host, "-n")
    assert run.returncode == 0, run.stdout + run.stderr
    counts = job_counts(run.stdout)
    assert counts["plan"] == 2 and counts["trial"] == 2 and counts["report"] == 1 and counts["preflight"] == 1
    assert "results/hosted/plans/tp1.json" in run.stdout


def test_the_plan_stage_runs_from_the_host_with_its_config_and_writes_under_its_folder(host):
    work = host["work"]
    targets = [f"results/hosted/plans/{name}.json" for name in ("tp1", "tp2")]
    run = host_snakemake(host, "--cores", "2", *targets)
    assert run.returncode == 0, run.stdout + run.stderr
    plans = {name: PlanRecord.model_validate(json.loads((work / "results" / "hosted" / "plans" / f"{name}.json")
                                                        .read_text())) for name in ("tp1", "tp2")}
    assert [plans[name].configuration for name in plans] == ["tp1", "tp2"]
    assert plans["tp1"].verdict == "fits" and plans["tp1"].plan["tensor_parallel_size"] == 1
    assert plans["tp1"].plan["max_model_len"] == 256 and plans["tp2"].plan["max_model_len"] == 512
    assert (work / "results" / "hosted" / "preflight" / "record.json").is_file()
    assert not (REPO / "results" / "hosted").exists() and not (SNAKEFILE.parent / "results").exists()
    assert "llmtrial: host restored: yes" in run.stdout + run.stderr  # the module's handler, called by the host
