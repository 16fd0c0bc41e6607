"""A model's source before it is staged: its config.json, its weight bytes, its folder.

The planner and preflight need to know the model before the model stage has run: the
config.json (computed for ``tiny``, read for ``local``, read from an archive or fetched
alone from the Hub for ``hub``, read from the file's header for ``gguf``), the weight bytes to plan on (staged files first, the
Hub's own file sizes second) and the bytes staging will write. Nothing here writes into
the staging folder.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from llmtrial.core.trial_config import SourceBlock
from llmtrial.core.units import MiB
from llmtrial.plan.checkpoint import WeightsSize
from llmtrial.weights import gguf, hub
from llmtrial.weights.policy import find_archive
from llmtrial.weights.tiny import tiny_config

logger = logging.getLogger(__name__)

__all__ = ["check_local_model", "model_config_for", "staged_size_estimate", "planned_weights", "weights_size"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def check_local_model(path: Path) -> Path:
    """Check that ``path`` is a Hugging Face-format model folder and return it resolved.

    Requires ``config.json`` (JSON with ``architectures`` or ``model_type``) and at
    least one ``*.safetensors`` or ``*.bin`` weight file at the top level. Missing
    tokenizer files only log a warning (vLLM can take a tokenizer from elsewhere).

    Raises:
        FileNotFoundError: the folder, its ``config.json`` or any weight file is missing.
        ValueError: the path is not a folder, or ``config.json`` is not valid JSON or
            names neither ``architectures`` nor ``model_type``.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model folder not found: {p}")
    if not p.is_dir():
        raise ValueError(f"model path is not a folder: {p}")
    config_path = p / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"model folder {p} has no config.json (expected {config_path})")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{config_path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or not (config.get("architectures") or config.get("model_type")):
        raise ValueError(f"{config_path} names neither 'architectures' nor 'model_type'")
    weights = sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin"))
    if not weights:
        raise FileNotFoundError(
            f"model folder {p} has no weight file (*.safetensors or *.bin) next to config.json"
        )
    if not any((p / name).is_file() for name in _TOKENIZER_FILES):
        logger.warning(
            "model folder %s has no tokenizer file (%s); the server needs a tokenizer from elsewhere",
            p,
            ", ".join(_TOKENIZER_FILES),
        )
    return p.resolve()


def model_config_for(src: SourceBlock, *, archive_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The model's config.json before the weights are staged: computed for ``tiny``, read for
    ``local``, read from the archive of the same repository and revision for ``archive`` and
    ``hub``, else for ``hub`` fetched alone (a few KiB, into the Hugging Face cache). None
    when it cannot be had (offline, the Hub unreachable), with the reason logged."""
    if src.kind == "tiny":
        return tiny_config(src)
    if src.kind == "gguf":  # with the dtype staging dequantizes to, as the staged config.json says
        return {**gguf.gguf_config(gguf.read_header(gguf.find_gguf(src))), "torch_dtype": src.dtype}
    if src.kind == "local":
        path = check_local_model(Path(str(src.path)))
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    if src.kind not in ("hub", "archive") or not src.repo_id:
        return None
    found = find_archive(archive_dir, src.repo_id, src.revision)
    if found is not None and (found[0] / "config.json").is_file():
        return json.loads((found[0] / "config.json").read_text(encoding="utf-8"))
    if src.kind == "archive":
        return None
    return hub.fetch_config(src.repo_id, src.revision)


def staged_size_estimate(src: SourceBlock) -> tuple[int, int]:
    """(bytes, files) staging will write, for the disk-headroom check before staging.

    ``tiny``: its bf16 weights plus 1 MiB for the tokenizer and configs; ``gguf``: its
    dequantized weights plus 8 MiB; ``local``: nothing (served in place); ``hub``: not
    known yet (0).
    """
    if src.kind == "gguf":
        return gguf.staged_size(gguf.read_header(gguf.find_gguf(src)), src.dtype)
    if src.kind != "tiny":
        return 0, 0
    s = src.tiny
    h, layers, inter, vocab = s.hidden_size, s.num_layers, s.intermediate_size, s.vocab_size
    head_dim = h // s.num_heads
    per_layer = h * h * 2 + 2 * h * s.num_kv_heads * head_dim + 3 * h * inter + 2 * h
    params = layers * per_layer + 2 * vocab * h + h
    return params * 2 + MiB, 8


def weights_size(model_dir: str | Path) -> WeightsSize | None:
    """Weight bytes of a model folder: its safetensors index's total_size, else the weight files' sizes."""
    d = Path(model_dir)
    if not d.is_dir():
        return None
    index = d / "model.safetensors.index.json"
    if index.exists():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if total:
            return WeightsSize(int(total), "measured", f"staged files ({index.name} total_size)")
    files = list(d.glob("*.safetensors")) or list(d.glob("*.bin"))
    size = sum(f.stat().st_size for f in files)
    return WeightsSize(size, "measured", f"staged files ({len(files)} weight files in {d})") if size else None


def planned_weights(src: SourceBlock, archive_dir: str | Path | None = None) -> WeightsSize | None:
    """The weight bytes to plan on before staging: the folder's files for ``local``, the header's
    weight count in the staged dtype for ``gguf``, an archive's files for ``hub``/``archive`` when
    one holds the revision, else the Hub's file sizes for ``hub``. None (the planner estimates from config.json) for ``tiny`` or when the
    Hub cannot say."""
    if src.kind == "local":
        return weights_size(str(src.path))
    if src.kind == "gguf":
        file = gguf.find_gguf(src)
        header = gguf.read_header(file)
        return WeightsSize(gguf.dequantized_bytes(header, src.dtype), "measured",
                           f"{file.name}: {header.parameters:,} weights in its header, dequantized to {src.dtype}")
    if src.kind not in ("hub", "archive") or not src.repo_id:
        return None
    found = find_archive(archive_dir, src.repo_id, src.revision)
    if found is not None:
        return weights_size(found[0])
    if src.kind == "archive":
        return None
    sized = hub.weight_bytes(src.repo_id, src.revision, allow_patterns=src.allow_patterns,
                             ignore_patterns=src.ignore_patterns)
    return WeightsSize(sized[0], "measured", sized[1]) if sized else None
