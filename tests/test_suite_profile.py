"""benchmarks/suite_profile.py: what a run's CPU went to, by kind of process, with real processes.

The command profiled starts two Python children that spend CPU on purpose, each until its own CPU clock has
counted a set amount, whatever the machine's speed: one names itself as vLLM's spawned workers do
(``VLLM::Worker``) half-way and then waits long enough to be read (ten reads' time), the other ends at once. What
is asserted is where their CPU went, never how fast anything ran.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "benchmarks" / "suite_profile.py"
#: CPU seconds each child spends on purpose.
SPEND = 0.4

BURN = """
import time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
"""
#: Spends half, names itself as vLLM's spawned workers do, spends the rest, then waits ten reads' time.
WORKER = f"""# worker double
{BURN}
import ctypes
burn({SPEND / 2})
ctypes.CDLL(None).prctl(15, b"VLLM::Worker", 0, 0, 0)  # PR_SET_NAME, as setproctitle sets it
burn({SPEND / 2})
time.sleep(3)
"""
#: Spends its share and ends at once: a read may see it or not; the kernel's accounting has it either way (as the
#: ticks it was found running at: with the cores busy, fewer than /proc would have read).
SHORT = f"""# short burner
{BURN}
import ctypes
ctypes.CDLL(None).prctl(15, b"short-burner", 0, 0, 0)
burn({SPEND})
"""
COMMAND = f"""
import subprocess, sys
for code in ({WORKER!r}, {SHORT!r}):
    subprocess.run([sys.executable, "-c", code], check=True)
sys.exit(3)
"""


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("profile") / "profile.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--interval", "0.3", "--json", str(out), "--",
                          sys.executable, "-c", COMMAND], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 3, run.stderr[-2000:]  # the command's own exit code
    assert "CPU by kind of process:" in run.stdout
    return json.loads(out.read_text())


def cpu(found: dict, kind: str | None = None, label: str | None = None) -> float:
    return sum(s for k, lab, s in found["labels"] if kind in (None, k) and (label is None or label in lab))


def test_a_process_that_names_itself_a_vllm_worker_is_charged_there_with_all_it_spent(found):
    # a tick is 10 ms: allow the last one of each half
    assert cpu(found, "vLLM worker") >= SPEND - 0.05
    assert cpu(found, label="worker double") == 0  # nothing left under the name it began with


@pytest.mark.skipif(os.geteuid() != 0, reason="process accounting (acct(2)) needs root")
def test_a_process_that_ends_between_two_reads_is_still_charged_from_the_kernels_accounting(found):
    assert found["process_accounting"] is True
    # read while it ran ("-c # short burner"), or only in the kernel's record of its end ("short-burner ..."), whose
    # ticks are samples: under two CPU hogs the kernel recorded 23 ticks of a process /proc read at 38
    assert cpu(found, label="short burner") + cpu(found, label="short-burner") >= SPEND / 4


def test_the_cpu_charged_is_the_childrens_and_no_more_than_the_machine_was_busy(found):
    """Charging a process twice (a rename moved without taking it off its first name, the kernel's record added on
    top of the reads) would charge more than the machine spent; missing the children, less than they spent."""
    assert 2 * SPEND - 0.1 <= found["seen_cpu_s"] <= found["busy_cpu_s"] + 0.2  # 0.2 s: the two counts' ticks
    assert found["vllm_servers_started_at_s"] == []  # no vLLM server here: none counted


#: Ends once it has spent its share, after the profile it follows gave the kernel's accounting back.
AFTER = f"""# after the inner profile
{BURN}
import ctypes
ctypes.CDLL(None).prctl(15, b"after-inner", 0, 0, 0)
burn({SPEND})
"""
NESTED = f"""
import subprocess, sys
subprocess.run([sys.executable, {str(SCRIPT)!r}, "--interval", "0.3", "--json", sys.argv[1], "--", sys.executable, "-c",
                "pass"], check=True, stdout=subprocess.DEVNULL)
