"""A vLLM server's own folder for its IPC sockets, removed with the server.

vLLM's processes talk over ZMQ ``ipc://`` sockets made in ``VLLM_RPC_BASE_PATH`` (the system
temporary folder by default), and a server stopped by its process group, as every trial stops
one, leaves them there: seven socket files a start-up of the CPU build, none ever removed. Each
server the trial starts gets a folder of its own for them instead (:func:`scratch_folder`, named
in the ledger before it is made), removed once the server is stopped, by the job or, from the
ledger alone, by cleanup (:func:`remove_scratch`). The folder sits in the system temporary
folder under a short name: a socket's path holds at most 107 bytes and vLLM adds 37 characters
to the folder's. A ``VLLM_RPC_BASE_PATH`` the operator set (the environment, or the
configuration's ``env``) is left as it is.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

RPC_ENV = "VLLM_RPC_BASE_PATH"
PREFIX = "llmtrial-vllm-"


def scratch_folder(env: Mapping[str, str]) -> Path | None:
    """The folder a server with this environment (its configuration's ``env``) gets for its sockets, not yet
    made; None where the operator chose where they go."""
    if RPC_ENV in env or RPC_ENV in os.environ:
        return None
    return Path(tempfile.gettempdir()) / f"{PREFIX}{secrets.token_hex(4)}"


def make_scratch(folder: Path) -> None:
    """Make the folder (this user's alone); an existing one is an error, never shared."""
    folder.mkdir(mode=0o700)


def remove_scratch(folder: str | os.PathLike[str] | None) -> bool:
    """Remove a server's folder and what its processes left in it; whether it is gone."""
    if folder is None:
        return True
    shutil.rmtree(folder, ignore_errors=True)
    return not os.path.lexists(folder)
