"""A vLLM server's own temporary folder, removed with the server.

vLLM's processes talk over ZMQ ``ipc://`` sockets made in ``VLLM_RPC_BASE_PATH``, and the engine
meets its workers through a ``vllm_dist_<hex>`` file (torch's file store); both go to the system
temporary folder by default, and a server stopped by its process group, as every trial stops one,
leaves them there: seven socket files and one store file a start-up of the CPU build, none ever
removed. Each server the trial starts gets a folder of its own instead (:func:`scratch_for`,
named in the ledger before it is made), given to it as its ``TMPDIR`` and its
``VLLM_RPC_BASE_PATH``, and removed once the server is stopped, by the job
or, from the ledger alone, by cleanup (:func:`remove_scratch`). A headless rank on another node
gets one there (:data:`NODE_TMP`), made and removed by the program that starts and stops its
group (:mod:`llmtrial.onnode.process_group`). vLLM keeps nothing it reuses there:
its compile cache, with torch's inductor and Triton caches, lives under its cache root. The folder
sits in the system temporary folder under a short name: a socket's path holds at most 107 bytes
and vLLM adds 37 characters to the folder's. What the operator chose is left as it is: a
``VLLM_RPC_BASE_PATH`` in the environment or the configuration's ``env``, a ``TMPDIR`` in the
configuration's ``env``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

RPC_ENV = "VLLM_RPC_BASE_PATH"
TMP_ENV = "TMPDIR"
PREFIX = "llmtrial-vllm-"
#: Where a headless rank's folder goes on another node: every POSIX node has it, whatever ``TMPDIR`` a login there
#: sets, and its path is short.
NODE_TMP = "/tmp"


def _chosen(env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, bool]:
    """Which of the folder's variables the operator set: ``TMPDIR`` through the configuration's ``env`` (one the
    environment ``environ`` holds only says where temporary files go there, and the folder is made inside it),
    the sockets' folder there or in ``environ``."""
    return {TMP_ENV: TMP_ENV in env, RPC_ENV: RPC_ENV in env or RPC_ENV in environ}


def scratch_for(env: Mapping[str, str], *, environ: Mapping[str, str] = os.environ,
                base: str | None = None) -> tuple[Path | None, dict[str, str]]:
    """The folder a server gets, not yet made, in ``base`` (this host's temporary folder by default; on another
    node, :data:`NODE_TMP`), and the variables that send its temporary files and sockets there: those the
    operator did not choose. ``env`` is its configuration's ``env``, ``environ`` the environment it starts in
    besides. No folder where the operator chose both."""
    chosen = _chosen(env, environ)
    if all(chosen.values()):
        return None, {}
    folder = Path(base or tempfile.gettempdir()) / f"{PREFIX}{secrets.token_hex(4)}"
    return folder, {name: str(folder) for name, set_already in chosen.items() if not set_already}


def make_scratch(folder: Path) -> None:
    """Make the folder (this user's alone); an existing one is an error, never shared."""
    folder.mkdir(mode=0o700)


def remove_scratch(folder: str | os.PathLike[str] | None) -> bool:
    """Remove a server's folder and what its processes left in it; whether it is gone."""
    if folder is None:
        return True
    shutil.rmtree(folder, ignore_errors=True)
    return not os.path.lexists(folder)
