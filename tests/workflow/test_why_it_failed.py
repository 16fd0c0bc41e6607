"""config/trials/why-it-failed-cpu.yaml end to end with real vLLM (CPU build): two configurations crash on
purpose while vLLM processes the weights after loading (the demo-postload-raise patch's flag), and the
trial reads the failures across configurations.

One run serves every test: both flagged configurations fail with one signature, the knobs that differ
between them (the KV space, max_num_seqs) are ruled out and the KV space is out of that phase, the flag
is implicated by the configuration without it, the confirming relaunches (failures.confirm) show that
removing it fixes kv1-seqs4 and adding it back breaks it, the report says so, and cleanup leaves nothing.
"""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO, free_base_port
from llmtrial.core.ledger import Ledger
from llmtrial.core.records import load_record
from llmtrial.host.process_groups import port_open
from llmtrial.patch.patchdata import load_patch, vllm_distribution
from llmtrial.patch.patching import prepare_file_patches, revert_patches, verify_files
from workflow_helpers import snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.workflow]

TRIAL_FILE = REPO / "config" / "trials" / "why-it-failed-cpu.yaml"
FLAG = "LLMTRIAL_DEMO_POSTLOAD_RAISE"


def raise_line() -> int:
    """The line of ``raise RuntimeError(`` in the installed file as the patch makes it (its dry run)."""
    [patched] = prepare_file_patches([load_patch("demo-postload-raise")], vllm_distribution())
    lines = patched.after.decode().split("\n")
    return next(n for n, text in enumerate(lines, start=1) if text.strip().startswith("raise RuntimeError("))


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    work = tmp_path_factory.mktemp("why-it-failed")
    config = yaml.safe_load(TRIAL_FILE.read_text())
    config["staging_dir"] = str(work / "staging")
    config["serving"]["base_port"] = free_base_port(18700, len(config["configurations"]))
    write_config(work, config)
    results = work / "results" / config["trial"]
    try:
        run = snakemake(work, "--cores", "all", timeout=1200)
    finally:
        revert_patches(Ledger(results / "ledger.jsonl"))  # whatever happened, vLLM is not left patched
    records = {name: load_record(results / "configs" / name / "record.json", "configuration")
               for name in config["configurations"]}
    return {"work": work, "run": run, "results": results, "config": config, "records": records}


def test_the_trial_finishes_and_only_the_flagged_configurations_fail(trial):
    assert trial["run"].returncode == 0, trial["run"].stdout[-3000:] + trial["run"].stderr[-3000:]
    assert {n: r.status for n, r in trial["records"].items()} == {"kv1-seqs4": "failed", "kv2-seqs8": "failed",
                                                                    "no-flag": "ok"}


def test_both_flagged_configurations_crash_with_one_signature_at_the_patched_line(trial):
    sigs = [trial["records"][n].failure.signature for n in ("kv1-seqs4", "kv2-seqs8")]
    assert sigs[0].key == sigs[1].key
    sig = sigs[0]
    assert sig.exception == "RuntimeError"
    assert sig.message == ("llmtrial demo-postload-raise: the weights could not be processed after loading "
                           "(raised on purpose)")
    assert (sig.frame.file, sig.frame.function, sig.frame.line) == (
        "vllm/model_executor/model_loader/utils.py", "process_weights_after_loading", raise_line())
    assert sig.phase == "post_load_processing" and not sig.out_of_memory
    # the crash line is the exception's line in the log the signature names
    log = (trial["results"] / "configs" / "kv1-seqs4" / sig.source).read_bytes().decode().split("\n")  # as sed counts
    assert "RuntimeError: llmtrial demo-postload-raise" in log[sig.crash_line - 1]


def test_the_relaunches_show_that_removing_the_flag_fixes_it_and_adding_it_back_breaks_it(trial):
    record = trial["records"]["kv1-seqs4"]
    c = record.confirmation
    assert (c.knob, c.against, c.value, c.instead) == (FLAG, "no-flag", "1", None)
    assert [(launch.knob_set, launch.started) for launch in c.launches] == [(False, True), (True, False)]
    assert c.launches[1].signature.key == record.failure.signature.key
    assert c.removing_fixes is True and c.adding_back_breaks is True
    # each relaunch wrote its own log beside the record: the first ran vLLM without the flag, the second with it
    first, second = (trial["results"] / "configs" / "kv1-seqs4" / launch.log for launch in c.launches)
    assert "llmtrial patch demo-postload-raise active" not in first.read_text()
    assert "llmtrial patch demo-postload-raise active" in second.read_text()
    # kv2-seqs8 differs from every other configuration in more than one knob: never relaunched
    assert trial["records"]["kv2-seqs8"].confirmation is None
    # each relaunch is a launch of its own in the ledger, started and stopped
    entries = Ledger(trial["results"] / "ledger.jsonl").entries()
    started = [e for e in entries if e.action == "server_started" and e.label.startswith("why-it-failed/kv1-seqs4")]
    stopped = {e.undoes for e in entries if e.action == "server_stopped" and isinstance(e.undoes, str)}
    assert len(started) == 3 and all(e.id in stopped for e in started)


def test_each_record_holds_the_knobs_it_was_compared_by(trial):
    knobs = {n: r.knobs for n, r in trial["records"].items()}
    assert knobs["kv1-seqs4"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and knobs["kv2-seqs8"]["max_num_seqs"] == "8"
    assert knobs["kv1-seqs4"][FLAG] == "1" and FLAG not in knobs["no-flag"]


def test_the_report_rules_out_the_kv_space_and_max_num_seqs_and_implicates_the_flag(trial):
    findings = (trial["results"] / "findings.txt").read_text()
    assert ("kv1-seqs4 and kv2-seqs8 fail with one signature (RuntimeError: llmtrial demo-postload-raise: the weights "
            "could not be processed after loading (raised on purpose) at vllm/model_executor/model_loader/utils.py:"
            f"process_weights_after_loading:{raise_line()}, in post-load weight processing); max_num_seqs and "
            f"VLLM_CPU_KVCACHE_SPACE are not the cause; {FLAG} is implicated; relaunches of kv1-seqs4 show that "
            f"removing {FLAG} fixes it and adding it back breaks it.") in findings
    html = (trial["results"] / "report.html").read_text()
    assert "Why it failed" in html
    for sentence in ("VLLM_CPU_KVCACHE_SPACE 1 against 2 and the crash did not move: not that knob.",
                     "max_num_seqs 4 against 8 and the crash did not move: not that knob.",
                     "VLLM_CPU_KVCACHE_SPACE cannot act in post-load weight processing",
                     "max_num_seqs cannot act in post-load weight processing",
                     f"{FLAG} is implicated: kv1-seqs4 ({FLAG} 1) fails and no-flag ({FLAG} unset) ran, and the two "
                     "differ in nothing else.",
                     f"kv1-seqs4 relaunched with {FLAG} as no-flag has it (unset): it started, so removing it fixes the "
                     f"crash. Relaunched with {FLAG} again: it failed with the same signature, so adding it back breaks it."):
        assert sentence in html, sentence


def test_cleanup_leaves_the_patch_reverted_and_no_server(trial):
    cleanup = load_record(trial["results"] / "cleanup" / "record.json", "cleanup")
    assert cleanup.restored, cleanup.residues
    entries = Ledger(trial["results"] / "ledger.jsonl").entries()
    patched = sorted({e.path for e in entries if e.action == "patch_file"})
    assert patched and all(f["matches"] for f in verify_files(patched))
    base = trial["config"]["serving"]["base_port"]
    assert not any(port_open("127.0.0.1", base + i) for i in range(len(trial["config"]["configurations"])))
