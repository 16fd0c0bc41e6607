"""A relaunch that confirms the cause of a crash (the trial file's ``failures.confirm``).

A failed configuration that differs from another configuration of the trial in one knob only (a vLLM
arg or an environment variable, :func:`llmtrial.logs.across.differing_knobs`) is launched again with
that knob as the other has it. When that launch starts, removing the knob fixes the crash; the
configuration is then launched once more as it was, and when it fails again with the crash's
signature, adding the knob back breaks it. Seed 002's author removed a flag and three cards started,
and noted that "adding it back breaks it" was never shown: this shows both, or says which it showed.

Each relaunch starts the server, waits for /health (or its exit), and stops it; each is its own launch
in the ledger (:class:`llmtrial.serve.server.ServerProcess` writes it) with its own log beside the
record. Configurations that span nodes are not relaunched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmtrial.core.configuration_model import Confirmation, ConfirmLaunch, Signature
from llmtrial.core.configuration_spec import ConfigurationSpec
from llmtrial.logs.across import differing_knobs
from llmtrial.logs.lines import read_log
from llmtrial.logs.signature import signature_record
from llmtrial.serve.progress import say
from llmtrial.serve.server import ServerProcess, ServerStartError

__all__ = ["Candidate", "candidate", "confirm"]


@dataclass(frozen=True)
class Candidate:
    """The one knob between a failed configuration and ``other``, and the other's spec."""

    knob: str
    other: ConfigurationSpec
    value: str | None
    instead: str | None


def candidate(spec: ConfigurationSpec, others: Mapping[str, ConfigurationSpec]) -> Candidate | None:
    """The first other configuration that differs from ``spec`` in one vLLM arg or environment variable
    and in nothing else (nodes aside: neither spans any), or None."""
    if spec.nodes:
        return None
    mine = spec.knobs()
    for name, other in others.items():
        if name == spec.name or other.nodes:
            continue
        diff = differing_knobs({spec.name: mine, name: other.knobs()})
        if len(diff) == 1 and (diff[0].knob in spec.args or diff[0].knob in other.args
                               or diff[0].knob in spec.env or diff[0].knob in other.env):
            return Candidate(diff[0].knob, other, diff[0].values[spec.name], diff[0].values[name])
    return None


#: Builds a relaunch's server from the spec it serves and its log's path.
ServerFor = Callable[[ConfigurationSpec, Path], ServerProcess]


def _launch(server: ServerProcess, timeout: float, rel: Callable[[Path], str], *, knob_set: bool) -> ConfirmLaunch:
    """Start ``server``, wait for /health or its exit, stop it: whether it started, and the signature of
    its crash when it did not."""
    started = True
    try:
        server.start()
        server.wait_ready(timeout)
    except ServerStartError:
        started = False
    finally:
        server.stop()
    log = rel(server.log_path)
    text = read_log(server.log_path) if server.log_path.exists() else ""
    signature = None if started or not text else signature_record([(log, text)])
    return ConfirmLaunch(knob_set=knob_set, log=log, started=started, signature=signature)


def _same(a: Signature | None, b: Signature | None) -> bool:
    return a is not None and b is not None and a.key == b.key


def confirm(spec: ConfigurationSpec, signature: Signature, found: Candidate, *, server_for: ServerFor,
            out_dir: Path, timeout: float, rel: Callable[[Path], str]) -> Confirmation:
    """The relaunches of the failed configuration ``spec`` (its crash's ``signature``) for the knob of
    ``found``: without it (its args and env as the other configuration has them), then, when that one
    started, as it was."""
    without = spec.model_copy(update={"args": found.other.args, "env": found.other.env})
    say("%s: relaunching without %s (as %s has it) to confirm the cause", spec.name, found.knob, found.other.name)
    first = _launch(server_for(without, out_dir / f"confirm-without-{found.knob}.log"), timeout, rel, knob_set=False)
    launches, breaks = [first], None
    if first.started:
        say("%s: it started without %s; relaunching with it again", spec.name, found.knob)
        again = _launch(server_for(spec, out_dir / f"confirm-with-{found.knob}.log"), timeout, rel, knob_set=True)
        launches.append(again)
        breaks = not again.started and _same(again.signature, signature)
    return Confirmation(knob=found.knob, against=found.other.name, value=found.value, instead=found.instead,
                        launches=launches, removing_fixes=first.started, adding_back_breaks=breaks)
