"""The report's Answers section, from configuration records with answers built here: accuracy per
category, the matrix, each prompt answered differently with both answers and where they part, the
patch on/off result, seed 001's caution, and what was not measured when no set ran."""

from __future__ import annotations

from llmtrial.core.records import read_record
from llmtrial.report.render import build_context, render_report
from synthetic import DEMO, as_model, demo, models
from synthetic import answer_run as run
from synthetic import answers_part as part

TP1 = ["12 * 11 = 132", "205 + 695 = 890", "Paris."]

def page(tp1: dict | None, tp2: dict | None) -> tuple[dict, str]:
    configs = [read_record(DEMO / "tp1.json"), read_record(DEMO / "tp2.json")]
    for rec, answers in zip(configs, (tp1, tp2), strict=True):
        if answers is not None:
            rec["answers"] = answers
    ctx = build_context(trial="demo", preflight=demo("preflight", "preflight"), manifest=demo("manifest", "manifest"),
                        plans=[demo("plan-tp1", "plan"), demo("plan-tp2", "plan")],
                        configurations=models("configuration", configs), cleanup=demo("cleanup", "cleanup"))
    return ctx, render_report(ctx)


def section(html: str) -> str:
    return html.split('<h2 id="answers">', 1)[1].split("<h2", 1)[0]


def test_a_differing_prompt_is_shown_with_both_answers_and_the_token_where_they_part():
    tp2 = ["12 * 11 = 132", "205 + 695 = 900", "Paris."]
    ctx, html = page(part(run(TP1), run(TP1, launch="flags_off", flag=False)), part(run(tp2, flag=False)))
    found = ctx.answers.sentences
    assert "tp2's answers against the baseline tp1's: identical on 2 of 3; 1 differs (prompt 2)." in found[1]
    # tp2 right on 3, tp1 on 2: one prompt on a set of three is not a ranking
    assert "tp2 is right on 3 and tp1 on 2: a difference of 1 prompt on a set of 3 is not a ranking" in found[1]
    assert found[2] == ("tp1 with the flag of demo-worker-log on against off (a launch of its own): identical on 3 of 3; "
                        "the patch did not change the answers.")
    assert found[0].endswith("right tp1 on 2, tp2 on 3 of 3.")
    body = section(html)
    [row] = [r for r in body.split("<tr>") if r.startswith("<td>tp2 against tp1")]
    assert "2: What is 205 + 695?" in row and "<code>205 + 695 = 890</code>" in row and "<code>205 + 695 = 900</code>" in row
    assert "token 13" in row  # "205 + 695 = 890" and "205 + 695 = 900" part at the 13th character (one token each)
    assert '<span class="failed">wrong</span> <code>205 + 695 = 890' in row
    # the matrix of three runs: tp2 against tp1 and against tp1's flags-off run (both ways) 2 of 3, the rest 3 of 3
    matrix = body.split("Agreement: identical answers", 1)[1].split("</table>", 1)[0]
    assert matrix.count('<td class="n warn">2 of 3</td>') == 4 and matrix.count("3 of 3") == 5
    assert "answers-flags-off.log, ready in 21.5 s" in body
    assert html.split('<h2 id="findings">', 1)[1].split("<h2", 1)[0].count("identical on") >= 2


def test_a_patch_that_changes_answers_is_named_so():
    ctx, html = page(part(run(TP1), run(["12 * 11 = 131", "205 + 695 = 890", "Lyon."], launch="flags_off", flag=False)),
                     None)
    [sentence] = [s for s in ctx.answers.sentences if "demo-worker-log" in s]
    assert sentence.endswith("identical on 1 of 3; 2 differ (prompts 1 and 3); the patch changes answers.")
    assert "tp1 (flags on) against flags off" in section(html)
    assert "tp2: served, but no answers are recorded" in html.split('<h2 id="not-measured">', 1)[1]


def test_two_patches_flagged_in_one_configuration_are_named_together():
    both = {"demo-worker-log": True, "demo-second-token": True}
    on = run(TP1).model_copy(update={"flags": both})
    off = run(["12 * 11 = 131", "205 + 695 = 890", "Lyon."], launch="flags_off", flag=False).model_copy(
        update={"flags": dict.fromkeys(both, False)})
    ctx, _ = page(part(on, off), None)
    [sentence] = [s for s in ctx.answers.sentences if "demo-second-token" in s]
    assert sentence == ("tp1 with the flags of demo-worker-log and demo-second-token on against off (a launch of its own): "
                        "identical on 1 of 3; 2 differ (prompts 1 and 3); the patches change answers.")


def test_the_tiny_model_and_a_repeat_that_differs_are_explained():
    ctx, _ = page(part(run(TP1, repeat_identical=2)), part(run(TP1, flag=False)))
    found = ctx.answers.sentences
    assert as_model("manifest", read_record(DEMO / "manifest.json")).source["kind"] == "tiny"
    assert found[-1].startswith("The model is the generated tiny model") and "accuracy near zero is expected" in found[-1]
    assert "tp1 did not answer alike when asked again: identical on 2 of 3 over 2 asks" in " ".join(found)
    assert "tp2's answers against the baseline tp1's: identical on 3 of 3." in found


def test_no_task_set_is_named_in_what_was_not_measured_and_a_failed_launch_too():
    ctx, html = page(None, None)
    assert ctx.answers is None and "No task set was asked in this trial" in section(html)
    assert "No task set was asked of any server" in html.split('<h2 id="not-measured">', 1)[1]
    failed = "the server with the flags off did not start: exit 1"
    ctx, html = page(part(run(TP1), run(TP1, launch="flags_off", flag=False, failure=failed)), part(run(TP1, flag=False)))
    assert f"tp1: the task set with the patch flags off did not complete ({failed})." in ctx.not_measured
    assert ctx.answers.labels == ["tp1", "tp2"]
