"""Host readiness before a configuration serves, one function for each step the quiet and patch
stages do and a configuration's job does again when a cleanup has undone them: quiet the
services (restoring first what an earlier run left changed), apply the trial's patches, take the
GPU census, and build the serving environment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrial.core.cleanup_model import QuietedService, QuietRecord
from llmtrial.core.configuration_model import GpuCensus
from llmtrial.core.ledger import Ledger
from llmtrial.core.preflight_model import SelectedGpu
from llmtrial.core.trial_config import PatchBlock
from llmtrial.host.gpus import launch_check, visible_devices_env
from llmtrial.host.services import quiet_host, quiet_needed
from llmtrial.lifecycle.cleanup import restore_first
from llmtrial.patch.patching import Patched, ensure_patched
from llmtrial.patch.plugin import server_env

log = logging.getLogger(__name__)


def quiet(results: Path, services: Mapping[str, Any], *, ports: Sequence[int], host: str) -> QuietRecord:
    """The quiet stage: restore first what an earlier run left changed (servers on ``ports``
    stopped, services started again), then quiet the trial's services; the quiet record."""
    restored = restore_first(results, ports=list(ports), host=host)
    return quiet_host(results, dict(services), restored_first=restored)


@dataclass
class Readiness:
    """What a configuration's job found and did before serving."""

    #: The services the job quieted again (None when the quiet stage's work still stood).
    requieted: list[QuietedService] | None
    #: :func:`llmtrial.patch.patching.ensure_patched`'s answer: the patches, the plugin folder, what was reapplied.
    patched: Patched
    #: The GPU census before launch and, when a foreign process holds a selected GPU, why the job stops.
    census: GpuCensus
    busy: str | None


def ready_host(*, results: Path, services: Mapping[str, Any], ports: Sequence[int], host: str,
               patches: Mapping[str, PatchBlock], ledger: Ledger, patches_dir: Path, gpus: Sequence[SelectedGpu],
               allow_processes: Sequence[str]) -> Readiness:
    """Quiet the host again when a cleanup restored it, re-apply the patches a cleanup reverted,
    and take the census of the selected GPUs."""
    requieted = None
    why = quiet_needed(results, services)
    if why is not None:
        log.info("quieting the host first (%s)", why)
        requieted = quiet(results, services, ports=ports, host=host).services
    patched = ensure_patched(patches, ledger=ledger, work_dir=patches_dir)
    census, busy = launch_check(ledger, list(gpus), list(allow_processes))
    return Readiness(requieted, patched, GpuCensus.model_validate(census), busy)


def host_env(gpus: Sequence[SelectedGpu], env: Mapping[str, str], patched: Patched) -> dict[str, str]:
    """A single host's serving environment: the selected GPUs made visible, the configuration's
    ``env``, and the patches' plugin folder."""
    return server_env({**visible_devices_env(list(gpus)), **env}, patched.plugin_dir, patched.patches)
