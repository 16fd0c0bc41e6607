"""Failures compared across a trial's configurations: which knob did not cause a crash, which one did.

Each failed configuration is diagnosed alone (its kind, line and next step); a crash is better read
beside the others. Seed 002's two configurations, their memory budgets 3.2 GiB apart, crashed on the
same line while the weights were repacked after loading, and the budget was blamed. Read across
configurations:

* configurations whose crash has one signature (:mod:`llmtrial.logs.signature`) form a group, and
  every knob that differs inside a group is *not the cause*: it moved and the crash did not;
* a knob a reader would blame (one that differs, or a memory knob beside an out-of-memory error) is
  *out of phase* where the knob table (:mod:`llmtrial.logs.knob_phases`) says it cannot act in the
  phase the crash happened in;
* a failed configuration and one that ran, differing in exactly one knob, *implicate* that knob.

Knobs are a configuration record's ``knobs``: its vLLM args, its environment (a patch's flag among
them), its nodes and GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmtrial.core.configuration_model import ConfigurationRecord, Phase, Signature
from llmtrial.logs.knob_phases import KnobPhases, knob_phases

__all__ = ["PHASE_NAMES", "Differing", "FailureComparison", "Implicated", "OutOfPhase", "SignatureGroup",
           "compare_failures", "differing_knobs"]

#: Each phase as a sentence names it.
PHASE_NAMES: dict[Phase, str] = {
    "device_init": "device initialisation", "weight_loading": "weight loading",
    "post_load_processing": "post-load weight processing", "memory_profiling": "memory profiling",
    "kv_allocation": "KV-cache allocation", "graph_capture_compile": "graph capture or compilation",
    "serving": "serving",
}
#: The knobs a reader blames for an out-of-memory error: the memory budget and what it is spent on.
MEMORY_KNOBS = ("gpu_memory_utilization", "VLLM_CPU_KVCACHE_SPACE", "kv_cache_memory_bytes", "max_num_seqs",
                "max_num_batched_tokens", "max_model_len", "cpu_offload_gb")


@dataclass(frozen=True)
class Differing:
    """A knob whose value differs between configurations: each configuration's value (None: not set)."""

    knob: str
    values: Mapping[str, str | None]

    def text(self) -> str:
        """``gpu_memory_utilization 0.90 against 0.95`` (``0.9 (a), 0.95 (b), unset (c)`` for more)."""
        shown = [v if v is not None else "unset" for v in self.values.values()]
        if len(shown) == 2:
            return f"{self.knob} {shown[0]} against {shown[1]}"
        return f"{self.knob} " + ", ".join(f"{v} ({name})" for name, v in zip(self.values, shown, strict=True))


@dataclass(frozen=True)
class OutOfPhase:
    """A knob that cannot act in the phase a crash happened in, with the phases it acts in and where."""

    knob: str
    phase: Phase
    acts_in: tuple[Phase, ...]
    where: str

    def text(self) -> str:
        acts = ", ".join(PHASE_NAMES[p] for p in self.acts_in)
        return (f"{self.knob} cannot act in {PHASE_NAMES[self.phase]}: in vLLM it acts in {acts} "
                f"(vllm/{self.where})")


@dataclass(frozen=True)
class SignatureGroup:
    """Failed configurations whose crash has one signature, the knobs ruled out among them, and the knobs
    a reader would blame that cannot act in the crash's phase."""

    signature: Signature
    configurations: tuple[str, ...]
    ruled_out: tuple[Differing, ...]
    out_of_phase: tuple[OutOfPhase, ...]


@dataclass(frozen=True)
class Implicated:
    """A knob that alone tells a failed configuration from one that ran."""

    knob: str
    failed: str
    passed: str
    failed_value: str | None
    passed_value: str | None


@dataclass(frozen=True)
class FailureComparison:
    """A trial's failed configurations read together: groups by signature (largest first), knobs
    implicated, and the failed configurations whose logs show no crash (a timeout, a refused launch)."""

    groups: tuple[SignatureGroup, ...]
    implicated: tuple[Implicated, ...]
    unsigned: tuple[str, ...]

    @property
    def any(self) -> bool:
        return bool(self.groups or self.implicated or self.unsigned)


def differing_knobs(knobs: Mapping[str, Mapping[str, str]]) -> list[Differing]:
    """The knobs whose values are not the same in every configuration of ``knobs`` (name -> knobs),
    in the order they first appear."""
    names = list(dict.fromkeys(k for each in knobs.values() for k in each))
    out = []
    for name in names:
        values = {config: each.get(name) for config, each in knobs.items()}
        if len(set(values.values())) > 1:
            out.append(Differing(name, values))
    return out


def _out_of_phase(signature: Signature, blamed: Sequence[str], table: KnobPhases) -> tuple[OutOfPhase, ...]:
    """The knobs of ``blamed`` the table says cannot act in the crash's phase."""
    phase = signature.phase
    if phase is None:
        return ()
    out = []
    for knob in dict.fromkeys(blamed):
        if table.acts(knob, phase) is False:
            acts_in = tuple(table.knobs[knob].acts_in)
            out.append(OutOfPhase(knob, phase, acts_in, str(table.where(knob, acts_in[0])[0]) if acts_in else ""))
    return tuple(out)


def _group(signature: Signature, members: list[ConfigurationRecord], table: KnobPhases) -> SignatureGroup:
    knobs = {r.configuration: r.knobs or {} for r in members}
    ruled_out = tuple(differing_knobs(knobs)) if len(members) > 1 else ()
    blamed = [d.knob for d in ruled_out]
    if signature.out_of_memory:
        blamed += [k for k in MEMORY_KNOBS if any(k in each for each in knobs.values())]
    return SignatureGroup(signature, tuple(knobs), ruled_out, _out_of_phase(signature, blamed, table))


def _implicated(failed: Sequence[ConfigurationRecord], passed: Sequence[ConfigurationRecord]) -> list[Implicated]:
    out = []
    for f in failed:
        for p in passed:
            only = differing_knobs({f.configuration: f.knobs or {}, p.configuration: p.knobs or {}})
            if len(only) == 1:
                knob = only[0]
                out.append(Implicated(knob.knob, f.configuration, p.configuration, knob.values[f.configuration],
                                      knob.values[p.configuration]))
    return out


def compare_failures(records: Sequence[ConfigurationRecord], table: KnobPhases | None = None) -> FailureComparison:
    """The trial's failed configurations of ``records`` read together (``table``: the knob table, the
    installed vLLM's by default)."""
    table = table or knob_phases()
    failed = [r for r in records if r.status == "failed"]
    passed = [r for r in records if r.status == "ok"]
    by_key: dict[tuple[object, ...], list[ConfigurationRecord]] = {}
    for r in failed:
        if r.failure is not None and r.failure.signature is not None:
            by_key.setdefault(r.failure.signature.key, []).append(r)
    groups = [_group(members[0].failure.signature, members, table)  # type: ignore[union-attr]
              for members in sorted(by_key.values(), key=len, reverse=True)]
    unsigned = tuple(r.configuration for r in failed if r.failure is None or r.failure.signature is None)
    return FailureComparison(tuple(groups), tuple(_implicated(failed, passed)), unsigned)
