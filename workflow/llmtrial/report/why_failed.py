"""The report's "Why it failed" section: the failed configurations read together
(:func:`llmtrial.logs.across.compare_failures`) in sentences, and the one sentence of the first screen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmtrial.core.configuration_model import ConfigurationRecord, Signature
from llmtrial.logs.across import PHASE_NAMES, FailureComparison, Implicated, SignatureGroup, compare_failures
from llmtrial.logs.knob_phases import KnobPhases, knob_phases

__all__ = ["GroupText", "WhyFailed", "confirmation_text", "down_text", "idle_clause", "signature_text", "why_failed"]


@dataclass(frozen=True)
class GroupText:
    """One signature group as the section shows it."""

    configurations: tuple[str, ...]
    signature: Signature
    heading: str
    phase: str
    sentences: tuple[str, ...]
    next_step: str | None


@dataclass(frozen=True)
class WhyFailed:
    """The section: each signature group, the implicated knobs, the failed configurations without a
    signature, and the first screen's sentence."""

    groups: tuple[GroupText, ...]
    implicated: tuple[str, ...]
    confirmations: tuple[str, ...]
    #: Each server that died after it was ready: idle or not, the kernel log and the GPUs' health of that window.
    crashes: tuple[str, ...]
    unsigned: str | None
    headline: str


def _names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def signature_text(sig: Signature) -> str:
    """``RuntimeError: <message> at vllm/x.py:fn:12, in post-load weight processing``: what the log shows."""
    what = f"{sig.exception}: {sig.message}" if sig.exception else "a traceback without an exception line"
    where = f" at {sig.frame.file}:{sig.frame.function}:{sig.frame.line}" if sig.frame else ""
    phase = f", in {PHASE_NAMES[sig.phase]}" if sig.phase else ", in a phase the log does not show"
    return what + where + phase


def _next_step(group: SignatureGroup, implicated: Sequence[Implicated], table: KnobPhases,
               records: Sequence[ConfigurationRecord]) -> str | None:
    """What to change: the implicated knob where one tells a member from a configuration that ran, else
    the knobs vLLM reads in the crash's phase, beside the failure catalogue's step."""
    mine = [i for i in implicated if i.failed in group.configurations]
    confirmed = [r.confirmation for r in records if r.configuration in group.configurations and r.confirmation]
    if any(c.removing_fixes for c in confirmed):
        knobs = list(dict.fromkeys(c.knob for c in confirmed if c.removing_fixes))
        return f"Take {_names(knobs)} away: the relaunches below show what that does."
    if mine:
        knobs, ran = list(dict.fromkeys(i.knob for i in mine)), list(dict.fromkeys(i.passed for i in mine))
        return (f"Take {_names(knobs)} away: {_names(ran)} ran without it. Relaunching without it, then with it "
                "again, would show both that removing it fixes the crash and that adding it back breaks it; "
                "this trial has shown neither.")
    first = next(r for r in records if r.configuration == group.configurations[0])
    line = first.failure.error_line if first.failure is not None else None
    diagnosis = str(line.diagnosis) if line is not None and line.pattern != "unknown" else None
    phase = group.signature.phase
    acting = table.acting_in(phase) if phase else []
    change = f"Change a knob vLLM reads in {PHASE_NAMES[phase]}: {', '.join(acting)}." if phase and acting else None
    return " ".join(s for s in (diagnosis, change) if s) or (str(line.diagnosis) if line is not None else None)


def _group_text(group: SignatureGroup, next_step: str | None) -> GroupText:
    """The group's heading and sentences."""
    names = group.configurations
    heading = f"{_names(names)} fail with one signature" if len(names) > 1 else f"{names[0]} fails with its signature"
    sentences = [f"{d.text()} and the crash did not move: not that knob." for d in group.ruled_out]
    sentences += [f"{o.text()}." for o in group.out_of_phase]
    phase = PHASE_NAMES[group.signature.phase] if group.signature.phase else "not shown in the log"
    return GroupText(names, group.signature, heading, phase, tuple(sentences), next_step)


def _implicated_text(i: Implicated) -> str:
    shown = [v if v is not None else "unset" for v in (i.failed_value, i.passed_value)]
    return (f"{i.knob} is implicated: {i.failed} ({i.knob} {shown[0]}) fails and {i.passed} ({i.knob} {shown[1]}) "
            "ran, and the two differ in nothing else.")


def confirmation_text(record: ConfigurationRecord) -> str | None:
    """What the relaunches of a failed configuration showed (failures.confirm), never more than ran."""
    c = record.confirmation
    if c is None:
        return None
    name, instead = record.configuration, c.instead if c.instead is not None else "unset"
    first = (f"{name} relaunched with {c.knob} as {c.against} has it ({instead}): "
             + ("it started, so removing it fixes the crash." if c.removing_fixes else
                "it did not start, so removing it does not fix the crash."))
    if c.adding_back_breaks is None:
        return first + f" Adding {c.knob} back was not tried."
    again = (f" Relaunched with {c.knob} again: it failed with the same signature, so adding it back breaks it."
             if c.adding_back_breaks else
             f" Relaunched with {c.knob} again: it did not fail with the same signature, so adding it back was not "
             "shown to break it.")
    return first + again


