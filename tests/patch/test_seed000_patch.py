"""Seed 000's own vLLM patch (workflow/llmtrial/patches/seed000-offload-reinit) on the file it is written
for: vLLM 0.17.1's vllm/v1/worker/gpu_model_runner.py, shipped in tests/data/vllm-0.17.1/ and proven the
released file by its line of the wheel's RECORD.

Mode file runs through the patch stage's own functions on a distribution of the test's own (a
site-packages folder holding that file and a vllm-0.17.1.dist-info), never on the installed vLLM. The
behaviour of both forms runs for real: the method is cut out of the real file (and of the patched one)
and called on a runner double (tests/runner_doubles.py); the hook, from the plugin folder the patch stage
writes in mode plugin and loaded through its entry point as vLLM loads general plugins, wraps that same
original method in a stand-in module, in a fresh interpreter (tests/programs/call_runner_hook.py). No
vLLM is imported."""

from __future__ import annotations

import ast
import base64
import difflib
import gzip
import hashlib
import importlib.metadata as md
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
import yaml

import runner_doubles
from conftest import DATA, REPO
from llmtrial.config import check_config, configuration_spec, load_config
from llmtrial.core.ledger import Ledger
from llmtrial.core.resources import SCHEMAS
from llmtrial.core.trial_config import PatchBlock
from llmtrial.patch.patchdata import (
    PLUGIN_PACKAGE,
    PatchError,
    apply_file_diff,
    entry_point_name,
    hook_pattern,
    load_patch,
    parse_diff,
    patch_modes,
    verify_files,
)
from llmtrial.patch.patching import apply_patches, check_patches, revert_patches

NAME = "seed000-offload-reinit"
PATCH = load_patch(NAME)
SHIPPED = DATA / "vllm-0.17.1"
RECORD_LINE = (SHIPPED / "RECORD.gpu_model_runner").read_text(encoding="utf-8").strip()
REL, RECORD_HASH, RECORD_SIZE = RECORD_LINE.split(",")
ORIGINAL = gzip.decompress((SHIPPED / "gpu_model_runner.py.gz").read_bytes())
ORIGINAL_TEXT = ORIGINAL.decode("utf-8")
METHOD = "may_reinitialize_input_batch"
HOOK_PROGRAM = REPO / "tests" / "programs" / "call_runner_hook.py"
SEED_TRIAL = REPO / "config" / "trials" / "seed000-qwen3.5-397b-fp8-pp3.yaml"
GROUPS = runner_doubles.GROUP_BLOCK_SIZE
OFFLOAD_GB = 64  # seed 000's cpu_offload_gb


def method_node(text: str) -> ast.FunctionDef:
    """``GPUModelRunner.may_reinitialize_input_batch`` in ``text``."""
    [cls] = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner"]
    [fn] = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD]
    return fn


def method_source(text: str) -> str:
    """The method's source as the file indents it (inside its class)."""
    return ast.get_source_segment(text, method_node(text), padded=True)


def offload_assert(text: str) -> ast.Assert:
    [node] = [n for n in ast.walk(method_node(text)) if isinstance(n, ast.Assert)]
    return node


def patched_text() -> str:
    [fd] = parse_diff(PATCH.diff.read_text(encoding="utf-8"), str(PATCH.diff))
    return apply_file_diff(fd, ORIGINAL_TEXT, label=f"patch {NAME}: {fd.path}")[0]


#: vLLM's own message of the assertion, read from the real file.
VLLM_MESSAGE = ast.literal_eval(offload_assert(ORIGINAL_TEXT).msg)
FORMS = {"original": ORIGINAL_TEXT, "patched": patched_text()}


# ------------------------------------------------------------------ the data and the patch folder


def test_the_shipped_file_is_vllm_0_17_1s_by_its_record_line():
    digest = base64.urlsafe_b64encode(hashlib.sha256(ORIGINAL).digest()).rstrip(b"=").decode("ascii")
    assert REL == "vllm/v1/worker/gpu_model_runner.py"
    assert f"sha256={digest}" == RECORD_HASH and int(RECORD_SIZE) == len(ORIGINAL)
    assert VLLM_MESSAGE.startswith("Cannot re-initialize the input batch when CPU weight offloading is enabled")
    assert "vllm-project/vllm/pull/18298" in VLLM_MESSAGE


