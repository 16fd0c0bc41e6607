"""Test doubles of what vLLM 0.17.1's ``GPUModelRunner.may_reinitialize_input_batch``
(vllm/v1/worker/gpu_model_runner.py) reads: the names it takes from its module and the runner's
attributes, so the real method, cut out of the real file (tests/data/vllm-0.17.1/), runs without
torch, CUDA or a model. The runner is one of a hybrid model such as Qwen3.5 (seed 000): its KV cache
groups (full attention and Mamba-style linear attention) have a block size other than the cache's,
which is what makes the method re-create the input batch.

Standard library only, and self-contained: tests/patch/test_seed000_patch.py runs the method with these
names in process, and also writes this file's source, followed by a class ``GPUModelRunner`` holding the
method, as a stand-in ``vllm/v1/worker/gpu_model_runner.py`` for the patch's import hook
(tests/programs/call_runner_hook.py).
"""

import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

logger = logging.getLogger(__name__)

#: ``cache_config.block_size`` of the runner double; the KV cache groups use another one.
CACHE_BLOCK_SIZE = 16
GROUP_BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
#: What the runner's first input batch holds as its logits processors (a re-created one carries them over).
LOGITSPROCS = "the runner's logits processors"


class KVCacheConfig:
    """Named in the method's annotations only."""


@dataclass
class AttentionSpecDouble:
    """A full-attention group's KV cache spec (vLLM's FullAttentionSpec, for what the method reads)."""

    block_size: int


class EncoderOnlyAttentionSpec(AttentionSpecDouble):
    """Skipped by the method; not in the doubles' KV cache config."""


@dataclass
class MambaSpec:
    """A linear-attention (gated DeltaNet) group's state spec."""

    block_size: int
    num_speculative_blocks: int = 0


class InputBatch:
    """vLLM's InputBatch, holding what it was made with."""

    def __init__(self, *, logitsprocs: Any = None, logitsprocs_need_output_token_ids: bool = False,
                 **kwargs: Any) -> None:
        self.logitsprocs = logitsprocs
        self.logitsprocs_need_output_token_ids = logitsprocs_need_output_token_ids
        self.kwargs = kwargs


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def get_total_cp_world_size() -> int:
    return 1


def hybrid_kv_cache_config(block_size: int = GROUP_BLOCK_SIZE) -> SimpleNamespace:
    """A hybrid model's KV cache groups, all at ``block_size``."""
    return SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=AttentionSpecDouble(block_size)),
                                            SimpleNamespace(kv_cache_spec=MambaSpec(block_size))])


def attention_kv_cache_config(block_size: int = CACHE_BLOCK_SIZE) -> SimpleNamespace:
    """A model of full attention alone: one KV cache group at ``block_size``."""
    return SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=AttentionSpecDouble(block_size))])


def fill_runner(runner: Any, *, cpu_offload_gb: float) -> Any:
    """Give ``runner`` every attribute the method reads, with ``cpu_offload_gb`` of CPU weight offload."""
    runner.max_model_len, runner.max_encoder_len = MAX_MODEL_LEN, 0
    runner.cache_config = SimpleNamespace(block_size=CACHE_BLOCK_SIZE, enable_prefix_caching=False)
    runner.offload_config = SimpleNamespace(uva=SimpleNamespace(cpu_offload_gb=cpu_offload_gb))
    runner.input_batch = InputBatch(logitsprocs=LOGITSPROCS, block_sizes=[CACHE_BLOCK_SIZE])
    runner.max_num_reqs, runner.max_num_tokens = 4, 8192
    runner.device, runner.pin_memory, runner.is_pooling_model = "cuda:0", True, False
    runner.model_config = SimpleNamespace(get_vocab_size=lambda: 248320)
    runner.vllm_config = SimpleNamespace(speculative_config=None)
    return runner
