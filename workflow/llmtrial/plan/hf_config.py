"""A Hugging Face model's ``config.json``, the fields the planner reads.

The file is the model's publisher's, not ours: every field may be absent (None), a field the planner
does not read is ignored, and one figure is often spelled several ways (:func:`first_set` takes the
first one given). A multimodal file nests the language model's fields under ``text_config`` (or
``llm_config``) beside a ``vision_config``; :meth:`HFConfig.text` is the language model's part, with
its config class's defaults where the file is silent (:data:`CONFIG_DEFAULTS`). A nested block given
empty reads as absent, as it does to transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["CONFIG_DEFAULTS", "HFConfig", "PlanError", "QuantizationConfig", "RopeScaling", "VisionConfig",
           "first_set", "need"]

T = TypeVar("T")


class PlanError(ValueError):
    """The inputs cannot be planned (a missing config key, a bad argument)."""


def first_set(*values: T | None, default: T | None = None) -> T | None:
    """The first of ``values`` the file sets (config.json spells one figure several ways), else ``default``."""
    for value in values:
        if value is not None:
            return value
    return default


def need(value: T | None, name: str) -> T:
    """A field the arithmetic cannot do without; a :class:`KeyError` naming it when the file lacks it."""
    if value is None:
        raise KeyError(name)
    return value


class ForeignJson(BaseModel):
    """A block of someone else's JSON: unknown fields ignored, an empty nested block read as absent."""

    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    @field_validator("*", mode="before")
    @classmethod
    def empty_block_is_absent(cls, value: object) -> object:
        return None if isinstance(value, Mapping) and not value else value


class RopeScaling(ForeignJson):
    """``rope_scaling`` (or transformers' newer ``rope_parameters``): the RoPE type and its factor."""

    rope_type: str | None = None
    type: str | None = None
    factor: float | None = None
    original_max_position_embeddings: int | float | None = None

    @property
    def kind(self) -> str | None:
        return self.rope_type or self.type


class QuantWeights(ForeignJson):
    """compressed-tensors' ``weights`` of one quantization group, with its defaults where it is silent."""

    num_bits: int | None = 8
    strategy: str | None = "tensor"
    group_size: int | None = None
    block_structure: list[int] | None = None
    symmetric: bool | None = True
    type: str | None = None


class QuantGroup(ForeignJson):
    weights: QuantWeights | None = None


class QuantizationConfig(ForeignJson):
    """``quantization_config``: the fields of every method the planner sizes (fp8, AWQ, GPTQ,
    compressed-tensors, bitsandbytes, MXFP4), with the defaults those methods take where it is silent."""

    quant_method: str | None = None
    weight_block_size: list[int] | None = None
    modules_to_not_convert: list[str] | None = None
    ignored_layers: list[str] | None = None
    ignore: list[str] | None = None
    bits: int | None = None
    w_bit: int | None = None
    group_size: int | None = None
    q_group_size: int | None = None
    zero_point: bool | None = True
    desc_act: bool | None = None
    lm_head: bool | None = None
    format: str | None = None
    config_groups: dict[str, QuantGroup] | None = None
    llm_int8_skip_modules: list[str] | None = None
    load_in_4bit: bool | None = None
    load_in_4bit_stored: bool | None = Field(None, alias="_load_in_4bit")  # as BitsAndBytesConfig.to_dict writes it
    bnb_4bit_use_double_quant: bool | None = None
    bnb_4bit_quant_type: str | None = "fp4"


class VisionConfig(ForeignJson):
    """``vision_config``: the vision tower vLLM loads with a multimodal model's language model."""

    model_type: str | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    patch_size: int | None = None
    image_size: int | None = None
    num_channels: int | None = 3
    pixel_shuffle_ratio: float | None = None
    projector_input_dim: int | None = None
    projector_output_dim: int | None = None
    vision_output_dim: int | None = None
    vision_use_head: bool | None = None
    # Qwen3.5's vision tower
    depth: int | None = None
    in_channels: int | None = 3
    temporal_patch_size: int | None = None
    spatial_merge_size: int | None = None
    num_position_embeddings: int | None = None
    out_hidden_size: int | None = None


