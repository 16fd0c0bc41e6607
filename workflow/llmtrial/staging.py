"""Model stage: put a servable Hugging Face-format model folder in place and describe it.

A trial serves one model folder. This module produces or checks that folder and writes
a *manifest* (every file with its size and sha256) so later stages and the report can
say exactly which bytes were served.

Source kinds (the ``source`` dict of the trial config):

``tiny``
    A small Llama-architecture model generated locally and deterministically from a
    seed (random weights, a byte-level BPE tokenizer trained on a pseudo-word corpus).
    Needs no network and no download; same seed gives byte-identical files.
``local``
    An existing Hugging Face-format folder, checked and manifested in place (no copy).
``hub``
    A Hugging Face Hub repository at a revision (resolved to a commit), fetched with
    huggingface_hub into the staging folder: see :mod:`llmtrial.hub`.
``archive``
    The same repository and commit restaged from ``weights.archive_dir`` (see
    :mod:`llmtrial.weights`); a ``hub`` source uses an archive automatically too.

Heavy imports (torch, transformers, tokenizers, huggingface_hub) happen inside the
functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llmtrial.ledger import Action
from llmtrial.records import write_record

logger = logging.getLogger(__name__)

__all__ = [
    "MANIFEST_NAME",
    "TINY_PARAMETERS",
    "REQUIRED_HEAD_DIM",
    "generate_tiny_model",
    "check_local_model",
    "build_manifest",
    "verify_manifest",
    "stage_model",
    "model_config_for",
    "staged_size_estimate",
    "tiny_sizes",
]

#: Name of the manifest that :func:`stage_model` writes inside a staged folder. Hidden,
#: so :func:`build_manifest` does not list it.
MANIFEST_NAME = ".llmtrial-manifest.json"

#: Size parameters of :func:`generate_tiny_model` that a ``tiny`` source may override.
TINY_PARAMETERS: tuple[str, ...] = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)

#: Attention head size of generated models: vLLM's CPU attention backend rejects small
#: head sizes such as 16, and 64 is supported by every backend.
REQUIRED_HEAD_DIM = 64

_CHUNK = 1 << 20  # hash in 1 MiB chunks
_SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
_BYTE_ALPHABET = 256
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


# --------------------------------------------------------------------------- tiny model


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


def _save_kwargs(method: Any) -> dict[str, Any]:
    """``safe_serialization=True`` where the installed transformers still takes it."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return {}
    return {"safe_serialization": True} if "safe_serialization" in parameters else {}


def _sibling_dir(dest: Path, tag: str) -> Path:
    """A fresh hidden folder next to ``dest`` (same filesystem, so rename is atomic)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.{tag}-", dir=dest.parent))


def _llama_config_values(sizes: Mapping[str, int]) -> dict[str, Any]:
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


def tiny_sizes(source: Mapping[str, Any]) -> dict[str, int]:
    """The tiny generator's sizes: its defaults, overridden by ``source["tiny"]``."""
    defaults = inspect.signature(generate_tiny_model).parameters
    return {name: int((source.get("tiny") or {}).get(name, defaults[name].default)) for name in TINY_PARAMETERS}


