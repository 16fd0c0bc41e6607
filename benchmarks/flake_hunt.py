"""A flake hunt: run chosen test files N times, optionally with CPU cores kept busy, and count each test's passes.

    python benchmarks/flake_hunt.py [--runs N] [--busy K] [--workers W] [--mark EXPR] [--out DIR] [--resume] [FILE ...]

With no FILE, the files are every test file that holds a test marked ``e2e``, ``workflow`` or
``hostwide`` (the real-vLLM trials, every test that runs snakemake, and those that change or watch
the whole machine: its SLURM, its network namespaces, the installed vLLM), as pytest collects them. Each run is one pytest
process over all the files (``-n W`` pytest-xdist workers as ``make test`` runs them, default 2), its
outcomes read from the JUnit XML file pytest writes into DIR. After each run, every process still running
below the hunt once pytest has ended (and a settling moment more) is listed and stopped: the hunt is the
subreaper of what it starts, so a server whose parent died is found too; a run that left one fails the hunt.
The installed vLLM's files are checked against its RECORD before the hunt and after each run: a run that
left a patch applied fails the hunt and ends it (the runs after would fail on it, not on their own). With ``--busy K``, K plain CPU hogs
(``while True: pass``, each its own process group) run for the whole hunt and are stopped at its end,
also when it is interrupted (Ctrl-C or SIGTERM: the running pytest gets SIGINT, as Ctrl-C, so its
fixtures tear down what they set up, and every process still below it is then stopped) or a run fails. Prints every test with its pass count (those that ever
failed first, each with the runs it failed in and the first line of its failure) and exits 1 when any
test failed once.

Each run also writes ``run-N.json``: the commit it ran at, the files, ``--busy``, ``--workers``, ``--mark``
and how long it took. A hunt longer than one sitting goes on with ``--resume``: the runs already in DIR
count, and only the rest are run. It is refused, naming the run and what differs, when a run in DIR
hunted other files or under other settings, or ran code that differs from this checkout's (the tests,
the library, the requirement sets: ``git diff`` between its commit and this checkout), and where it or
this checkout has such changes not committed. A hunt without ``--resume`` starts afresh and removes the
runs in DIR first.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
HOG = "while True: pass"
#: What a run's outcome depends on: a resumed hunt counts an earlier run only where none of these differ.
TESTED = ("tests", "workflow", "envs", "pyproject.toml", "Makefile")


@dataclass
class Tally:
    """One test's outcomes over the runs."""

    outcomes: list[str] = field(default_factory=list)
    failures: list[tuple[int, str]] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return self.outcomes.count("passed")


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[list[int]]:
    """``count`` CPU hogs, each in its own session, killed by process group on the way out."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True) for _ in range(count)]
    try:
        yield [h.pid for h in hogs]
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()


#: prctl(2)'s PR_SET_CHILD_SUBREAPER (linux/prctl.h).
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Make this process the reaper of every process orphaned below it (Linux): a server or a snakemake whose
    parent a run's end killed is reparented here, not to init, so :func:`left_below` still finds it. It then
    reaps them as init would (:func:`wait_reaping`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_reaping(proc: subprocess.Popen) -> int:
    """Wait for ``proc``, reaping every other child of the hunt that ends meanwhile, as init would: being the
    subreaper, the hunt becomes the parent of the daemons the tests start (slurmstepd, munged: they fork
    away from their parent), and one left unreaped stays a zombie whose pid still exists, so a test that
    waits for such a daemon to be gone failed."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode


def left_below(keep: set[int], settle: float) -> list[psutil.Process]:
    """This process's descendants (those orphaned below it included) but ``keep`` that are still there after
    ``settle`` seconds: a benchmark worker ends by itself a moment after its snakemake, say."""
    deadline = time.monotonic() + settle
    while True:
        below = [proc for proc in psutil.Process().children(recursive=True) if proc.pid not in keep]
        live = [proc for proc in below if running(proc)]
        psutil.wait_procs([proc for proc in below if proc not in live], timeout=0)  # reap the ended
        if not live or time.monotonic() >= deadline:
            return live
        time.sleep(0.5)


def describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:160]}"
    return f"pid {proc.pid} (ended)"


def terminate(procs: list[psutil.Process], wait: float) -> list[psutil.Process]:
    """SIGTERM each; those still running after ``wait`` seconds."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    return psutil.wait_procs(procs, timeout=wait)[1]


def is_snakemake(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return any(Path(arg).name == "snakemake" for arg in proc.cmdline()[:3])
    return False


def stop_tree(pid: int, keep: set[int], grace: float = 10.0, teardown: float = 180.0, settle: float = 15.0,
              cleanup: float = 180.0) -> list[str]:
    """Stop a pytest run in its own process group and every process below it (servers in sessions of their
    own, and what was orphaned below this process, included); what was still running after pytest ended
    (and ``settle`` seconds more), as ``pid: argv`` lines.

    A pytest still running gets SIGINT to its group first, as Ctrl-C in a terminal, so the controller and its
    xdist workers run their fixtures' teardowns (a SLURM cluster, network namespaces, a patched vLLM are
    undone by the fixture that made them) for up to ``teardown`` seconds. An xdist worker goes on with the
    tests already sent to it, so a pytest still there after that is stopped itself (SIGTERM), before it starts
    another trial. Then each snakemake left gets SIGTERM and up to ``cleanup`` seconds: a trial's snakemake
    stopped so gives its host back (servers stopped, patches reverted, services restored); killing it
    instead left vLLM patched for the runs after. Everything still left then gets SIGTERM, and SIGKILL after
    ``grace`` seconds."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGINT)
        try:
            root.wait(teardown)
        except psutil.TimeoutExpired:
            terminate([root, *root.children()], grace)  # the controller and its workers
    left = left_below(keep, settle)
    found = [describe(proc) for proc in left]
    terminate([proc for proc in left if is_snakemake(proc)], cleanup)
    rest = left_below(keep, 0)
    for proc in terminate(rest, grace):
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(rest, timeout=grace)
    return found


def as_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # SIGTERM runs the same ``finally`` blocks as Ctrl-C


def marked_files(mark: str) -> list[str]:
    """The test files that hold a test selected by ``mark``, as pytest collects them."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", mark, "tests"], cwd=REPO, capture_output=True, text=True, check=False)
    files = {line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line}
    if not files:
        raise SystemExit(f"flake_hunt: no test selected by -m {mark!r}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return sorted(files)


def test_id(case: ET.Element) -> str:
    """pytest's id of a JUnit test case: its file, its class where it has one, its name."""
    classname, file = case.get("classname", ""), case.get("file")
    if not file:
        return f"{classname.replace('.', '/')}.py::{case.get('name')}"
    module = file.removesuffix(".py").replace("/", ".")
    cls = classname.removeprefix(module).lstrip(".")
    return "::".join(part for part in (file, cls, case.get("name")) if part)


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Each test's outcome in one JUnit XML file: passed, failed, error or skipped, and the failure's first line."""
    found: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = test_id(case)
        state, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                state = "failed" if tag == "failure" else tag
                message = (node.get("message") or node.text or "").strip().splitlines()[0][:200] if tag != "skipped" else ""
                break
        # a setup error and a call failure of one test come as two cases: keep the worse
        if found.get(name, ("passed", ""))[0] == "passed" or state in ("failed", "error"):
            found[name] = (state, message)
    return found


def vllm_changed() -> list[str]:
    """The installed vLLM's Python files that differ from its RECORD: a patch a run left applied, which every
    run after would fail on (the trial's `snakemake cleanup`, from its ledger, reverts it)."""
    from llmtrial.patch.patchdata import record_of, verify_files, vllm_distribution

    dist = vllm_distribution()
    python = [path for path, expected in record_of(dist).items() if expected and path.endswith(".py")]
    return sorted(f["path"] for f in verify_files(python, dist) if not f["matches"])


def git(*argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=True).stdout


def checkout() -> tuple[str, list[str]]:
    """This checkout's commit, and the tested files it has changed without committing them."""
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *TESTED)
    return git("rev-parse", "HEAD").strip(), [line[3:] for line in dirty.splitlines()]


