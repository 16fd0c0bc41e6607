"""The suite stops before its first test when the disk cannot hold the trials its tests run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

#: pytest collecting :data:`FILES` with TMPDIR on a 64 MiB tmpfs, mounted in a mount namespace of its own.
SMALL_DISK = 'mkdir -p "$1" && mount -t tmpfs -o size=64m llmtrial-small "$1" && TMPDIR="$1" exec "$2" -m pytest "${@:3}"'


#: A module of tests that run trials (mark ``workflow``) and one of tests that run none: collecting the whole
#: suite would say the same in ten times the time.
FILES = ("tests/workflow/test_catalog.py", "tests/core/test_stats.py")


def collect_on_a_small_disk(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["unshare", "-m", "bash", "-c", SMALL_DISK, "bash", str(tmp_path / "small"), sys.executable,
            "-n", "0", "-q", "-p", "no:cacheprovider", "--collect-only", *args, *FILES]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    if "unshare" in done.stderr and done.returncode != 0 and "preflight" not in done.stdout:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()[-200:]}")
    return done


def test_a_disk_too_full_for_the_trials_stops_the_suite_naming_the_filesystem_and_what_is_short(tmp_path):
    done = collect_on_a_small_disk(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 3, out
    assert "the trials these tests run would fail their preflight's disk check" in out
    assert f"{tmp_path / 'small'} (tests' trials): needs 2.00 GiB" in out and "short by" in out


def test_tests_that_run_no_trial_are_not_stopped_by_a_small_disk(tmp_path):
    done = collect_on_a_small_disk(tmp_path, "-m", "not e2e and not workflow")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests collected" in done.stdout and "test_catalog" not in done.stdout