def test_the_patch_folder_loads_and_the_generated_schema_accepts_it():
    meta = yaml.safe_load((PATCH.folder / "patch.yaml").read_text(encoding="utf-8"))
    jsonschema.validate(meta, json.loads((SCHEMAS / "patch.schema.json").read_text(encoding="utf-8")))
    assert PATCH.flag == "LLMTRIAL_RELAX_OFFLOAD_REINIT" and PATCH.diff and PATCH.hook
    assert "seed 000" in PATCH.description.lower() and "18298" in PATCH.description
    from packaging.specifiers import SpecifierSet

    assert [v for v in ("0.17.0", "0.17.1", "0.17.2", "0.18.0", "0.32.0") if v in SpecifierSet(PATCH.vllm)] == ["0.17.1"]
    [fd] = parse_diff(PATCH.diff.read_text(encoding="utf-8"), str(PATCH.diff))
    assert fd.path == REL and len(fd.hunks) == 1
    hook = ast.parse(PATCH.hook.read_text(encoding="utf-8"))
    constants = {t.id: ast.literal_eval(n.value) for n in hook.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
    assert (constants["NAME"], constants["FLAG"], constants["TARGET"]) == (NAME, PATCH.flag, "vllm.v1.worker.gpu_model_runner")
    imported = {a.name.split(".")[0] for n in ast.walk(hook) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(hook) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), f"the hook imports beyond the standard library: {imported}"


def test_the_seed_000_trial_names_the_patch_as_the_seed_applied_it_and_flags_the_offload():
    """A file patch on node a (where the workflow runs), a plugin on node b; the flag where vLLM offloads."""
    trial = check_config(load_config(SEED_TRIAL))
    assert patch_modes(trial.patches, "a") == {NAME: "file"} and patch_modes(trial.patches, "b") == {NAME: "plugin"}
    specs = {name: configuration_spec(trial, name) for name in trial.configurations}
    flagged = {name for name, spec in specs.items() if PATCH.flag in spec.env and spec.env[PATCH.flag] == "1"}
    offloading = {name for name, spec in specs.items() if "cpu_offload_gb" in spec.args and spec.args["cpu_offload_gb"]}
    assert flagged == offloading == {"pp3-offload"}


# ------------------------------------------------------------------ mode file, through the patch stage


def distribution(root: Path, version: str) -> md.Distribution:
    """A site-packages of the test's own: the shipped file and ``vllm-<version>.dist-info`` with its RECORD line."""
    (root / REL).parent.mkdir(parents=True)
    (root / REL).write_bytes(ORIGINAL)
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\n", encoding="utf-8")
    (info / "RECORD").write_text(f"{RECORD_LINE}\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n", encoding="utf-8")
    return md.PathDistribution(info)


def changed_lines(before: str, after: str) -> tuple[list[int], list[str], list[str]]:
    """The lines of ``before`` (from 1) that ``after`` replaces or inserts at, what it removes and what it adds."""
    a, b = before.splitlines(), after.splitlines()
    at, removed, added = [], [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            at.append(i1 + 1)
            removed += a[i1:i2]
            added += b[j1:j2]
    return at, removed, added


def test_mode_file_applies_strictly_to_vllm_0_17_1_and_reverts_to_the_original_bytes(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    dist = distribution(site, "0.17.1")
    monkeypatch.syspath_prepend(str(site))  # the revert reads RECORD again through the distribution's name
    [status] = check_patches([NAME], dist=dist)
    assert status["version_ok"] and status["dry_run"] == "applies" and status["files"][0]["matches"]
    ledger = Ledger(tmp_path / "ledger.jsonl")

    record = apply_patches({NAME: PatchBlock(mode="file")}, ledger=ledger, work_dir=tmp_path / "patches", dist=dist)
    [applied] = record.patches
    [f] = applied.files
    assert record.vllm.version == "0.17.1" and applied.mode == "file" and applied.vllm_range == PATCH.vllm
    assert f.path == REL and f.record_hash == f.before_hash == RECORD_HASH != f.after_hash
    [guard] = [n.lineno for n in ast.walk(method_node(ORIGINAL_TEXT)) if isinstance(n, ast.If)
               and any(isinstance(x, ast.Assert) for x in n.body)]  # the if that holds vLLM's assertion
    assert [(h["at_line"], h["offset"]) for h in f.hunks] == [(guard, 0)]
    patched = (site / REL).read_text(encoding="utf-8")
    assert patched == FORMS["patched"]
    assert f'os.environ.get("{PATCH.flag}") == "1"' in patched
    ast.parse(patched)
    at, removed, added = changed_lines(ORIGINAL_TEXT, patched)
    assert at == [offload_assert(ORIGINAL_TEXT).lineno]  # one change, at vLLM's assertion, nowhere else
    assert removed == [ORIGINAL_TEXT.splitlines()[at[0] - 1]]
    assert added[-1] == removed[0].replace("assert ", "assert relaxed or ")
    assert [e.action for e in ledger.entries()] == ["patch_file", "patch_applied"]

    back = revert_patches(ledger)
    assert back.residues == [] and [(i.action, i.matches_record) for i in back.items] == [("restored from backup", True)]
    assert (site / REL).read_bytes() == ORIGINAL and verify_files([REL], dist)[0]["matches"]
    assert revert_patches(ledger).items == []  # twice changes nothing


def test_mode_file_refuses_vllm_0_32_naming_the_range(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    dist = distribution(site, "0.32.0")
    monkeypatch.syspath_prepend(str(site))
    [status] = check_patches([NAME], dist=dist)
    assert status["version_ok"] is False and status["vllm_range"] == PATCH.vllm
    ledger = Ledger(tmp_path / "ledger.jsonl")
    with pytest.raises(PatchError, match=rf"patch {NAME} applies to vLLM {re.escape(PATCH.vllm)}; installed is vllm 0\.32\.0"):
        apply_patches({NAME: PatchBlock(mode="file")}, ledger=ledger, work_dir=tmp_path / "patches", dist=dist)
    assert ledger.entries() == [] and (site / REL).read_bytes() == ORIGINAL and not (tmp_path / "patches").exists()


def test_gnu_patch_without_fuzz_gives_the_same_file(tmp_path):
    """An implementation other than the project's applies the diff to the same text."""
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    (tmp_path / REL).parent.mkdir(parents=True)
    (tmp_path / REL).write_bytes(ORIGINAL)
    subprocess.run(["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-i", str(PATCH.diff)], cwd=tmp_path,
                   check=True, capture_output=True, timeout=60)
    assert (tmp_path / REL).read_text(encoding="utf-8") == FORMS["patched"]


# ------------------------------------------------------------------ the method, run: the original and the diff


def runner_double(form: str, cpu_offload_gb: float) -> object:
    """The method of ``form`` (cut out of the real file, or of the patched one) on a runner double."""
    names = dict(vars(runner_doubles))
    exec(textwrap.dedent(method_source(FORMS[form])), names)  # noqa: S102 - vLLM's own method, from the shipped file
    cls = type("GPUModelRunnerDouble", (), {METHOD: names[METHOD]})
    return runner_doubles.fill_runner(cls(), cpu_offload_gb=cpu_offload_gb)


def evidence_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if re.search(PATCH.evidence, r.getMessage())]


def set_flag(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(PATCH.flag, raising=False)
    else:
        monkeypatch.setenv(PATCH.flag, value)


@pytest.mark.parametrize(("form", "flag"), [("original", None), ("original", "1"), ("patched", None), ("patched", "0")])
def test_without_the_flag_vllms_assertion_refuses_the_offload(form, flag, monkeypatch, caplog):
    set_flag(monkeypatch, flag)
    runner = runner_double(form, OFFLOAD_GB)
    before = runner.input_batch
    with caplog.at_level(logging.INFO), pytest.raises(AssertionError) as err:
        runner.may_reinitialize_input_batch(runner_doubles.hybrid_kv_cache_config(), [GROUPS, GROUPS])
    assert str(err.value) == VLLM_MESSAGE
    assert runner.input_batch is before and evidence_lines(caplog) == []


def test_with_the_flag_the_patched_method_reinitialises_the_batch_and_logs_its_pid(monkeypatch, caplog):
    set_flag(monkeypatch, "1")
    runner = runner_double("patched", OFFLOAD_GB)
    before = runner.input_batch
    with caplog.at_level(logging.INFO):
        runner.may_reinitialize_input_batch(runner_doubles.hybrid_kv_cache_config(), [GROUPS, GROUPS])
    batch = runner.input_batch
    assert batch is not before and batch.kwargs["block_sizes"] == batch.kwargs["kernel_block_sizes"] == [GROUPS, GROUPS]
    assert batch.logitsprocs == before.logitsprocs == runner_doubles.LOGITSPROCS
    assert runner.offload_config.uva.cpu_offload_gb == OFFLOAD_GB
    [line] = evidence_lines(caplog)
    assert line.endswith(f"(cpu_offload_gb {OFFLOAD_GB}) in pid {os.getpid()}")
    [rec] = [r for r in caplog.records if r.getMessage() == line]
    assert rec.name == runner_doubles.logger.name and rec.levelno == logging.WARNING  # the module's own logger


@pytest.mark.parametrize(("offload_gb", "hybrid"), [(0, True), (OFFLOAD_GB, False)], ids=["no-offload", "one-group"])
def test_where_the_assertion_would_not_fire_the_flag_changes_nothing(offload_gb, hybrid, monkeypatch, caplog):
    """No offload (the batch is re-created), or one KV cache group at the cache's block size (it is not):
    with the flag set, both forms do the same and the patched one logs nothing."""
    set_flag(monkeypatch, "1")
    if hybrid:
        groups, kernel = runner_doubles.hybrid_kv_cache_config(), [GROUPS, GROUPS]
    else:
        groups, kernel = runner_doubles.attention_kv_cache_config(), [runner_doubles.CACHE_BLOCK_SIZE]
    made = {}
    for form in FORMS:
        runner = runner_double(form, offload_gb)
        before = runner.input_batch
        with caplog.at_level(logging.INFO):
            runner.may_reinitialize_input_batch(groups, kernel)
        made[form] = None if runner.input_batch is before else runner.input_batch.kwargs
    assert made["original"] == made["patched"] and (made["patched"] is not None) == hybrid
    assert evidence_lines(caplog) == []


# ------------------------------------------------------------------ the hook, in a fresh interpreter


@dataclass(frozen=True)
class HookRun:
    """The hook as the patch stage installs it, run on the stand-in module in a fresh interpreter."""

    plugin_dir: Path
    stand_in: Path

    def __call__(self, flag: str | None, imported: str = "after") -> tuple[dict, str]:
        """Run tests/programs/call_runner_hook.py with the flag ``flag`` (None: unset); what it printed and its stderr."""
        env = {k: v for k, v in os.environ.items() if k != PATCH.flag}
        if flag is not None:
            env[PATCH.flag] = flag
        done = subprocess.run([sys.executable, str(HOOK_PROGRAM), str(self.plugin_dir), entry_point_name(NAME),
                               str(self.stand_in), str(OFFLOAD_GB), imported],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["module_file"] == str(self.stand_in / "vllm" / "v1" / "worker" / "gpu_model_runner.py")  # not a vLLM
        assert out["hook_file"] == str(self.plugin_dir / PLUGIN_PACKAGE / f"{PATCH.module}.py")
        assert out["wrapped_by"] == NAME and out["wrapped_once"] and out["cpu_offload_gb_after"] == OFFLOAD_GB
        hooks = [line for line in done.stderr.splitlines() if re.search(hook_pattern(NAME), line)]
        state = "set" if flag == "1" else "unset"
        assert hooks == [f"llmtrial patch {NAME}: hook installed in pid {out['pid']} (flag {PATCH.flag} {state})"] * 2
        return out, done.stderr


@pytest.fixture(scope="module")
def hook_run(tmp_path_factory) -> HookRun:
    """The plugin folder the patch stage writes in mode plugin (for a vLLM 0.17.1 of the test's own), and a
    ``vllm`` package whose ``vllm.v1.worker.gpu_model_runner`` holds the doubles and a class ``GPUModelRunner``
    with vLLM 0.17.1's original method."""
    tmp = tmp_path_factory.mktemp("hook")
    record = apply_patches({NAME: PatchBlock(mode="plugin")}, ledger=Ledger(tmp / "ledger.jsonl"), work_dir=tmp / "patches",
                           dist=distribution(tmp / "site-packages", "0.17.1"))
    [applied] = record.patches
    assert applied.mode == "plugin" and applied.files == []
    assert applied.plugin.entry_points == {entry_point_name(NAME): f"{PLUGIN_PACKAGE}.{PATCH.module}:register"}
    root = tmp / "stand-in"
    worker = root / "vllm" / "v1" / "worker"
    worker.mkdir(parents=True)
    for pkg in (root / "vllm", root / "vllm" / "v1", worker):
        (pkg / "__init__.py").write_text("", encoding="utf-8")
    doubles = Path(runner_doubles.__file__).read_text(encoding="utf-8")
    (worker / "gpu_model_runner.py").write_text(
        f"{doubles}\n\nclass GPUModelRunner:\n{method_source(ORIGINAL_TEXT)}\n", encoding="utf-8")
    return HookRun(Path(applied.plugin.dir), root)


@pytest.mark.parametrize("imported", ["before", "after"])
def test_the_hook_with_the_flag_reinitialises_the_batch_and_puts_the_offload_back(hook_run, imported):
    out, stderr = hook_run("1", imported)
    assert out["raised"] is None and out["reinitialised"] and out["block_sizes"] == [GROUPS, GROUPS]
    assert out["logitsprocs"] == runner_doubles.LOGITSPROCS
    [line] = [x for x in stderr.splitlines() if re.search(PATCH.evidence, x)]
    assert line.endswith(f"(cpu_offload_gb {float(OFFLOAD_GB)}) in pid {out['pid']}")
    assert line.startswith("WARNING vllm.v1.worker.gpu_model_runner: ")  # the module's own logger


@pytest.mark.parametrize("flag", [None, "0"])
def test_the_hook_without_the_flag_leaves_vllms_assertion(hook_run, flag):
    out, stderr = hook_run(flag)
    assert out["raised"] == VLLM_MESSAGE and not out["reinitialised"]
    assert not re.search(PATCH.evidence, stderr)