subprocess.run([sys.executable, "-c", {AFTER!r}], check=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="process accounting (acct(2)) needs root")
def test_a_profile_run_inside_another_gives_the_kernels_accounting_back_to_it(tmp_path):
    """The outer profile reads no process while its command runs (its interval outlasts it): what the command's
    processes spent reaches it only through the kernel's accounting, also after the inner profile has ended."""
    inner, outer = tmp_path / "inner.json", tmp_path / "outer.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--interval", "600", "--json", str(outer), "--",
                          sys.executable, "-c", NESTED, str(inner)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(outer.read_text())
    assert found["process_accounting"] is True and json.loads(inner.read_text())["process_accounting"] is True
    assert cpu(found, "ended before a read", label="after-inner (started by") > 0  # its parent ended unread too


@pytest.fixture(scope="module")
def profiler() -> dict:
    """The script's names, as ``python benchmarks/suite_profile.py`` defines them."""
    return runpy.run_path(str(SCRIPT))


def test_what_a_process_spent_is_charged_once_to_the_kind_of_its_last_name(profiler):
    """Reads made by hand: a spawned child read before and after it names itself, a process that ran before the
    profile, a pid reused, then the kernel's records of two ends (one of a process read, one of a process never read)."""
    Sample, Ended, account = profiler["Sample"], profiler["Ended"], profiler["Account"]()
    spawn = ["/v/bin/python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]
    account.charge(7, Sample(start=900, ticks=40, comm="python", cmdline=["/v/bin/python", "-m", "x"]), True)
    account.charge(10, Sample(start=1000, ticks=20, comm="python", cmdline=spawn), False)
    assert account.ticks["multiprocessing child"] == 20
    account.charge(10, Sample(start=1000, ticks=50, comm="VLLM::Worker", cmdline=spawn), False)
    account.charge(7, Sample(start=900, ticks=55, comm="python", cmdline=["/v/bin/python", "-m", "x"]), False)
    assert (account.ticks["multiprocessing child"], account.ticks["vLLM worker"]) == (0, 50)
    assert account.ticks["other Python"] == 15  # what it spent since the profile began, not before
    account.charge(7, Sample(start=1200, ticks=3, comm="python", cmdline=["/v/bin/python", "-m", "y"]), False)
    assert account.labels[("other Python", "-m y")] == 3 and account.labels[("other Python", "-m x")] == 15
    boot = 1_000_000.0
    account.settle([Ended(pid=10, ppid=1, began=int(boot + 1000 / profiler["TICK"]), ticks=65, comm="VLLM::Worker"),
                    Ended(pid=11, ppid=10, began=int(boot + 11), ticks=4, comm="sh")], boot)
    assert account.ticks["vLLM worker"] == 65  # the ticks after its last read, from the kernel's record
    assert account.labels[("ended before a read", "sh (started by vLLM worker)")] == 4
    # the kernel's ticks are samples and can fall short of what the reads charged (the cores busy): nothing is taken
    # back from what was read, and the process is not charged a second time under its name
    account.settle([Ended(pid=7, ppid=1, began=int(boot + 1200 / profiler["TICK"]), ticks=1, comm="python")], boot)
    assert account.labels[("other Python", "-m y")] == 3 and account.ticks["ended before a read"] == 4


def test_a_process_is_charged_by_what_it_runs(profiler):
    kind_of = profiler["kind_of"]
    py = "/work/x/.venv/bin/python"
    assert kind_of("VLLM::EngineCor", [py, "-c", "from multiprocessing.spawn import spawn_main"]) == (
        "vLLM engine core", "engine core")
    assert kind_of("python", [py, "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"])[0] == (
        "multiprocessing child")
    assert kind_of("python", [py, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]) == (
        "vLLM server", "API server")
    assert kind_of("python", [py, "-m", "llmtrial.serve.vllm_bench", "--worker"])[0] == "benchmark client"
    assert kind_of("python", [py, "/work/x/.venv/bin/snakemake", "--cores", "all"])[0] == "snakemake"
    assert kind_of("python", [py, "/t/w/.snakemake/scripts/tmpab12cd34.run_trial.py"]) == (
        "snakemake job script", "run_trial.py")
    assert kind_of("python", [py, "-m", "snakemake", "--snakefile", "Snakefile"])[0] == "snakemake"
    assert kind_of("python", [py, "-c", "import sys;exec(eval(sys.stdin.readline()))"])[0] == "pytest"
    assert kind_of("[pytest-xdist r", ["[pytest-xdist running] tests/x.py::test_y"])[0] == "pytest"
    assert kind_of("cc1plus", ["/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus", "-quiet", "-I",
                               "/usr/include/python3.11"]) == ("other", "cc1plus")
