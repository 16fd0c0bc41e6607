"""A configuration's answers: the task set asked of the passes' server, and, where the configuration
turns a patch's flag on, of a server launched with every flag off (``outputs.patch_off``), so the
report can say whether the patch changed answers.

Every patch reads its flag from the server's environment (workflow/llmtrial/patches/README.md), so
flag off takes a launch of its own: the same argv and environment with each flag set to ``"0"``,
its log ``answers-flags-off.log`` beside the server's, its launch and stop in the ledger as any
server's. That server is asked the set once: whether answers repeat is the passes' server's to show.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llmtrial.answers.tasks import tasks_digest
from llmtrial.core.answers_model import AnswerRun, Answers
from llmtrial.patch.patchdata import EnabledPatch
from llmtrial.serve.measure import Served, Workload, sigterm_as_exit
from llmtrial.serve.server import ServerProcess, ServerStartError

log = logging.getLogger(__name__)

__all__ = ["job_answers", "patch_flags", "flags_off_env", "flags_off_run", "answers_part", "wants_flags_off"]

def patch_flags(patches: Sequence[EnabledPatch], env: Mapping[str, str]) -> dict[str, bool]:
    """Each applied patch by name: whether ``env`` (the server's) turns its flag on."""
    return {p.name: env.get(p.flag) == "1" for p in patches}


def flags_off_env(env: Mapping[str, str], patches: Sequence[EnabledPatch]) -> dict[str, str]:
    """``env`` with every patch's flag set to "0" (off whatever the host's own environment says)."""
    return {**env, **{p.flag: "0" for p in patches}}


def flags_off_run(workload: Workload, server: ServerProcess, *, flags: Mapping[str, bool],
                  startup_timeout_s: float, log_rel: str) -> AnswerRun:
    """Launch ``server`` (built with the flags off), ask the set, stop it: the run's record; a server
    that does not start is a run with its failure and no answers."""
    off = {name: False for name in flags}
    log.info("answers with the patch flags off (%s): launching a server of its own",
             ", ".join(n for n, on in flags.items() if on))
    with sigterm_as_exit():
        try:
            server.start()
            ready = server.wait_ready(startup_timeout_s)
            return workload.ask(server.host, server.port, launch="flags_off", flags=off, once=True, server_log=log_rel,
                                ready_s=round(ready, 3))
        except ServerStartError as exc:
            log.warning("the flags-off server did not start: %s", exc)
            return AnswerRun(launch="flags_off", flags=off, started=server.launched_at or 0.0, seconds=0.0, repeat=1,
                             repeat_identical=None, answers=[], accuracy=[], server_log=log_rel,
                             failure=f"the server with the flags off did not start: {exc}")
        finally:
            server.stop()


def answers_part(workload: Workload, runs: Sequence[AnswerRun]) -> Answers | None:
    """The record's answers: the settings, the task set and its runs; None when no set was asked."""
    if not workload.outputs or not runs:
        return None
    o = workload.outputs
    return Answers(api=o.api, max_tokens=o.max_tokens, seed=o.seed, temperature=0.0,
                   tasks_sha256=tasks_digest(workload.tasks), tasks=list(workload.tasks), runs=list(runs))


def job_answers(workload: Workload, served: Served, *, flags: Mapping[str, bool], spread: bool, env: Mapping[str, str],
                patches: Sequence[EnabledPatch], server: Callable[[Mapping[str, str]], ServerProcess], log_rel: str,
                startup_timeout_s: float) -> dict[str, Any]:
    """The record's answers: the passes' server's run, then, when a flag is on (``outputs.patch_off``), a
    launch with the flags off (``server`` builds it from its environment, its log at ``log_rel``)."""
    runs = [served.answers] if served.answers is not None else []
    if runs and served.failure is None and wants_flags_off(workload, flags, spread):
        runs.append(flags_off_run(workload, server(flags_off_env(env, patches)), flags=flags, log_rel=log_rel,
                                  startup_timeout_s=startup_timeout_s))
    part = answers_part(workload, runs)
    return {} if part is None else {"answers": part}


def wants_flags_off(workload: Workload, flags: Mapping[str, bool], spread: bool) -> bool:
    """A flags-off launch is due: a set is asked, patch_off holds, a flag is on, one host serves."""
    return bool(workload.outputs and workload.outputs.patch_off and any(flags.values()) and not spread)