def settings(files: list[str], args: argparse.Namespace) -> dict:
    """What makes two runs the same hunt: a run's record holds these, its commit and its own figures."""
    return {"files": files, "busy": args.busy, "workers": args.workers, "mark": args.mark}


def earlier_runs(out: Path, wanted: dict, commit: str, uncommitted: list[str]) -> list[dict]:
    """The runs a resumed hunt counts, in order (``run-1.json`` ...); refused, naming the run, where one
    hunted otherwise or ran other code than ``commit``, and where a run or this checkout had tested files
    changed without a commit (what ran could not be told)."""
    if uncommitted:
        raise SystemExit(f"flake_hunt: --resume needs the tested code committed: {', '.join(uncommitted)}")
    runs = []
    while (meta := out / f"run-{len(runs) + 1}.json").exists():
        run = json.loads(meta.read_text())
        for key, value in wanted.items():
            if run[key] != value:
                raise SystemExit(f"flake_hunt: {meta} ran with {key}={run[key]!r}, this hunt with {value!r}: "
                                 "start afresh (without --resume) or hunt as it did")
        if run["uncommitted"]:
            raise SystemExit(f"flake_hunt: {meta} ran with uncommitted changes ({', '.join(run['uncommitted'])}): "
                             "start afresh (without --resume)")
        changed = git("diff", "--name-only", run["commit"], commit, "--", *TESTED).split()
        if changed:
            raise SystemExit(f"flake_hunt: {meta} ran at {run['commit'][:12]}, whose tested code differs from "
                             f"this checkout's ({commit[:12]}): {', '.join(changed)}")
        if not (out / f"run-{run['index']}.xml").exists():
            raise SystemExit(f"flake_hunt: {meta} has no run-{run['index']}.xml beside it")
        runs.append(run)
    return runs


def fresh(out: Path) -> None:
    """A hunt without --resume: the runs an earlier hunt left in ``out`` are removed, never counted."""
    for old in out.glob("run-*"):
        if old.suffix in (".xml", ".log", ".json"):
            old.unlink()


@dataclass
class Run:
    """One run's outcomes (test id: state, first line of its failure), minutes, pytest's exit status and the
    processes still running below the hunt after pytest ended (``pid: argv``; stopped since)."""

    found: dict[str, tuple[str, str]]
    minutes: float
    rc: int
    left: list[str]


def run_once(index: int, files: list[str], args: argparse.Namespace, keep: set[int]) -> Run:
    junit = args.out / f"run-{index}.xml"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "junit_family=xunit1", "--durations=30",
            f"--junitxml={junit}", "-n", str(args.workers), *files]
    if args.mark:
        argv += ["-m", args.mark]
    started = time.monotonic()
    with (args.out / f"run-{index}.log").open("w") as log:
        pytest = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = wait_reaping(pytest)
        finally:
            left = stop_tree(pytest.pid, keep)  # the hunt leaves no pytest, snakemake or vLLM server behind
            if left:
                print(f"run {index}: {len(left)} processes still running after pytest ended, stopped:",
                      *left, sep="\n    ", flush=True)
    took = time.monotonic() - started
    if not junit.exists():
        raise SystemExit(f"flake_hunt: run {index} wrote no {junit} (pytest exit {rc}); see {junit.with_suffix('.log')}")
    return Run(outcomes(junit), round(took / 60, 1), rc, left)


def report(tallies: dict[str, Tally], runs: int) -> list[str]:
    flaky = sorted(t for t, tally in tallies.items() if tally.failures)
    lines = [f"{len(tallies)} tests, {runs} runs: {len(flaky)} failed at least once"]
    for test in flaky + sorted(t for t in tallies if t not in flaky):
        tally = tallies[test]
        skipped = tally.outcomes.count("skipped")
        lines.append(f"{tally.passed}/{len(tally.outcomes)} passed" + (f" ({skipped} skipped)" if skipped else "") + f"  {test}")
        lines.extend(f"    run {run}: {message}" for run, message in tally.failures)
    return lines


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="test files (default: every file with an e2e, workflow or hostwide test)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--busy", type=int, default=1, help="CPU cores kept busy by a hog for the whole hunt (0: none)")
    p.add_argument("--workers", type=int, default=2, help="pytest-xdist workers, as make test runs (0: one process)")
    p.add_argument("--mark", default="", help="a -m expression passed to each run (default: every test in the files)")
    p.add_argument("--out", type=Path, default=REPO / "flake-hunt", help="where each run's JUnit XML and log go")
    p.add_argument("--resume", action="store_true", help="count the runs already in --out and run only the rest")
    return p.parse_args(argv)


