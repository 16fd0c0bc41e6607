"""Staging from the Hugging Face Hub: commit, headroom, download, verification, resume.

The stage is safe to interrupt and to rerun:

* A branch or tag is resolved to its commit first; everything after uses the commit.
* What is still to fetch is sized from the Hub's file tree (a staged file that verifies is
  not counted again) and checked against every filesystem the stage writes to, before the
  first byte. A short disk raises :class:`llmtrial.host.disk.HeadroomError` with needed and free
  bytes.
* Files are fetched with huggingface_hub into the staging folder itself (``local_dir``);
  a file appears there only once complete. Temporary files a killed run left behind are
  removed first, under a lock on the folder.
* Every file is checked against the Hub's metadata: size, sha256 for LFS files, the git
  blob sha1 for the others. A file that fails is removed (a server must not load it) and
  the stage fails naming it. Verified files are remembered by size, mtime and inode, so a
  rerun does not hash hundreds of gigabytes again.
* Dropped connections and 5xx answers are retried per file with backoff: huggingface_hub
  2.4 retries a broken body only for some errors (not a connection reset, not a 503 on
  GET) and never across processes.

The access token is whatever huggingface_hub reads (``HF_TOKEN``); this module never
reads, logs or records its value, only whether one was set.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from llmtrial.core.fileio import atomic_write_text, file_digest
from llmtrial.core.record_base import Maybe, RecordModel
from llmtrial.core.record_models import ManifestFile
from llmtrial.core.units import human_bytes
from llmtrial.weights.manifest import visible_files

log = logging.getLogger(__name__)

#: Remembers which staged files verified (path -> size, mtime_ns, inode, sha256, blob id).
VERIFIED_NAME = ".llmtrial-verified.json"
#: Where huggingface_hub keeps a local_dir download's metadata and temporary files.
DOWNLOAD_META = Path(".cache") / "huggingface" / "download"
#: Prefix of a file being copied into place (see weights.copy_verified); removed as an orphan.
PARTIAL_PREFIX = ".llmtrial-partial-"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class HubError(RuntimeError):
    """The Hub could not give what the stage needs; the message says what and why."""


class VerificationError(RuntimeError):
    """A fetched or copied file does not match its expected size or hash."""


class FetchRetry(RecordModel):
    """One failed try of a file that was tried again (the manifest's ``fetch.retries``)."""

    file: str
    attempt: int
    error: str = Field(description="The exception's type.")
    detail: str = Field(description="Its first line, at most 200 characters.")
    wait_s: float


class FetchFigures(RecordModel):
    """What staging fetched, copied or reused (the manifest's ``fetch``): each path sets the figures it has."""

    files_copied: Maybe[int] = Field(None, description="Restaged from an archive: files copied.")
    bytes_copied: Maybe[int] = None
    files_downloaded: int = 0
    bytes_downloaded: int = 0
    reused: Maybe[bool] = Field(None, description="A staged copy verified: nothing was fetched.")
    seconds: Maybe[float] = None
    bytes_per_s: float | None = None
    retries: Maybe[list[FetchRetry]] = None
    files_reused: Maybe[int] = Field(None, description="Files already staged and verified.")
    corrupt_removed: Maybe[int] = Field(None, description="Staged files removed because they failed verification.")
    restaged_from: Maybe[str] = Field(None, description="The archive the files were copied from.")
    orphans_removed: Maybe[int] = Field(None, description="Partial files an interrupted run had left.")


class FileStamp(BaseModel):
    """What identifies a file unchanged since it verified."""

    size: int
    mtime_ns: int
    ino: int


class VerifiedEntry(BaseModel):
    """A staged file that verified: its stamp then, its sha256 and the Hub's blob id."""

    stamp: FileStamp
    sha256: str
    blob_id: str | None = None


#: The folder's :data:`VERIFIED_NAME` file: path relative to the folder -> its entry.
_VERIFIED = TypeAdapter(dict[str, VerifiedEntry])


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository at a commit, as the Hub's tree describes it."""

    path: str
    size: int
    blob_id: str
    sha256: str | None  # LFS files only


def _endpoint() -> str:
    """The Hub endpoint requests go to: ``HF_ENDPOINT`` as huggingface_hub read it."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def endpoint() -> str:
    """The Hub endpoint for messages and records, without any credentials in it."""
    from huggingface_hub import constants

    parts = urlsplit(constants.ENDPOINT)
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl() \
        if parts.hostname else constants.ENDPOINT


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def token_state() -> str:
    """Whether a token is configured, never its value."""
    from huggingface_hub import get_token

    return "set (from the environment or the token file)" if get_token() else "none"


def _describe(exc: BaseException, repo_id: str, revision: str) -> str:
    from huggingface_hub import errors

    where = f"{repo_id}@{revision} at {endpoint()}"
    if isinstance(exc, errors.GatedRepoError):
        return f"{where}: the repository is gated; accept its terms and set HF_TOKEN"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return f"{where}: repository not found, or HF_TOKEN lacks access to it"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{where}: revision {revision!r} not found"
    return f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def unreachable(exc: BaseException) -> bool:
    """The Hub did not answer at all (connection refused, DNS, timeout, offline mode)."""
    from huggingface_hub import errors

    if isinstance(exc, (errors.OfflineModeIsEnabled, ConnectionError, TimeoutError)):
        return True
    return type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore") and (
        "Connect" in type(exc).__name__ or "Timeout" in type(exc).__name__)


def retryable(exc: BaseException) -> bool:
    """Worth another try: a dropped or reset connection, a timeout, a 5xx or 429, a short body."""
    from huggingface_hub import errors

    if isinstance(exc, errors.HfHubHTTPError):
        response = getattr(exc, "response", None)
        return response is not None and response.status_code in RETRY_STATUS
    if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
        return True
    return isinstance(exc, (ConnectionError, TimeoutError)) or "Consistency check failed" in str(exc)


def resolve_commit(repo_id: str, revision: str) -> str:
    """The commit ``revision`` (a branch, tag or commit) names. A commit needs no request."""
    if COMMIT.match(revision):
        return revision
    from huggingface_hub import HfApi

    try:
        sha = HfApi(endpoint=_endpoint()).repo_info(repo_id, revision=revision).sha
    except Exception as exc:
        if unreachable(exc):
            raise
        raise HubError(f"cannot resolve {_describe(exc, repo_id, revision)}") from None
    if not sha or not COMMIT.match(sha):
        raise HubError(f"{repo_id}@{revision} at {endpoint()}: the Hub gave no commit for this revision")
    return sha


def list_files(repo_id: str, commit: str, *, allow_patterns: Sequence[str] | None = None,
               ignore_patterns: Sequence[str] | None = None) -> list[RemoteFile]:
    """The repository's files at ``commit`` selected by the patterns, sorted by path."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    try:
        entries = [e for e in HfApi(endpoint=_endpoint()).list_repo_tree(repo_id, revision=commit, recursive=True)
                   if isinstance(e, RepoFile)]
    except Exception as exc:
        raise HubError(f"cannot list the files of {_describe(exc, repo_id, commit)}") from None
    chosen = filter_repo_objects(entries, allow_patterns=list(allow_patterns) if allow_patterns else None,
                                 ignore_patterns=list(ignore_patterns) if ignore_patterns else None,
                                 key=lambda e: e.path)
    files = [RemoteFile(e.path, int(e.size), e.blob_id, e.lfs.sha256 if e.lfs else None) for e in chosen]
    if not files:
        raise HubError(f"{repo_id}@{commit}: no file matches allow_patterns={allow_patterns} "
                       f"ignore_patterns={ignore_patterns}")
    return sorted(files, key=lambda f: f.path)


def fetch_config(repo_id: str, revision: str) -> dict[str, Any] | None:
    """The repository's config.json alone (for the planner, before the weights are staged),
    or None with the reason logged when the Hub cannot give it."""
    from huggingface_hub import hf_hub_download

    if offline():
        log.warning("no config.json for %s@%s: HF_HUB_OFFLINE is set and no archive holds it", repo_id, revision)
        return None
    try:
        path = hf_hub_download(repo_id, "config.json", revision=revision, endpoint=_endpoint())
        return dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except Exception as exc:  # the plan says "unknown" rather than stop the trial
        log.warning("no config.json for %s", _describe(exc, repo_id, revision))
        return None


def weight_files(files: Sequence[RemoteFile]) -> list[RemoteFile]:
    """The files vLLM loads weights from: the top-level ``*.safetensors`` (without a Mistral
    ``consolidated`` copy beside sharded ones), else the top-level ``*.bin``/``*.pt``; files in
    subfolders (``original/`` and the like) are not loaded."""
    top = [f for f in files if "/" not in f.path]
    safetensors = [f for f in top if f.path.endswith(".safetensors")]
    sharded = [f for f in safetensors if not f.path.startswith("consolidated")]
    if safetensors:
        return sharded or safetensors
    return [f for f in top if f.path.endswith((".bin", ".pt")) and "training_args" not in f.path]


def weight_bytes(repo_id: str, revision: str, *, allow_patterns: Sequence[str] | None = None,
                 ignore_patterns: Sequence[str] | None = None) -> tuple[int, str] | None:
    """(bytes, where the figure came from) of the weight files the stage would fetch, from the
    Hub's file listing at the resolved commit: nothing is downloaded. None, with the reason
    logged, when the Hub cannot say."""
    if offline():
        return None
    try:
        commit = resolve_commit(repo_id, revision)
        chosen = weight_files(list_files(repo_id, commit, allow_patterns=allow_patterns,
                                         ignore_patterns=ignore_patterns))
    except Exception as exc:  # the planner falls back to an estimate, labelled as one
        log.warning("no weight sizes for %s@%s from the Hub: %s", repo_id, revision, exc)
        return None
    if not chosen:
        return None
    return sum(f.size for f in chosen), (f"Hub file sizes of {repo_id}@{commit[:12]} ({len(chosen)} weight files, "
                                         f"{human_bytes(sum(f.size for f in chosen))})")


# --------------------------------------------------------------------------- verification


def hash_file(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, read once."""
    sha1 = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    return file_digest(path, also=[sha1]).hexdigest(), sha1.hexdigest()


def mismatch(path: Path, remote: RemoteFile) -> tuple[str | None, str]:
    """(problem or None, sha256) of a local file against what the Hub says it holds."""
    size = path.stat().st_size
    if size != remote.size:
        return f"{remote.path}: {size:,} bytes, the Hub says {remote.size:,}", ""
    sha256, sha1 = hash_file(path)
    if remote.sha256 and sha256 != remote.sha256:
        return f"{remote.path}: sha256 {sha256}, the Hub says {remote.sha256}", sha256
    if not remote.sha256 and sha1 != remote.blob_id:
        return f"{remote.path}: git blob sha1 {sha1}, the Hub says {remote.blob_id}", sha256
    return None, sha256


class VerifiedFiles:
    """The staging folder's memory of files that verified, keyed by size, mtime and inode."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / VERIFIED_NAME
        self.lock = threading.Lock()
        try:
            self.entries = _VERIFIED.validate_json(self.path.read_bytes())
        except (OSError, ValidationError):
            self.entries = {}

    @staticmethod
    def _stamp(file: Path) -> FileStamp:
        st = file.stat()
        return FileStamp(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino)

    def sha256(self, rel: str, file: Path, *, blob_id: str | None = None, sha256: str | None = None) -> str | None:
        """The remembered sha256 if ``file`` is unchanged since it verified (and matches the
        expected hash or blob id when given), else None."""
        entry = self.entries.get(rel)
        if entry is None or not file.is_file() or self._stamp(file) != entry.stamp:
            return None
        if (sha256 and entry.sha256 != sha256) or (blob_id and entry.blob_id not in (None, blob_id)):
            return None
        return entry.sha256

    def add(self, rel: str, file: Path, sha256: str, blob_id: str | None = None) -> None:
        with self.lock:
            self.entries[rel] = VerifiedEntry(stamp=self._stamp(file), sha256=sha256, blob_id=blob_id)
            atomic_write_text(self.path, json.dumps(_VERIFIED.dump_python(self.entries), sort_keys=True))

    def forget(self, rel: str) -> None:
        with self.lock:
            self.entries.pop(rel, None)


# --------------------------------------------------------------------------- locking and leftovers


@contextmanager
def stage_lock(folder: Path) -> Iterator[None]:
    """One stage at a time per staging folder (a lock file next to it)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock_path = folder.parent / f".{folder.name}.lock"
    with lock_path.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise HubError(f"another stage is writing into {folder} ({fh.read().strip() or 'lock held'}); "
                           f"wait for it or stop it") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def remove_orphans(folder: Path) -> tuple[int, int]:
    """Remove temporary files an interrupted download or copy left (huggingface_hub's
    ``*.incomplete``, our partial copies); returns (files, bytes). Call under the lock."""
    meta = folder / DOWNLOAD_META
    count = size = 0
    leftovers = [*meta.rglob("*.incomplete")] if meta.is_dir() else []
    leftovers += [*folder.rglob(f"{PARTIAL_PREFIX}*")] if folder.is_dir() else []
    for file in leftovers:
        if file.is_file() and not file.is_symlink():
            size += file.stat().st_size
            file.unlink()
            count += 1
    if count:
        log.info("removed %d partial file(s) (%s) an interrupted run left in %s", count, human_bytes(size), folder)
    return count, size


def forget_download(folder: Path, rel: str) -> None:
    """Remove a staged file and huggingface_hub's metadata for it, so it is fetched again."""
    (folder / rel).unlink(missing_ok=True)
    (folder / DOWNLOAD_META / f"{rel}.metadata").unlink(missing_ok=True)


# --------------------------------------------------------------------------- progress


class Progress:
    """Logs bytes done, rate and time left every ``interval`` seconds while files download.
    Bytes in flight are read from the sizes of huggingface_hub's temporary files."""

    def __init__(self, folder: Path, label: str, total: int, files: int, interval: float) -> None:
        self.folder, self.label, self.total, self.files, self.interval = folder, label, total, files, interval
        self.done_bytes = self.done_files = 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-progress", daemon=True)
        self.lines = 0

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def file_done(self, size: int) -> None:
        self.done_bytes += size
        self.done_files += 1

    def in_flight(self) -> int:
        meta = self.folder / DOWNLOAD_META
        total = 0
        if meta.is_dir():
            for file in meta.rglob("*.incomplete"):
                with suppress(FileNotFoundError):
                    total += file.stat().st_size
        return total

    def line(self) -> str:
        done = min(self.done_bytes + self.in_flight(), self.total)
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = done / elapsed
        left = f"about {(self.total - done) / rate:,.0f} s left" if rate > 0 else "time left unknown"
        share = 100.0 * done / self.total if self.total else 100.0
        return (f"staging {self.label}: {human_bytes(done)} of {human_bytes(self.total)} ({share:.1f} %), "
                f"{human_bytes(rate)}/s, {left}; {self.done_files} of {self.files} files")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            log.info("%s", self.line())
            self.lines += 1


# --------------------------------------------------------------------------- download


def fetch_file(repo_id: str, commit: str, remote: RemoteFile, folder: Path, *, retries: int,
               backoff_s: float, attempts_log: list[FetchRetry]) -> str:
    """Download one file into ``folder`` (retrying what is worth retrying) and verify it;
    returns its sha256. A file that fails verification is removed and raises."""
    from huggingface_hub import hf_hub_download

    for attempt in range(1, retries + 2):
        try:
            hf_hub_download(repo_id, remote.path, revision=commit, local_dir=folder, endpoint=_endpoint())
            break
        except Exception as exc:
            if attempt > retries or not retryable(exc):
                raise HubError(f"cannot fetch {remote.path}: {_describe(exc, repo_id, commit)}") from None
            wait = min(backoff_s * 2 ** (attempt - 1), 30.0)
            attempts_log.append(FetchRetry(file=remote.path, attempt=attempt, error=type(exc).__name__,
                                           detail=str(exc).splitlines()[0][:200] if str(exc) else "", wait_s=wait))
            log.warning("fetching %s failed (%s, attempt %d of %d); retrying in %.1f s",
                        remote.path, type(exc).__name__, attempt, retries + 1, wait)
            time.sleep(wait)
    problem, sha256 = mismatch(folder / remote.path, remote)
    if problem:
        forget_download(folder, remote.path)
        raise VerificationError(f"{problem}; the file was removed from {folder} so no server loads it")
    return sha256


def download(repo_id: str, commit: str, files: Sequence[RemoteFile], folder: Path, verified: VerifiedFiles, *,
             max_workers: int, retries: int, backoff_s: float, progress_interval: float) -> FetchFigures:
    """Fetch ``files`` in parallel, verifying each as it lands; returns the fetch statistics.
    Raises the first failure after the other downloads have finished (completed files stay)."""
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # our own progress lines read better in a job log
    total = sum(f.size for f in files)
    attempts: list[FetchRetry] = []
    failures: list[Exception] = []
    started = time.monotonic()
    label = f"{repo_id}@{commit[:12]}"
    log.info("fetching %d file(s), %s, from %s into %s", len(files), human_bytes(total), endpoint(), folder)
    with Progress(folder, label, total, len(files), progress_interval) as progress, \
            ThreadPoolExecutor(max_workers=max(1, max_workers), thread_name_prefix="fetch") as pool:
        futures = {pool.submit(fetch_file, repo_id, commit, f, folder, retries=retries, backoff_s=backoff_s,
                               attempts_log=attempts): f for f in files}
        for future in as_completed(futures):
            remote = futures[future]
            try:
                sha256 = future.result()
            except (HubError, VerificationError, OSError) as exc:
                failures.append(exc)
                log.error("%s", exc)
                continue
            verified.add(remote.path, folder / remote.path, sha256, remote.blob_id)
            progress.file_done(remote.size)
            log.info("fetched and verified %s (%s)", remote.path, human_bytes(remote.size))
        final_line = progress.line()
    seconds = time.monotonic() - started
    if failures:  # files that completed stay staged and verified for the rerun
        kind = VerificationError if all(isinstance(e, VerificationError) for e in failures) else HubError
        raise kind("; ".join(sorted(str(e) for e in failures)))
    log.info("%s: done in %.1f s", final_line, seconds)
    return FetchFigures(files_downloaded=len(files), bytes_downloaded=total, seconds=round(seconds, 3),
                        bytes_per_s=round(total / seconds, 1) if seconds > 0 else None, retries=attempts)


def plan_fetch(folder: Path, files: Sequence[RemoteFile], verified: VerifiedFiles) -> tuple[list[RemoteFile], int]:
    """Which ``files`` still need fetching, and how many staged files were removed because
    they fail verification. A staged file verified before is trusted by its stamp; one the
    stage does not remember is hashed once."""
    todo: list[RemoteFile] = []
    removed = 0
    for remote in files:
        file = folder / remote.path
        if verified.sha256(remote.path, file, blob_id=remote.blob_id, sha256=remote.sha256):
            continue
        if file.is_file() and not file.is_symlink():
            problem, sha256 = mismatch(file, remote)
            if problem is None:
                verified.add(remote.path, file, sha256, remote.blob_id)
                continue
            log.warning("staged %s does not verify (%s): fetching it again", remote.path, problem)
            forget_download(folder, remote.path)
            verified.forget(remote.path)
            removed += 1
        todo.append(remote)
    return todo, removed


def stale_files(folder: Path, keep: set[str]) -> list[str]:
    """Visible files in ``folder`` that are not part of the selection (another revision's shards)."""
    if not folder.is_dir():
        return []
    return sorted(rel for rel in (f.relative_to(folder).as_posix() for f in visible_files(folder)) if rel not in keep)


def manifest_files(folder: Path, files: Sequence[RemoteFile], verified: VerifiedFiles) -> list[ManifestFile]:
    """The manifest's entries of ``files``, each verified in ``folder``."""
    out = []
    for remote in files:
        sha256 = verified.sha256(remote.path, folder / remote.path)
        if sha256 is None:
            raise VerificationError(f"{remote.path}: not verified in {folder}")
        out.append(ManifestFile(path=remote.path, size=remote.size, sha256=sha256, blob_id=remote.blob_id))
    return out

