"""The kept generations of tiny models (llmtrial.weights.tiny_cache): a staging of a model generated
before copies the same bytes, checked; anything else generates."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from llmtrial.core.resources import CACHE_ENV
from llmtrial.core.trial_config import SourceBlock
from llmtrial.weights import tiny, tiny_cache
from llmtrial.weights.staging import stage_model

ONE_LAYER = {"kind": "tiny", "seed": 5, "tiny": {"num_layers": 1}}


def files(folder: Path) -> dict[str, str]:
    """The model's files (not the manifest) by name, with their SHA-256."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.startswith(".")}


@pytest.fixture
def generations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A cache of the test's own, and the folders the generator really wrote (every call of it)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    calls: list[Path] = []
    generate = tiny.generate_tiny_model

    def counted(dest, **params):
        calls.append(Path(dest))
        return generate(dest, **params)

    monkeypatch.setattr(tiny, "generate_tiny_model", counted)
    return calls


def test_a_second_staging_of_the_same_model_copies_the_kept_generation_byte_for_byte(tmp_path, generations, caplog):
    source = SourceBlock.model_validate(ONE_LAYER)
    first = stage_model(source, tmp_path / "a")
    with caplog.at_level(logging.INFO, logger="llmtrial.weights.tiny_cache"):
        second = stage_model(source.model_copy(), tmp_path / "b")
    assert len(generations) == 1  # the first staging generated, the second copied
    assert files(tmp_path / "b") == files(tmp_path / "a") and len(files(tmp_path / "a")) >= 5
    assert [(f.path, f.sha256) for f in second.files] == [(f.path, f.sha256) for f in first.files]
    assert second.model_dir == str((tmp_path / "b").resolve())  # its own manifest, of its own folder
    key = tiny_cache.generation_key(tiny.tiny_parameters(source))
    assert f"copied the tiny model from {tmp_path / 'cache' / 'tiny' / key}" in caplog.text
    fresh = tiny.generate_tiny_model(tmp_path / "fresh", **tiny.tiny_parameters(source))
    assert files(fresh) == files(tmp_path / "b")  # what a generation writes now, byte for byte


def test_another_seed_size_or_library_version_is_another_generation(tmp_path, generations, monkeypatch):
    source = SourceBlock.model_validate(ONE_LAYER)
    stage_model(source, tmp_path / "a")
    stage_model(source.model_copy(update={"seed": 6}), tmp_path / "b")
    stage_model(SourceBlock.model_validate({**ONE_LAYER, "tiny": {"num_layers": 2}}), tmp_path / "c")
    assert len(generations) == 3 and len({hashlib.sha256(Path(d, "model.safetensors").read_bytes()).digest()
                                          for d in (tmp_path / "a", tmp_path / "b", tmp_path / "c")}) == 3
    params = tiny.tiny_parameters(source)
    before = tiny_cache.generation_key(params)
    monkeypatch.setattr(tiny_cache, "_version", lambda name: "0.0-other" if name == "transformers" else None)
    assert tiny_cache.generation_key(params) != before


def test_a_kept_model_changed_on_disk_is_removed_and_generated_again(tmp_path, generations, caplog):
    source = SourceBlock.model_validate(ONE_LAYER)
    stage_model(source, tmp_path / "a")
    kept = tmp_path / "cache" / "tiny" / tiny_cache.generation_key(tiny.tiny_parameters(source))
    with (kept / "model.safetensors").open("r+b") as f:  # one byte of the weights flipped
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="llmtrial.weights.tiny_cache"):
        stage_model(source.model_copy(), tmp_path / "b")
    assert len(generations) == 2 and "does not match its hashes: removed, generating again" in caplog.text
    assert files(tmp_path / "b") == files(tmp_path / "a")
    kept_files = files(kept)
    assert kept_files.pop(tiny_cache.HASHES) and kept_files == files(tmp_path / "a")  # kept again, intact


def test_a_cache_that_cannot_be_written_does_not_fail_staging(tmp_path, generations, monkeypatch, caplog):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    source = SourceBlock.model_validate(ONE_LAYER)
    with caplog.at_level(logging.WARNING, logger="llmtrial.weights.tiny_cache"):
        manifest = stage_model(source, tmp_path / "a")
    assert len(generations) == 1 and manifest.files and "tiny model not kept in" in caplog.text
    assert "the next staging generates it again" in caplog.text
