"""The tiny model: a small Llama-architecture model generated locally from a seed.

Random weights (a seeded ``torch.Generator``) and a byte-level BPE tokenizer trained on a
pseudo-word corpus: no network and no download, and the same seed and sizes give
byte-identical files. The default trial serves it with the CPU build of vLLM.

torch, transformers and tokenizers are imported inside the functions that need them, so
importing this module is cheap (the planner reads :func:`tiny_config` without them).
"""

from __future__ import annotations

import inspect
import logging
import random
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmtrial.core.fileio import replace_dir, sibling_dir
from llmtrial.core.trial_config import SourceBlock, TinyBlock

logger = logging.getLogger(__name__)

__all__ = ["REQUIRED_HEAD_DIM", "ConfigValue", "generate_tiny_model", "tiny_config",
           "tiny_parameters"]

#: A value of a config.json this project computes (a name, a size, a flag, the architectures).
ConfigValue = int | str | bool | list[str]

#: The generator's default sizes: the trial file's (a ``tiny`` source's block with nothing given).
_SIZES = TinyBlock()

#: Attention head size of generated models: vLLM's CPU attention backend rejects small
#: head sizes such as 16, and 64 is supported by every backend.
REQUIRED_HEAD_DIM = 64

_SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
_BYTE_ALPHABET = 256
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def _validate_tiny(values: Mapping[str, int]) -> None:
    """Raise ValueError naming the offending parameter when the sizes cannot work."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"tiny model parameter {name} must be a positive integer, got {value!r}")
    hidden_size, num_heads, num_kv_heads = values["hidden_size"], values["num_heads"], values["num_kv_heads"]
    vocab_size = values["vocab_size"]
    if hidden_size % num_heads != 0 or hidden_size // num_heads != REQUIRED_HEAD_DIM:
        raise ValueError(
            f"head_dim = hidden_size / num_heads must be {REQUIRED_HEAD_DIM} "
            f"(vLLM's CPU attention rejects smaller heads), got hidden_size={hidden_size}, "
            f"num_heads={num_heads} (head_dim {hidden_size / num_heads:g}); "
            f"use hidden_size = {REQUIRED_HEAD_DIM} * num_heads"
        )
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    minimum_vocab = _BYTE_ALPHABET + len(_SPECIAL_TOKENS) + 1
    if vocab_size < minimum_vocab:
        raise ValueError(
            f"vocab_size must be at least {minimum_vocab} (256 byte tokens, "
            f"{len(_SPECIAL_TOKENS)} special tokens and one merge), got {vocab_size}"
        )


def _pseudo_corpus(seed: int, vocab_size: int) -> list[str]:
    """Deterministic training text: sentences of pseudo-words, digits and punctuation."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "sh", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "x"]
    # A Zipf-like lexicon so frequent words become whole tokens.
    lexicon_size = max(200, vocab_size)
    lexicon = [
        "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.choice((1, 1, 2, 2, 3)))
        )
        for _ in range(lexicon_size)
    ]
    weights = [1.0 / (rank + 1) for rank in range(lexicon_size)]
    punctuation = [".", ".", ".", "!", "?", ",", ";", ":"]
    lines: list[str] = []
    n_sentences = 400 + 2 * vocab_size
    for _ in range(n_sentences):
        words = rng.choices(lexicon, weights=weights, k=rng.randint(4, 14))
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        sentence = " ".join(words)
        sentence = sentence[:1].upper() + sentence[1:] + rng.choice(punctuation)
        lines.append(sentence)
    return lines