def model_config_for(source: Mapping[str, Any], *, archive_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The model's config.json before the weights are staged: computed for ``tiny``, read for
    ``local``, read from the archive of the same repository and revision for ``archive`` and
    ``hub``, else for ``hub`` fetched alone (a few KiB, into the Hugging Face cache). None
    when it cannot be had (offline, the Hub unreachable), with the reason logged."""
    kind = source.get("kind")
    if kind == "tiny":
        return {**_llama_config_values(tiny_sizes(source)), "torch_dtype": "bfloat16"}
    if kind == "local":
        path = check_local_model(Path(str(source.get("path"))))
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    if kind not in ("hub", "archive") or not source.get("repo_id"):
        return None
    from llmtrial.weights import find_archive

    found = find_archive(archive_dir, str(source["repo_id"]), str(source.get("revision") or "main"))
    if found is not None and (found[0] / "config.json").is_file():
        return json.loads((found[0] / "config.json").read_text(encoding="utf-8"))
    if kind == "archive":
        return None
    from llmtrial.hub import fetch_config

    return fetch_config(str(source["repo_id"]), str(source.get("revision") or "main"))


def staged_size_estimate(source: Mapping[str, Any]) -> tuple[int, int]:
    """(bytes, files) staging will write, for the disk-headroom check before staging.

    ``tiny``: its bf16 weights plus 1 MiB for the tokenizer and configs; ``local``:
    nothing (served in place); ``hub``: not known yet (0).
    """
    if source.get("kind") != "tiny":
        return 0, 0
    s = tiny_sizes(source)
    h, layers, inter, vocab = s["hidden_size"], s["num_layers"], s["intermediate_size"], s["vocab_size"]
    head_dim = h // s["num_heads"]
    per_layer = h * h * 2 + 2 * h * s["num_kv_heads"] * head_dim + 3 * h * inter + 2 * h
    params = layers * per_layer + 2 * vocab * h + h
    return params * 2 + (1 << 20), 8


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
        **{**_llama_config_values(sizes), "vocab_size": trained_vocab},
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
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    vocab_size: int = 512,
    max_position_embeddings: int = 2048,
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
    tmp = _sibling_dir(dest, "tmp")
    try:
        _write_tiny_model(tmp, seed=seed, sizes=sizes)
        _replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("generated tiny model in %s: done in %.1f s", dest, time.monotonic() - started)
    return dest


def _replace_dir(new: Path, dest: Path) -> None:
    """Move the complete folder ``new`` to ``dest``, replacing any existing ``dest``."""
    if dest.exists() or dest.is_symlink():
        old = _sibling_dir(dest, "old")
        old.rmdir()
        os.replace(dest, old)
        try:
            os.replace(new, dest)
        except BaseException:
            os.replace(old, dest)  # put the previous model back
            raise
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    else:
        os.replace(new, dest)


# --------------------------------------------------------------------------- local model


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


# --------------------------------------------------------------------------- manifest


def visible_files(root: Path) -> Iterator[Path]:
    """Regular files under ``root``, sorted, skipping hidden files and folders."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            file = Path(dirpath) / name
            if file.is_file():
                yield file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(model_dir: Path, *, source: Mapping[str, Any]) -> dict[str, Any]:
    """Describe every file of ``model_dir``: relative POSIX path, size and sha256.

    Files are listed sorted by path; hidden files and folders are skipped. Returns
    ``{"model_dir", "source", "files": [{"path", "size", "sha256"}, ...],
    "total_bytes", "created"}`` with ``created`` an ISO-8601 UTC timestamp.
    """
    root = Path(model_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"model folder not found: {root}")
    started = time.monotonic()
    paths = sorted(visible_files(root), key=lambda f: f.relative_to(root).as_posix())
    logger.info("hashing %d files in %s", len(paths), root)
    files: list[dict[str, Any]] = []
    for file in paths:
        files.append(
            {
                "path": file.relative_to(root).as_posix(),
                "size": file.stat().st_size,
                "sha256": _sha256(file),
            }
        )
    total = sum(entry["size"] for entry in files)
    logger.info(
        "hashed %d files (%.1f MiB) in %s: done in %.1f s",
        len(files), total / (1 << 20), root, time.monotonic() - started,
    )
    return {
        "model_dir": str(root),
        "source": dict(source),
        "files": files,
        "total_bytes": total,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def verify_manifest(manifest: Mapping[str, Any], *, hashes: bool = True) -> list[str]:
    """Check the files a manifest lists; return the problems found, empty if none.

    Each problem is one readable line naming the file: missing, size mismatch or
    sha256 mismatch (hashes are only compared when sizes agree, and with ``hashes``).
    """
    problems: list[str] = []
    try:
        root = Path(manifest["model_dir"])
        entries = list(manifest["files"])
    except (KeyError, TypeError):
        return ["manifest lacks 'model_dir' or 'files'"]
    if not root.is_dir():
        return [f"model folder {root} is missing"]
    for entry in entries:
        rel = entry.get("path", "?")
        file = root / rel
        if not file.is_file():
            problems.append(f"{rel}: missing (expected at {file})")
            continue
        size = file.stat().st_size
        if size != entry.get("size"):
            problems.append(f"{rel}: size {size} bytes, manifest says {entry.get('size')}")
            continue
        if not hashes:
            continue
        digest = _sha256(file)
        if digest != entry.get("sha256"):
            problems.append(f"{rel}: sha256 {digest}, manifest says {entry.get('sha256')}")
    return problems


# --------------------------------------------------------------------------- stage


def _json_normal(value: Any) -> Any:
    """``value`` as it reads back from JSON, for comparing with a stored manifest."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _tiny_parameters(source: Mapping[str, Any], seed_default: int) -> dict[str, Any]:
    overrides = source.get("tiny") or {}
    if not isinstance(overrides, Mapping):
        raise ValueError(f"source 'tiny' must be a mapping of size parameters, got {overrides!r}")
    unknown = sorted(set(overrides) - set(TINY_PARAMETERS))
    if unknown:
        raise ValueError(
            f"unknown tiny model parameter(s) {', '.join(map(str, unknown))}; "
            f"accepted: {', '.join(TINY_PARAMETERS)}"
        )
    seed = source.get("seed", seed_default)
    return {"seed": seed, **dict(overrides)}


def _reusable(manifest_path: Path, staging_dir: Path, source: Mapping[str, Any],
              generator: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored manifest if the staged model can be reused as is, else None (logged)."""
    if not manifest_path.is_file():
        return None
    try:
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        logger.info("ignoring unreadable manifest %s: %s", manifest_path, exc)
        return None
    if not isinstance(old, dict):
        return None
    if old.get("source") != _json_normal(source) or old.get("generator") != _json_normal(generator):
        logger.info("staged model in %s came from another source; regenerating", staging_dir)
        return None
    if old.get("model_dir") != str(staging_dir.resolve()):
        logger.info("manifest %s describes another folder; regenerating", manifest_path)
        return None
    problems = verify_manifest(old)
    if problems:
        logger.info("staged model in %s fails its manifest (%s); regenerating",
                    staging_dir, "; ".join(problems))
        return None
    return old


def _staged_weights_entry(folder: Path, weights: Mapping[str, Any] | None, source: Mapping[str, Any],
                          **extra: Any) -> dict[str, Any]:
    """The ``weights_staged`` ledger entry: what cleanup keeps, archives or deletes, and where."""
    weights = weights or {}
    archive_dir = weights.get("archive_dir")
    return {"path": str(folder.resolve()), "after": weights.get("after", "keep"),
            "archive_dir": str(Path(archive_dir).resolve()) if archive_dir else None,
            "kind": source.get("kind"), **extra}


def _reuse_staged_hub(folder: Path, source: Mapping[str, Any], commit: str | None) -> dict[str, Any] | None:
    """The manifest of a hub model already staged in ``folder`` from the same repository,
    commit (or, with no commit known, the same revision) and patterns, if every file is
    unchanged since it verified."""
    from llmtrial.hub import VerifiedFiles

    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
        hub = manifest["hub"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    same = (hub.get("repo_id") == source.get("repo_id")
            and (hub.get("commit") == commit if commit else str(source.get("revision")) in (hub.get("revision"), hub.get("commit")))
            and all(manifest["source"].get(k) == _json_normal(source.get(k))
                    for k in ("allow_patterns", "ignore_patterns")))
    verified = VerifiedFiles(folder)
    if not same or any(verified.sha256(f["path"], folder / f["path"], sha256=f["sha256"]) is None
                       for f in manifest["files"]):
        return None
    return manifest


def _check_headroom(needs: list[tuple[str, Any, int, int]], disk: Mapping[str, Any] | None,
                    what: str) -> list[dict[str, Any]]:
    from llmtrial.hub import HeadroomError
    from llmtrial.preflight import headroom_by_filesystem, headroom_message

    filesystems = headroom_by_filesystem(needs, disk or {"reserve_fraction": 0.10, "reserve_min_gib": 5})
    short = [fs for fs in filesystems if not fs["ok"]]
    for fs in filesystems:
        logger.info("headroom %s", headroom_message(fs))
    if short:
        raise HeadroomError(f"not enough disk to stage {what}, nothing was written: "
                            + "; ".join(headroom_message(fs) for fs in short)
                            + "; free space or lower disk.reserve_* (the default keeps the kubelet's "
                            "10 % eviction threshold)")
    return filesystems


def _hub_commit(source: Mapping[str, Any], revision: str) -> tuple[str | None, str | None]:
    """(commit, why the Hub is not used): the commit ``revision`` names, from the Hub unless
    the source is an archive, HF_HUB_OFFLINE is set or the Hub cannot be reached."""
    from llmtrial import hub

    if hub.COMMIT.match(revision):
        return revision, None
    if source.get("kind") == "archive":
        return None, "the source is an archive"
    if hub.offline():
        return None, "HF_HUB_OFFLINE is set"
    try:
        commit = hub.resolve_commit(str(source["repo_id"]), revision)
    except Exception as exc:
        if not hub.unreachable(exc):
            raise
        return None, f"the Hub at {hub.endpoint()} cannot be reached ({type(exc).__name__})"
    logger.info("%s@%s is commit %s", source["repo_id"], revision, commit)
    return commit, None


def _restage_from_archive(archive: Path, archived: Mapping[str, Any], folder: Path, verified: Any,
                          disk: Mapping[str, Any] | None, record_write: Any) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """Copy (hashing) what ``folder`` lacks from an archive; (files, fetch figures, headroom)."""
    from llmtrial.weights import copy_verified

    entries = list(archived["files"])
    todo = [f for f in entries if verified.sha256(f["path"], folder / f["path"], sha256=f["sha256"]) is None]
    todo_bytes = sum(f["size"] for f in todo)
    what = f"{archived['hub']['repo_id']}@{archived['hub']['commit']}"
    headroom = _check_headroom([("staging", folder, todo_bytes, len(todo))], disk, f"{what} from the archive {archive}")
    record_write()
    _remove_stale(folder, {f["path"] for f in entries})
    logger.info("restaging %s from the archive %s (%d files, %.1f MiB to copy); the Hub is not used",
                what, archive, len(todo), todo_bytes / (1 << 20))
    started = time.monotonic()
    for f in copy_verified(archive, folder, todo):
        verified.add(f["path"], folder / f["path"], f["sha256"])
    files = [{k: f[k] for k in ("path", "size", "sha256", "blob_id") if k in f} for f in entries]
    fetch = {"files_copied": len(todo), "bytes_copied": todo_bytes, "files_downloaded": 0, "bytes_downloaded": 0,
             "seconds": round(time.monotonic() - started, 3), "restaged_from": str(archive)}
    return files, fetch, headroom


def _fetch_from_hub(source: Mapping[str, Any], commit: str, folder: Path, verified: Any,
                    disk: Mapping[str, Any] | None, weights: Mapping[str, Any] | None,
                    record_write: Any) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """Fetch (verifying) what ``folder`` lacks from the Hub; (files, fetch figures, headroom)."""
    from huggingface_hub import constants

    from llmtrial import hub

    repo_id = str(source["repo_id"])
    remote = hub.list_files(repo_id, commit, allow_patterns=source.get("allow_patterns"),
                            ignore_patterns=source.get("ignore_patterns"))
    record_write()
    todo, removed_bad = hub.plan_fetch(folder, remote, verified)
    needs = [("staging", folder, sum(f.size for f in todo), len(todo)), ("cache", constants.HF_HUB_CACHE, 0, 0)]
    archive_dir = (weights or {}).get("archive_dir")
    if (weights or {}).get("after") == "archive" and archive_dir:
        needs.append(("archive", archive_dir, sum(f.size for f in remote), len(remote)))
    headroom = _check_headroom(needs, disk, f"{repo_id}@{commit}")
    _remove_stale(folder, {f.path for f in remote})
    logger.info("%d of %d files already staged and verified; %d to fetch", len(remote) - len(todo), len(remote), len(todo))
    fetch = hub.download(repo_id, commit, todo, folder, verified, **hub.settings(source)) if todo else \
        {"files_downloaded": 0, "bytes_downloaded": 0, "seconds": 0.0, "bytes_per_s": None, "retries": []}
    fetch.update(files_reused=len(remote) - len(todo), corrupt_removed=removed_bad)
    return hub.manifest_files(folder, remote, verified), fetch, headroom


def _stage_hub(source: Mapping[str, Any], folder: Path, *, disk: Mapping[str, Any] | None,
               weights: Mapping[str, Any] | None, record_write: Any) -> dict[str, Any]:
    """Stage a ``hub`` (or ``archive``) source into ``folder``: a staged copy that verifies,
    else the archive of the same repository and commit, else the Hub. See llmtrial.hub."""
    from llmtrial import hub
    from llmtrial.weights import find_archive

    repo_id = source.get("repo_id")
    if not repo_id:
        raise ValueError(f"source kind {source.get('kind')!r} needs 'repo_id' (such as Qwen/Qwen3-8B)")
    revision = str(source.get("revision") or "main")
    archive_dir = (weights or {}).get("archive_dir")
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    with hub.stage_lock(folder):
        orphans, _ = hub.remove_orphans(folder)
        commit, why_no_hub = _hub_commit(source, revision)
        staged = _reuse_staged_hub(folder, source, commit)
        if staged is not None:
            record_write(_staged_weights_entry(folder, weights, source, repo_id=repo_id, commit=staged["hub"]["commit"]))
            logger.info("reusing staged %s@%s in %s (every file verified): done in %.1f s",
                        repo_id, staged["hub"]["commit"], folder, time.monotonic() - started)
            return {**staged, "fetch": {"files_downloaded": 0, "bytes_downloaded": 0, "reused": True,
                                        "orphans_removed": orphans}}
        found = find_archive(archive_dir, repo_id, commit or revision)
        if found is None and commit is None:
            raise hub.HubError(f"cannot stage {repo_id}@{revision}: {why_no_hub}, and there is no verified copy "
                               f"in {folder} and no archive of it in {archive_dir or '(no archive_dir)'}")
        resolved_by = "given" if hub.COMMIT.match(revision) else "hub" if commit else "archive"
        commit = commit or found[1]["hub"]["commit"]  # type: ignore[index]
        ledger_entry = _staged_weights_entry(folder, weights, source, repo_id=repo_id, commit=commit)
        verified = hub.VerifiedFiles(folder)
        if found is not None:
            files, fetch, headroom = _restage_from_archive(found[0], found[1], folder, verified, disk,
                                                           lambda: record_write(ledger_entry))
        else:
            files, fetch, headroom = _fetch_from_hub(source, commit, folder, verified, disk, weights,
                                                     lambda: record_write(ledger_entry))
        fetch["orphans_removed"] = orphans
        manifest = {"model_dir": str(folder.resolve()), "source": _json_normal(source),
                    "hub": {"repo_id": repo_id, "revision": revision, "commit": commit, "endpoint": hub.endpoint(),
                            "token": hub.token_state(), "resolved_by": resolved_by},
                    "files": files, "total_bytes": sum(f["size"] for f in files),
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "fetch": fetch, "headroom": headroom}
        write_record(folder / MANIFEST_NAME, manifest, schema="manifest")
    logger.info("staged %s@%s in %s: done in %.1f s", repo_id, commit, folder, time.monotonic() - started)
    return manifest


def _remove_stale(folder: Path, keep: set[str]) -> None:
    """Remove visible files that are not part of the model (another revision's shards), so
    a server never loads them."""
    from llmtrial.hub import forget_download, stale_files

    for rel in stale_files(folder, keep):
        logger.warning("removing %s from %s: not part of the selected files", rel, folder)
        forget_download(folder, rel)


def stage_model(source: Mapping[str, Any], staging_dir: Path, *, seed_default: int = 0,
                ledger: Any | None = None, root: Path | None = None, weights: Mapping[str, Any] | None = None,
                disk: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Stage the model a trial serves and return its manifest.

    Dispatches on ``source["kind"]``:

    * ``"tiny"``: generate with :func:`generate_tiny_model` into ``staging_dir`` from
      ``source["seed"]`` (``seed_default`` when absent) and the size overrides in
      ``source["tiny"]`` (keys from :data:`TINY_PARAMETERS`), then write the manifest to
      ``staging_dir / MANIFEST_NAME``. A model already staged there is reused, without
      regenerating, when that manifest came from the same source and still verifies.
      The manifest also carries ``"generator"``: the effective seed and overrides.
    * ``"local"``: check ``source["path"]`` with :func:`check_local_model` and manifest
      it in place (no copy; nothing is written, ``staging_dir`` is unused).
    * ``"hub"``: resolve ``revision`` to its commit and fetch the selected files with
      huggingface_hub (a verified staged copy or an archive of that commit is used
      instead); ``"archive"``: the same from ``weights.archive_dir`` only, never the Hub.

    ``ledger`` (a :class:`llmtrial.ledger.Ledger`) gets a ``weights_staged`` entry before
    the first byte is written, with ``root`` (the staging root cleanup must stay inside)
    and ``weights`` (``after``: keep, archive or delete; ``archive_dir``). ``disk`` holds
    the reserve settings of the headroom check.

    Raises:
        ValueError: unknown kind, missing ``path`` or ``repo_id``, or bad tiny parameters.
        FileNotFoundError: a ``local`` model folder or one of its files is missing.
        llmtrial.hub.HeadroomError: a filesystem would fall below its reserve.
        llmtrial.hub.HubError, llmtrial.hub.VerificationError: the Hub failed or a file
            does not match its metadata.
    """
    kind = source.get("kind")
    started = time.monotonic()
    folder = Path(staging_dir)

    def record_write(entry: dict[str, Any]) -> None:
        if ledger is not None:  # with all cleanup needs: the root it stays inside, the archive's reserve
            entry.update(root=str(Path(root or folder.parent).resolve()), disk=dict(disk) if disk else None)
            ledger.append(Action.WEIGHTS_STAGED, **entry)

    if kind == "tiny":
        generator = _tiny_parameters(source, seed_default)
        manifest_path = folder / MANIFEST_NAME
        reused = _reusable(manifest_path, folder, source, generator)
        record_write(_staged_weights_entry(folder, weights, source))
        if reused is not None:
            logger.info("reusing staged tiny model in %s (manifest verifies): done in %.1f s",
                        folder, time.monotonic() - started)
            return reused
        generate_tiny_model(folder, **generator)
        manifest = build_manifest(folder, source=_json_normal(source))
        manifest["generator"] = _json_normal(generator)
        write_record(manifest_path, manifest, schema="manifest")
        logger.info("staged tiny model in %s: done in %.1f s", folder, time.monotonic() - started)
        return manifest
    if kind == "local":
        if not source.get("path"):
            raise ValueError("source kind 'local' needs a 'path' to a Hugging Face-format model folder")
        model_dir = check_local_model(Path(str(source["path"])))
        manifest = build_manifest(model_dir, source=_json_normal(source))
        logger.info("staged local model %s in place: done in %.1f s", model_dir, time.monotonic() - started)
        return manifest
    if kind in ("hub", "archive"):
        return _stage_hub(source, folder, disk=disk, weights=weights, record_write=record_write)
    raise ValueError(f"unknown model source kind {kind!r}; expected 'tiny', 'local', 'hub' or 'archive'")
