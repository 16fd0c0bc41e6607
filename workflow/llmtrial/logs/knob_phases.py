"""Which vLLM knob acts in which start-up phase, as data, with the vLLM source lines that show it.

The table is ``knob_phases.yaml`` beside this module. A knob is named as a trial file writes it: a
serving argument by its canonical name (``gpu_memory_utilization``, ``max_num_seqs``), an environment
variable by its name (``VLLM_CPU_KVCACHE_SPACE``). For each knob, ``acts_in`` lists the phases of
:data:`llmtrial.logs.signature.PHASES` where vLLM reads the value and behaves differently, each with
its :class:`Location` (``file:function:line``, the file relative to the ``vllm`` package). ``config``
holds where it is read while the engine config is built, before any phase; ``not_in`` the evidence for
the phases it does not act in; ``cpu`` where the CPU build differs (its worker, model runner and
platform). ``acts_in`` follows the GPU path, which the CPU worker inherits; a knob only the CPU build
reads (``VLLM_CPU_*``) lists its CPU locations there.

The locations are for the installed vLLM 0.32.0 (the ``vllm-cpu`` distribution, whose tree holds the
GPU worker too), read from its source. ``tests/logs/test_knob_phases.py`` checks each one against the
installed tree, so a vLLM upgrade that moves them fails there.

:func:`knob_phases` reads the shipped table once; :func:`load_knob_phases` reads any file of that form.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from llmtrial.core.record_base import error_lines
from llmtrial.logs.signature import PHASES, Phase

__all__ = ["TABLE", "Knob", "KnobPhases", "KnobPhasesError", "Location", "knob_phases", "load_knob_phases"]

#: The table this module ships.
TABLE = Path(__file__).with_name("knob_phases.yaml")

_LOCATION = re.compile(r"(?P<file>[\w./-]+\.py):(?P<function>[A-Za-z_]\w*):(?P<line>\d+)")


class KnobPhasesError(ValueError):
    """A knob table that cannot be read: the file and each key at fault."""


class Location(BaseModel):
    """A line of vLLM's source: the file from the ``vllm`` package on, the function (or method) the
    line is in, and the 1-based line. Written ``file:function:line``, as :func:`str` gives it back."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str
    function: str
    line: PositiveInt

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        """``v1/worker/gpu_worker.py:init_device:535`` as its three parts; any other value as given."""
        if not isinstance(value, str):
            return value
        match = _LOCATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{value!r} is not a location: write it file.py:function:line")
        return {"file": match["file"], "function": match["function"], "line": int(match["line"])}

    @model_serializer
    def _as_text(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{self.file}:{self.function}:{self.line}"


class Knob(BaseModel):
    """One knob: a serving argument (``arg``) or an environment variable (``env``), the phases it acts
    in with their locations, where the engine config reads it, why it acts in no other phase, and where
    the CPU build differs."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["arg", "env"]
    acts_in: dict[Phase, list[Location]] = Field(min_length=1)
    config: list[Location] = []
    not_in: str = Field(min_length=1)
    cpu: list[Location] = []

    @field_validator("acts_in")
    @classmethod
    def _each_phase_shows_a_line(cls, acts_in: dict[Phase, list[Location]]) -> dict[Phase, list[Location]]:
        """A phase is listed with the lines that show it, never with none."""
        empty = [phase for phase, where in acts_in.items() if not where]
        if empty:
            raise ValueError(f"no location for {', '.join(empty)}")
        return acts_in


class KnobPhases(BaseModel):
    """The table: the vLLM version its locations are for, and each knob by its name."""

    model_config = ConfigDict(extra="forbid")

    vllm: str
    knobs: dict[str, Knob]

    def acts(self, knob: str, phase: Phase) -> bool | None:
        """Whether ``knob`` acts in ``phase``; ``None`` where the table does not hold the knob. A name
        that is no phase raises :class:`ValueError` (a typo would otherwise read as "does not act")."""
        if phase not in PHASES:
            raise ValueError(f"{phase!r} is not a phase; the phases are {', '.join(PHASES)}")
        entry = self.knobs.get(knob)
        return None if entry is None else phase in entry.acts_in

    def acting_in(self, phase: Phase) -> list[str]:
        """The knobs that act in ``phase``, in the table's order."""
        return [name for name in self.knobs if self.acts(name, phase)]

    def where(self, knob: str, phase: Phase) -> list[Location]:
        """The lines where ``knob`` acts in ``phase``; empty where it does not, or the table lacks it."""
        if not self.acts(knob, phase):
            return []
        return list(self.knobs[knob].acts_in[phase])

    def locations(self) -> Iterator[tuple[str, str, Location]]:
        """Every location of the table as ``(knob, part, location)``; the part is a phase, ``config``
        or ``cpu``."""
        for name, knob in self.knobs.items():
            for phase, where in knob.acts_in.items():
                yield from ((name, phase, loc) for loc in where)
            yield from ((name, "config", loc) for loc in knob.config)
            yield from ((name, "cpu", loc) for loc in knob.cpu)


def load_knob_phases(path: str | Path) -> KnobPhases:
    """The table in the YAML file at ``path``; :class:`KnobPhasesError` naming the file, and each key
    at fault (``knobs.max_num_seqs.acts_in.weight_load``), where it is not one."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise KnobPhasesError(f"{path}: cannot read the knob table: {err}") from err
    try:
        return KnobPhases.model_validate(data)
    except ValidationError as err:
        raise KnobPhasesError(f"{path}: " + "; ".join(error_lines(err))) from err


@cache
def knob_phases() -> KnobPhases:
    """The table this module ships (:data:`TABLE`), read once."""
    return load_knob_phases(TABLE)
