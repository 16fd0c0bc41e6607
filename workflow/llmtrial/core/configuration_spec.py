"""One configuration's spec: what its plan and its job read of the trial file (:func:`llmtrial.config.configuration_spec`
builds it; the plan and trial rules pass it as a param)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmtrial.core.redact import redact_env
from llmtrial.core.trial_config import NodeBlock


class ServingSpec(BaseModel):
    """What the planner reads of one configuration: its name, its vLLM args and env merged over
    ``serving``'s, ``force``, and the blocks of the nodes it spans (the command line's plan gives these
    alone)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The configuration's name.")
    args: dict[str, Any] = Field(default={}, description="serving.args and then the configuration's args, canonical names.")
    env: dict[str, str] = Field(default={}, description="serving.env and then the configuration's env.")
    force: bool = Field(default=False, description="Launch even when the planner rejects it.")
    nodes: dict[str, NodeBlock] = Field(default={}, description=(
        "The nodes it spans, in its order, when it spans several (empty: this host alone)."))

    def knobs(self) -> dict[str, str]:
        """What a failed configuration is held against the others by: each vLLM arg, each environment
        variable (secrets redacted) and the nodes it spans, as text (JSON for what is not a string)."""
        args = {name: value if isinstance(value, str) else json.dumps(value, sort_keys=True)
                for name, value in self.args.items()}
        nodes = {"nodes": ",".join(self.nodes)} if self.nodes else {}
        return {**args, **redact_env(self.env), **nodes}


class ConfigurationSpec(ServingSpec):
    """Everything one configuration's job needs, and nothing another configuration changes
    (:func:`llmtrial.config.configuration_spec`): the plan and trial rules pass it as a param, so editing
    one configuration's args reruns that configuration alone; the scripts read it as this model."""

    description: str = Field(description="configurations.<name>.description.")
    host: str = Field(description="serving.host.")
    port: int = Field(description="serving.base_port plus the configuration's position in the file.")
    startup_timeout_s: float = Field(description="serving.startup_timeout_s.")
    stop_timeout_s: float = Field(description="serving.stop_timeout_s.")
    idle_watch_s: float = Field(default=0.0, description="serving.idle_watch_s.")
    staging_dir: str | None = Field(default=None, description="Across nodes only: the trial's staging_dir.")
    launch: Literal["native", "ray"] | None = Field(default=None, description=(
        "Across nodes only: configurations.<name>.launch."))

    @property
    def spread_launch(self) -> Literal["native", "ray"]:
        """How the configuration across nodes is launched (ValueError for a spec on one host, which has none)."""
        if self.launch is None:
            raise ValueError(f"configuration {self.name} spans no nodes: it has no launch across them")
        return self.launch
