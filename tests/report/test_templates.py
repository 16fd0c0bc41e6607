"""The report's templates compiled once per template source and Jinja version, kept in the user's cache
folder (llmtrial.report.templates): the next render loads the compiled code, an edited template is
compiled again, and a cache folder that cannot be written only costs the compile."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from llmtrial.core.resources import CACHE_ENV
from llmtrial.report.render import report_environment
from llmtrial.report.templates import bytecode_cache, template_environment


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self, *args, **kwargs):
        raise AssertionError("compiled a template the cache holds")
    monkeypatch.setattr(jinja2.Environment, "compile", refuse)


def test_the_report_template_is_compiled_once_and_loaded_from_the_cache_after(cache, monkeypatch):
    first = report_environment().get_template("report.html.j2")
    kept = list(cache.glob("templates/jinja2-*/*.cache"))
    assert len(kept) == 1
    no_compiling(monkeypatch)
    again = report_environment().get_template("report.html.j2")  # a new environment, as the next trial's
    assert again.filename == first.filename


def test_an_edited_template_is_compiled_again_and_renders_its_new_text(cache, tmp_path, monkeypatch):
    folder = tmp_path / "templates"
    folder.mkdir()
    page = folder / "page.html.j2"
    page.write_text("<p>{{ x }} before</p>")
    assert template_environment(folder).get_template("page.html.j2").render(x="<b>") == "<p>&lt;b&gt; before</p>"
    page.write_text("<p>{{ x }} after</p>")
    assert template_environment(folder).get_template("page.html.j2").render(x=1) == "<p>1 after</p>"
    no_compiling(monkeypatch)
    assert template_environment(folder).get_template("page.html.j2").render(x=2) == "<p>2 after</p>"


def test_a_cache_folder_that_cannot_be_made_leaves_rendering_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    assert bytecode_cache() is None
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "page.html.j2").write_text("<p>{{ x }}</p>")
    env = template_environment(folder)
    assert env.get_template("page.html.j2").render(x="<i>") == "<p>&lt;i&gt;</p>"
    with pytest.raises(jinja2.UndefinedError):  # an undefined name stays an error, as with the cache
        env.get_template("page.html.j2").render()


def test_a_compiled_template_that_cannot_be_written_is_a_warning_and_the_page_renders(cache, tmp_path, monkeypatch,
                                                                                         caplog):
    def full(self, bucket):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(jinja2.FileSystemBytecodeCache, "dump_bytecode", full)
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "page.html.j2").write_text("<p>{{ x }}</p>")
    assert template_environment(folder).get_template("page.html.j2").render(x=3) == "<p>3</p>"
    assert "was not kept" in caplog.text and "No space left on device" in caplog.text
