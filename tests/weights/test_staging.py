"""Tests of the model stage: tiny model generation (llmtrial.weights.tiny), local checks
(llmtrial.weights.model_source), manifests (llmtrial.weights.manifest) and llmtrial.weights.staging.stage_model."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conftest import written
from llmtrial.core.record_models import ManifestRecord
from llmtrial.core.trial_config import SourceBlock
from llmtrial.weights import tiny
from llmtrial.weights.manifest import MANIFEST_NAME, build_manifest, verify_manifest
from llmtrial.weights.model_source import check_local_model
from llmtrial.weights.staging import stage_model
from llmtrial.weights.tiny import generate_tiny_model

SENTENCE = "Hello, world! The tiny model serves 42 requests; naïve ünïcode ✓ stays intact."


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def recorded(source: SourceBlock) -> dict:
    """``model.source`` as a manifest holds it: the block with its defaults, keys sorted."""
    return json.loads(json.dumps(source.model_dump(mode="json"), sort_keys=True))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture()
def model_copy(tiny_model: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(tiny_model, dest)
    return dest


# --------------------------------------------------------------------------- generation


def test_generated_files(tiny_model: Path) -> None:
    names = {p.name for p in tiny_model.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.endswith(".bin") for n in names)
    siblings = [p.name for p in tiny_model.parent.iterdir()]
    assert siblings == ["model"], "no temporary folder may be left next to the model"


def test_same_seed_is_byte_identical_other_seed_differs(tiny_model: Path, tmp_path: Path) -> None:
    again = generate_tiny_model(tmp_path / "again", seed=0)
    assert file_hashes(again) == file_hashes(tiny_model)
    other = generate_tiny_model(tmp_path / "other", seed=1)
    assert sha256(other / "model.safetensors") != sha256(tiny_model / "model.safetensors")


def test_config(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((tiny_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config.get("head_dim", 64) == 64
    assert config["num_attention_heads"] == 4
    assert config["num_key_value_heads"] == 2
    assert config["num_hidden_layers"] == 4
    assert config["vocab_size"] == 512
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert len(tokenizer) == config["vocab_size"]
    assert config["bos_token_id"] == tokenizer.bos_token_id
    assert config["eos_token_id"] == tokenizer.eos_token_id


def test_tokenizer_round_trip(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == ("<s>", "</s>", "<unk>")
    ids = tokenizer.encode(SENTENCE, add_special_tokens=False)
    assert ids and max(ids) < len(tokenizer)
    assert tokenizer.decode(ids) == SENTENCE


def test_model_forward(tiny_model: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = LlamaForCausalLM.from_pretrained(tiny_model)
    assert model.dtype == torch.bfloat16
    ids = torch.tensor([tokenizer.encode(SENTENCE, add_special_tokens=False)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits.float()).all()


def test_head_dim_16_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hidden_size") as info:
        generate_tiny_model(tmp_path / "m", hidden_size=64, num_heads=4)
    assert "num_heads" in str(info.value)
    assert not (tmp_path / "m").exists()


def test_kv_heads_must_divide_heads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        generate_tiny_model(tmp_path / "m", num_kv_heads=3)


def test_interrupted_generation_keeps_existing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "old.txt").write_text("previous model")

    def broken(out: Path, **_: object) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny, "_write_tiny_model", broken)
    with pytest.raises(KeyboardInterrupt):
        generate_tiny_model(dest, seed=0)
    assert [p.name for p in dest.iterdir()] == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_existing_dest_replaced(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "stale.txt").write_text("stale")
    generate_tiny_model(dest, seed=0, num_layers=1)
    assert not (dest / "stale.txt").exists()
    assert (dest / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


# --------------------------------------------------------------------------- local check


def test_check_local_model_ok(model_copy: Path) -> None:
    assert check_local_model(model_copy) == model_copy.resolve()


def test_check_local_model_missing_config(model_copy: Path) -> None:
    (model_copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        check_local_model(model_copy)


def test_check_local_model_bad_config(model_copy: Path) -> None:
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        check_local_model(model_copy)
    (model_copy / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ValueError, match="model_type"):
        check_local_model(model_copy)


def test_check_local_model_no_weights(model_copy: Path) -> None:
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"\.safetensors"):
        check_local_model(model_copy)


def test_check_local_model_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        check_local_model(tmp_path / "nowhere")


def test_check_local_model_warns_without_tokenizer(model_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    (model_copy / "tokenizer.json").unlink()
    with caplog.at_level("WARNING", logger="llmtrial.weights.model_source"):
        check_local_model(model_copy)
    assert "tokenizer" in caplog.text


# --------------------------------------------------------------------------- manifest


def test_manifest_lists_every_file(model_copy: Path) -> None:
    (model_copy / ".hidden").write_text("x")
    (model_copy / "sub").mkdir()
    (model_copy / "sub" / "extra.txt").write_text("extra")
    (model_copy / ".git").mkdir()
    (model_copy / ".git" / "HEAD").write_text("ref")
    source = SourceBlock(kind="local", path=str(model_copy))
    manifest = written(build_manifest(model_copy, source=source))

    assert manifest["model_dir"] == str(model_copy.resolve())
    assert manifest["source"] == recorded(source) and list(manifest["source"]) == sorted(manifest["source"])
    paths = [f["path"] for f in manifest["files"]]
    expected = sorted(
        p.relative_to(model_copy).as_posix()
        for p in model_copy.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(model_copy).parts)
    )
    assert paths == expected
    assert "sub/extra.txt" in paths and ".hidden" not in paths
    for entry in manifest["files"]:
        assert entry["size"] == (model_copy / entry["path"]).stat().st_size
    by_path = {f["path"]: f for f in manifest["files"]}
    assert by_path["config.json"]["sha256"] == hashlib.sha256((model_copy / "config.json").read_bytes()).hexdigest()
    assert by_path["model.safetensors"]["sha256"] == sha256(model_copy / "model.safetensors")
    assert manifest["total_bytes"] == sum(f["size"] for f in manifest["files"])
    created = datetime.fromisoformat(manifest["created"])
    assert created.utcoffset() == UTC.utcoffset(None)
    assert verify_manifest(ManifestRecord.model_validate(manifest)) == []


def test_verify_manifest_reports_problems(model_copy: Path) -> None:
    manifest = build_manifest(model_copy, source=SourceBlock(kind="local"))
    # Same size, different bytes: a sha256 mismatch.
    data = bytearray((model_copy / "tokenizer.json").read_bytes())
    data[-2] = ord(" ") if data[-2] != ord(" ") else ord("\t")
    (model_copy / "tokenizer.json").write_bytes(bytes(data))
    # Different size.
    with (model_copy / "generation_config.json").open("a") as fh:
        fh.write("\n")
    (model_copy / "config.json").unlink()

    problems = verify_manifest(manifest)
    assert len(problems) == 3
    text = "\n".join(problems)
    assert any("tokenizer.json" in p and "sha256" in p for p in problems), text
    assert any("generation_config.json" in p and "size" in p for p in problems), text
    assert any("config.json" in p and "missing" in p for p in problems), text


# --------------------------------------------------------------------------- stage_model


def test_stage_tiny_reuses_then_regenerates(tmp_path: Path) -> None:
    staging_dir = tmp_path / "staged"
    source = SourceBlock.model_validate({"kind": "tiny", "seed": 0, "tiny": {"num_layers": 1}})
    first = stage_model(source, staging_dir)
    assert (staging_dir / MANIFEST_NAME).is_file()
    assert MANIFEST_NAME not in [f.path for f in first.files]
    assert first.source == recorded(source)
    assert json.loads((staging_dir / "config.json").read_text())["num_hidden_layers"] == 1
    mtimes = {p.name: p.stat().st_mtime_ns for p in staging_dir.iterdir()}

    second = stage_model(source.model_copy(), staging_dir)
    assert {p.name: p.stat().st_mtime_ns for p in staging_dir.iterdir()} == mtimes
    assert written(second) == written(first)

    weights = sha256(staging_dir / "model.safetensors")
    third = stage_model(source.model_copy(update={"seed": 1}), staging_dir)
    assert third.source["seed"] == 1
    assert sha256(staging_dir / "model.safetensors") != weights
    assert verify_manifest(third) == []
    assert json.loads((staging_dir / MANIFEST_NAME).read_text())["source"]["seed"] == 1


def test_the_tiny_manifest_is_its_model_written_as_the_dict_was(tmp_path: Path) -> None:
    staging_dir = tmp_path / "staged"
    source = SourceBlock.model_validate({"kind": "tiny", "seed": 2, "tiny": {"num_layers": 1}})
    manifest = stage_model(source, staging_dir)
    assert isinstance(manifest, ManifestRecord)
    names = sorted(p.name for p in staging_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [{"path": n, "size": (staging_dir / n).stat().st_size, "sha256": sha256(staging_dir / n)} for n in names]
    expected = {"model_dir": str(staging_dir.resolve()), "source": recorded(source), "files": files,
                "total_bytes": sum(f["size"] for f in files), "created": manifest.created,
                "generator": {"seed": 2, **source.tiny.model_dump()}}
    assert expected["generator"] == tiny.tiny_parameters(source) and expected["generator"]["num_layers"] == 1
    assert written(manifest) == json.loads(json.dumps(expected))
    stored = json.loads((staging_dir / MANIFEST_NAME).read_text())
    assert stored == written(manifest) and list(stored) == list(expected)  # the order the dict had
    assert written(stage_model(source.model_copy(), staging_dir)) == stored  # reused: the stored manifest


def test_stage_tiny_regenerates_tampered(tmp_path: Path) -> None:
    staging_dir = tmp_path / "staged"
    source = SourceBlock.model_validate({"kind": "tiny", "seed": 3, "tiny": {"num_layers": 1}})
    stage_model(source, staging_dir)
    good = sha256(staging_dir / "config.json")
    (staging_dir / "config.json").write_text("{}")
    manifest = stage_model(source, staging_dir)
    assert sha256(staging_dir / "config.json") == good
    assert verify_manifest(manifest) == []


def test_stage_tiny_rejects_unknown_override(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_experts"):
        stage_model(SourceBlock.model_validate({"kind": "tiny", "tiny": {"num_experts": 8}}), tmp_path / "s")


def test_stage_local_in_place(model_copy: Path, tmp_path: Path) -> None:
    source = SourceBlock(kind="local", path=str(model_copy))
    manifest = stage_model(source, tmp_path / "unused")
    assert manifest.model_dir == str(model_copy.resolve())
    assert manifest.source == recorded(source)
    assert {f.path for f in manifest.files} == {p.name for p in model_copy.iterdir()}
    assert not (tmp_path / "unused").exists()
    assert not (model_copy / MANIFEST_NAME).exists()


def test_stage_local_missing_config(model_copy: Path, tmp_path: Path) -> None:
    (model_copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        stage_model(SourceBlock(kind="local", path=str(model_copy)), tmp_path / "s")


def test_stage_hub_without_a_repository_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="source kind 'hub' needs 'repo_id'"):
        stage_model(SourceBlock(kind="hub", revision="main"), tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_stage_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ftp"):
        SourceBlock.model_validate({"kind": "ftp"})