def tally_run(tallies: dict[str, Tally], index: int, found: dict[str, tuple[str, str]]) -> int:
    """Add one run's outcomes; how many of its tests failed."""
    for test, (state, message) in found.items():
        tally = tallies.setdefault(test, Tally())
        tally.outcomes.append(state)
        if state in ("failed", "error"):
            tally.failures.append((index, message))
    return sum(1 for state, _ in found.values() if state in ("failed", "error"))


def run_line(run: dict, bad: int, tests: int) -> str:
    changes = f" with uncommitted changes to {len(run['uncommitted'])} files" if run["uncommitted"] else ""
    left = run.get("left_running")  # absent from the runs of a hunt before the hunt looked
    after = "not looked for" if left is None else str(len(left))
    return (f"run {run['index']}: {tests} tests, {bad} failed, pytest exit {run['exit']}, {run['minutes']:.1f} min, "
            f"at {run['commit'][:12]}{changes}, started {run['started']}; processes left running: {after}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, as_exit)
    # Ctrl-C as Python's own, also where the hunt was started in the background of a shell without job control,
    # which starts it with SIGINT ignored: ignored, SIGINT would be ignored by the pytest it starts too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args.out.mkdir(parents=True, exist_ok=True)
    commit, uncommitted = checkout()
    files = args.files or marked_files("e2e or workflow or hostwide")
    wanted = settings(files, args)
    done = earlier_runs(args.out, wanted, commit, uncommitted) if args.resume else []
    if not args.resume:
        fresh(args.out)
    print(f"flake hunt: {len(files)} files, {args.runs} runs ({len(done)} already in {args.out}), "
          f"{args.busy} core(s) busy, -n {args.workers}", flush=True)
    tallies: dict[str, Tally] = {}
    runs = []
    for run in done:
        found = outcomes(args.out / f"run-{run['index']}.xml")
        print(run_line(run, tally_run(tallies, run["index"], found), len(found)) + " (counted)", flush=True)
        runs.append(run)
    if changed := vllm_changed():
        raise SystemExit(f"flake_hunt: the installed vLLM differs from its RECORD before the hunt: {', '.join(changed)}")
    adopt_orphans()
    with busy_cores(args.busy) as hogs:
        for index in range(len(done) + 1, args.runs + 1):
            started = time.strftime("%Y-%m-%d %H:%M:%S")
            result = run_once(index, files, args, set(hogs))
            changed = vllm_changed()
            run = {**wanted, "index": index, "commit": commit, "uncommitted": uncommitted, "started": started,
                   "minutes": result.minutes, "exit": result.rc, "left_running": result.left, "vllm_changed": changed}
            (args.out / f"run-{index}.json").write_text(json.dumps(run, indent=1))
            print(run_line(run, tally_run(tallies, index, result.found), len(result.found)), flush=True)
            runs.append(run)
            if changed:  # the runs after would fail on it, not on their own
                print(f"run {index} left the installed vLLM differing from its RECORD: {', '.join(changed)}; "
                      "the hunt stops here", flush=True)
                break
    lines = report(tallies, len(runs))
    print("\n".join(lines))
    summary = {test: {"outcomes": t.outcomes, "failures": t.failures} for test, t in tallies.items()}
    (args.out / "summary.json").write_text(json.dumps({**wanted, "runs": [{k: r.get(k) for k in ("index", "commit", "uncommitted",
                                                       "started", "minutes", "exit", "left_running")} for r in runs], "tests": summary}, indent=1))
    left = [run["index"] for run in runs if run.get("left_running") or run.get("vllm_changed")]
    if left:
        print(f"runs that left processes running or vLLM changed: {', '.join(map(str, left))}")
    return 1 if left or any(t.failures for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