def idle_clause(record: ConfigurationRecord) -> str | None:
    """``crashed while idle (...)`` or ``crashed with 2 requests running and 0 waiting``, for a server that
    died after it was ready; None otherwise."""
    down = record.failure.down if record.failure is not None else None
    if down is None:
        return None
    if down.idle is None:
        return "died with no /metrics sample taken after start-up (idle or not is unknown)"
    counts = f"{down.running or 0:g} request(s) running and {down.waiting or 0:g} waiting"
    if down.idle:
        return "crashed while idle (its last /metrics sample showed no request running or waiting)"
    if down.pass_in_flight:
        return f"died under load, while pass {down.pass_in_flight} was sending requests (its last /metrics sample showed {counts})"
    return f"died under load (its last /metrics sample showed {counts})"


def down_text(record: ConfigurationRecord) -> str | None:
    """The server that died after it was ready: idle or not, the kernel log's lines and the GPUs' health of
    that window (seed 002: nvidia-smi saw nothing, the kernel log had the Xid)."""
    clause = idle_clause(record)
    down = record.failure.down if record.failure is not None else None
    if clause is None or down is None:
        return None
    when = (f" {down.found_down_at - down.last_sample_at:.1f} s before it was found down"
            if down.last_sample_at is not None else "")
    text = f"{record.configuration}'s server {clause}{',' if when else ''}{when}."
    if down.kernel_log is not None:
        text += f" The kernel log could not be read: {down.kernel_log}."
    elif down.kernel_lines:
        said = " | ".join(line.strip() for line in down.kernel_lines).rstrip(".")
        text += f" The kernel log in that window: {said}."
    else:
        text += " The kernel log gained no NVRM or Xid line in that window."
    health = record.gpu_health
    if health is not None and health.gpus:
        said = [f"GPU {g.index} {'failed' if g.healthy is False else 'passed' if g.healthy else 'was not checked'}"
                f" ({g.evidence})" for g in health.gpus]
        text += f" The GPU check after it: {'; '.join(said)}."
    else:
        text += " No GPU was selected, so none was checked after it."
    return text


def _shown(records: Sequence[ConfigurationRecord]) -> str | None:
    """The headline's clause on what the relaunches showed."""
    for r in records:
        c = r.confirmation
        if c is not None and c.removing_fixes:
            if c.adding_back_breaks:
                return f"relaunches of {r.configuration} show that removing {c.knob} fixes it and adding it back breaks it"
            return f"a relaunch of {r.configuration} shows that removing {c.knob} fixes it (adding it back was not shown)"
    return None


def _headline(comparison: FailureComparison, records: Sequence[ConfigurationRecord]) -> str:
    """One sentence: the largest group, what it rules out, and the knob implicated."""
    parts = []
    if comparison.groups:
        group = comparison.groups[0]
        n = len(group.configurations)
        parts.append(f"{_names(group.configurations)} {'fail' if n > 1 else 'fails'} with one signature "
                     f"({signature_text(group.signature)})")
        ruled = list(dict.fromkeys([d.knob for d in group.ruled_out] + [o.knob for o in group.out_of_phase]))
        if ruled:
            parts.append(f"{_names(ruled)} {'is' if len(ruled) == 1 else 'are'} not the cause")
    knobs = list(dict.fromkeys(i.knob for i in comparison.implicated))
    if knobs:
        parts.append(f"{_names(knobs)} {'is' if len(knobs) == 1 else 'are'} implicated")
    shown = _shown(records)
    if shown:
        parts.append(shown)
    parts += [f"{r.configuration}'s server crashed while idle, no request running or waiting" for r in records
              if r.failure is not None and r.failure.down is not None and r.failure.down.idle]
    if not parts:
        return f"{_names(comparison.unsigned)}: no log shows a crash to compare."
    return "; ".join(parts) + "."


def why_failed(configurations: Sequence[ConfigurationRecord], table: KnobPhases | None = None) -> WhyFailed | None:
    """The section for the trial's ``configurations``, or None when none failed."""
    table = table or knob_phases()
    comparison = compare_failures(configurations, table)
    if not comparison.any:
        return None
    unsigned = (f"{_names(comparison.unsigned)}: no log shows an exception or a traceback to compare "
                "(a timeout, a launch refused before vLLM ran, or a server killed without one)") if comparison.unsigned else None
    return WhyFailed(groups=tuple(_group_text(g, _next_step(g, comparison.implicated, table, configurations))
                                 for g in comparison.groups),
                     implicated=tuple(_implicated_text(i) for i in comparison.implicated),
                     confirmations=tuple(t for t in map(confirmation_text, configurations) if t),
                     crashes=tuple(t for t in map(down_text, configurations) if t),
                     unsigned=unsigned, headline=_headline(comparison, configurations))