class HFConfig(ForeignJson):
    """The fields of a model's config.json the planner reads (a multimodal file's ``text_config`` is one too)."""

    model_type: str | None = None
    architectures: list[str] | None = None
    text_config: HFConfig | None = None
    llm_config: HFConfig | None = None
    vision_config: VisionConfig | None = None
    quantization_config: QuantizationConfig | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    tie_word_embeddings: bool | None = None
    # sizes, under their several spellings
    hidden_size: int | None = None
    d_model: int | None = None
    n_embd: int | None = None
    num_hidden_layers: int | None = None
    n_layer: int | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    intermediate_size_mlp: int | None = None
    ffn_hidden_size: int | None = None
    n_inner: int | None = None
    mlp_bias: bool | None = None
    # attention
    num_attention_heads: int | None = None
    n_head: int | None = None
    head_dim: int | None = None
    num_key_value_heads: int | None = None
    num_kv_heads: int | None = None
    multi_query_group_num: int | None = None
    n_head_kv: int | None = None
    attention_bias: bool | None = None
    attn_output_gate: bool | None = None
    use_qk_norm: bool | None = None
    qk_layernorm: bool | None = None
    # multi-head latent attention (DeepSeek)
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    # linear attention (Qwen3-Next's gated DeltaNet) and state-space layers
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    mamba_d_state: int | None = None
    ssm_state_size: int | None = None
    state_size: int | None = None
    mamba_expand: int | None = None
    expand: int | None = None
    mamba_d_conv: int | None = None
    conv_kernel: int | None = None
    d_conv: int | None = None
    # mixture of experts
    num_experts: int | None = None
    n_routed_experts: int | None = None
    num_local_experts: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    shared_intermediate_size: int | None = None
    n_shared_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_topk: int | None = None
    top_k_experts: int | None = None
    topk_method: str | None = None
    first_k_dense_replace: int | None = None
    moe_layer_freq: int | None = None
    moe_layers: list[int] | None = None
    mlp_only_layers: list[int] | None = None
    decoder_sparse_step: int | None = None
    interleave_moe_layer_step: int | None = None
    # which layers keep which cache
    layer_types: list[str] | None = None
    layers_block_type: list[str] | None = None
    hybrid_override_pattern: str | None = None
    full_attention_interval: int | None = None
    sliding_window: int | None = None
    sliding_window_size: int | None = None
    attention_window_size: int | None = None
    attention_chunk_size: int | None = None
    use_sliding_window: bool | None = None
    max_window_layers: int | None = None
    sliding_window_pattern: int | None = None
    no_rope_layers: list[int] | None = None
    no_rope_layer_interval: int | None = None
    # length and RoPE
    max_position_embeddings: int | float | None = None
    n_positions: int | float | None = None
    max_seq_len: int | float | None = None
    seq_length: int | float | None = None
    model_max_length: int | float | None = None
    max_sequence_length: int | float | None = None
    max_seq_length: int | float | None = None
    seq_len: int | float | None = None
    rope_scaling: RopeScaling | None = None
    rope_parameters: RopeScaling | None = None
    rope_theta: float | None = None
    rotary_dim: int | None = None
    partial_rotary_factor: float | None = None
    rotary_pct: float | None = None

    @classmethod
    def of(cls, config: HFConfig | Mapping[str, Any]) -> HFConfig:
        """config.json as read (a mapping), or the model already built from it."""
        if isinstance(config, HFConfig):
            return config
        try:
            return cls.model_validate(config)
        except ValidationError as exc:
            where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise PlanError(f"config.json does not read as a model's config: {where}") from None

    @property
    def kind(self) -> str:
        """``model_type``, or "" where the file gives none."""
        return self.model_type or ""

    def text(self) -> HFConfig:
        """The language model's part of a (possibly multimodal) config.json, with its config class's
        defaults (:data:`CONFIG_DEFAULTS`) where the file is silent."""
        cfg = self.text_config or self.llm_config or self
        defaults = CONFIG_DEFAULTS.get(cfg.kind)
        if defaults is None:
            return cfg
        return cfg.model_copy(update={k: v for k, v in defaults.model_dump(exclude_unset=True).items()
                                      if k not in cfg.model_fields_set})

    def lengths(self) -> dict[str, int | float | None]:
        """The fields vLLM takes the model's length from (the smallest of those set), in its order."""
        return {"max_position_embeddings": self.max_position_embeddings, "n_positions": self.n_positions,
                "max_seq_len": self.max_seq_len, "seq_length": self.seq_length, "model_max_length": self.model_max_length,
                "max_sequence_length": self.max_sequence_length, "max_seq_length": self.max_seq_length,
                "seq_len": self.seq_len}

    def quantization(self) -> QuantizationConfig | None:
        """The checkpoint's ``quantization_config``, top level or the language model's."""
        return self.quantization_config or self.text().quantization_config


#: What a model's config class sets where its config.json is silent (Gemma 3's multimodal files
#: give a short text_config and leave the rest to transformers' ``Gemma3TextConfig``).
CONFIG_DEFAULTS: dict[str, HFConfig] = {
    "gemma3_text": HFConfig(vocab_size=262208, max_position_embeddings=131072, head_dim=256, sliding_window=4096,
                            sliding_window_pattern=6, tie_word_embeddings=True, rope_theta=1_000_000.0),
}
