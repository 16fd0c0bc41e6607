"""A vLLM patch's description, ``workflow/llmtrial/patches/<name>/patch.yaml``, as one model: the only
statement of the file's shape (``schemas/patch.schema.json`` is generated from it, its drift checked with
the record schemas'). :func:`llmtrial.patch.patchdata.load_patch` reads each patch with it."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from llmtrial.core.record_base import Maybe


class PatchFile(BaseModel):
    """What a patch changes, which vLLM it applies to, and the environment flag that turns the changed
    behaviour on. Read by llmtrial.patch.patchdata."""

    model_config = ConfigDict(extra="forbid", strict=True, title="vLLM patch metadata", json_schema_extra={
        "anyOf": [{"required": ["diff"]}, {"required": ["hook"]}]})

    description: str = Field(description="Why the patch exists and what it changes, for the report.")
    vllm: str = Field(description='The vLLM versions it applies to, as a PEP 440 specifier such as ">=0.32,<0.33".')
    flag: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(description=(
        'Environment variable that guards the changed behaviour inside the patched code: on when it is "1", '
        "otherwise vLLM behaves as unpatched. A configuration sets it in its env."))
    diff: Maybe[str] = Field(None, description=(
        "Unified diff (paths relative to site-packages, a/ and b/ prefixes) applied in mode file."))
    hook: Maybe[str] = Field(None, description=(
        "Python module with a register() function, the same change made at import time; loaded in every vLLM "
        "process through a vllm.general_plugins entry point in mode plugin."))
    evidence: str = Field(description=(
        "Regular expression matched against each server log line: a match shows that the patched behaviour ran, "
        "and in which process."))

    @field_validator("evidence")
    @classmethod
    def _a_regular_expression(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _a_diff_or_a_hook(self) -> PatchFile:
        if self.diff is None and self.hook is None:
            raise ValueError("a patch needs a diff (mode file) or a hook (mode plugin), or both")
        return self