def _train_tokenizer(seed: int, vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer (a ``tokenizers.Tokenizer``) on the seed's corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_pseudo_corpus(seed, vocab_size), trainer=trainer)
    return tokenizer


def _init_weights(model: Any, seed: int, std: float) -> None:
    """Overwrite every parameter from a generator seeded with ``seed``.

    Independent of how transformers initialises weights, so the bytes depend only on
    the seed and the sizes: norms get ones, everything else N(0, std).
    """
    import torch

    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    with torch.no_grad():
        for _name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.ndim == 1:
                param.fill_(1.0)
            else:
                values = torch.empty(param.shape, dtype=torch.float32)
                values.normal_(mean=0.0, std=std, generator=generator)
                param.copy_(values)


def _save_kwargs(method: Any) -> dict[str, bool]:
    """``safe_serialization=True`` where the installed transformers still takes it."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return {}
    return {"safe_serialization": True} if "safe_serialization" in parameters else {}


def llama_config_values(sizes: Mapping[str, int]) -> dict[str, ConfigValue]:
    """The config.json values of a tiny model with these sizes (what the planner reads)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": sizes["vocab_size"],
        "hidden_size": sizes["hidden_size"],
        "intermediate_size": sizes["intermediate_size"],
        "num_hidden_layers": sizes["num_layers"],
        "num_attention_heads": sizes["num_heads"],
        "num_key_value_heads": sizes["num_kv_heads"],
        "head_dim": sizes["hidden_size"] // sizes["num_heads"],
        "max_position_embeddings": sizes["max_position_embeddings"],
        "tie_word_embeddings": False,
    }


def tiny_config(source: SourceBlock) -> dict[str, ConfigValue]:
    """The config.json a ``tiny`` source's model will have (what the planner reads before
    the model is generated)."""
    return {**llama_config_values(source.tiny.model_dump()), "torch_dtype": "bfloat16"}


def _write_tiny_model(out: Path, *, seed: int, sizes: Mapping[str, int]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = _train_tokenizer(seed, sizes["vocab_size"])
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=sizes["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    hf_tokenizer.chat_template = _CHAT_TEMPLATE
    trained_vocab = len(hf_tokenizer)

    config = LlamaConfig(
        **{**llama_config_values(sizes), "vocab_size": trained_vocab},
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_id=hf_tokenizer.eos_token_id,
    )
    # fork_rng: seeding for construction must not disturb the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    _init_weights(model, seed, std=config.initializer_range)
    model = model.to(torch.bfloat16)
    model.eval()
    model.save_pretrained(out, **_save_kwargs(model.save_pretrained))
    hf_tokenizer.save_pretrained(out)

    if not (out / "model.safetensors").is_file():
        raise RuntimeError(f"transformers did not write {out / 'model.safetensors'}")


def generate_tiny_model(
    dest: Path,
    *,
    seed: int = 0,
    hidden_size: int = _SIZES.hidden_size,
    num_layers: int = _SIZES.num_layers,
    num_heads: int = _SIZES.num_heads,
    num_kv_heads: int = _SIZES.num_kv_heads,
    intermediate_size: int = _SIZES.intermediate_size,
    vocab_size: int = _SIZES.vocab_size,
    max_position_embeddings: int = _SIZES.max_position_embeddings,
) -> Path:
    """Generate a small random Llama model with its tokenizer into ``dest``.

    Everything is derived from ``seed``: the weights (a ``torch.Generator``) and the
    tokenizer (byte-level BPE trained on a pseudo-word corpus from ``random.Random``),
    so the same seed and sizes give byte-identical files and another seed gives
    different weights. Writes ``config.json``, ``generation_config.json``,
    ``model.safetensors`` (bfloat16), ``tokenizer.json``, ``tokenizer_config.json`` and
    ``special_tokens_map.json`` where the installed transformers writes it.

    The model is built in a hidden sibling folder and renamed into place only when
    complete; an existing ``dest`` is replaced then, never before. ``config.json``'s
    ``vocab_size`` equals the tokenizer's length (the trained size, ``vocab_size`` when
    the corpus allows it).

    Raises:
        ValueError: a parameter is not a positive integer, ``hidden_size / num_heads``
            is not 64, ``num_heads`` is not a multiple of ``num_kv_heads`` or
            ``vocab_size`` is below the byte alphabet plus special tokens.
    """
    sizes = dict(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
    )
    _validate_tiny(sizes)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")

    dest = Path(dest)
    started = time.monotonic()
    logger.info("generating tiny Llama model (seed %d, %s) into %s", seed, sizes, dest)
    tmp = sibling_dir(dest, "tmp")
    try:
        _write_tiny_model(tmp, seed=seed, sizes=sizes)
        replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("generated tiny model in %s: done in %.1f s", dest, time.monotonic() - started)
    return dest


def tiny_parameters(source: SourceBlock) -> dict[str, int]:
    """The keyword arguments of :func:`generate_tiny_model` a ``tiny`` source asks for: its
    ``seed`` and its sizes (the manifest's ``generator``)."""
    return {"seed": source.seed, **source.tiny.model_dump()}
