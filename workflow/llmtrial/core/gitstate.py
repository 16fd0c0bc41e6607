"""The project checkout's state: its commit and whether its tracked files are changed (``git``, no shell)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT_S = 30


def _git(repo: Path, *args: str) -> tuple[str | None, str | None]:
    """(stdout, None) of ``git -C repo args...``, or (None, the reason it failed)."""
    git = shutil.which("git")
    if git is None:
        return None, "git is not installed"
    try:
        proc = subprocess.run([git, "-C", str(repo), *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"git {args[0]} failed: {exc}"
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()
        return None, f"git {args[0]} exited {proc.returncode}: {why[0] if why else 'no message'}"
    return proc.stdout, None


@dataclass(frozen=True)
class GitState:
    """``commit`` (HEAD), ``dirty`` (tracked files changed) and ``reason`` (why either is None: not a git
    checkout, git missing, no commit yet)."""

    commit: str | None
    dirty: bool | None
    reason: str | None


def git_state(repo: Path) -> GitState:
    """The checkout's commit and whether its tracked files are changed (:class:`GitState`)."""
    head, head_why = _git(repo, "rev-parse", "HEAD")
    status, status_why = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return GitState(commit=head.strip() if head else None, dirty=None if status is None else bool(status.strip()),
                    reason=head_why or status_why)
