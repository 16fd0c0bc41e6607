"""The ledger: append-only, durable before the action, tolerant of a torn last line."""

from __future__ import annotations

import multiprocessing

from llmtrial.core.ledger import Ledger


def test_entries_come_back_in_order_with_their_data(tmp_path):
    ledger = Ledger(tmp_path / "sub" / "ledger.jsonl")
    ledger.append("server_launch", port=8100)
    ledger.append("server_started", pid=12, pgid=12)
    assert [(e.action, e.port, e.pid) for e in ledger.entries()] == [
        ("server_launch", 8100, None), ("server_started", None, 12)]
    assert all(isinstance(e.t, float) for e in ledger.entries())


def test_a_line_torn_by_a_crash_is_skipped(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("cleanup_start")
    with open(ledger.path, "a") as fh:
        fh.write('{"action": "half')
    assert [e.action for e in ledger.entries()] == ["cleanup_start"]


def test_missing_ledger_has_no_entries(tmp_path):
    assert Ledger(tmp_path / "none.jsonl").entries() == []


def _writer(path: str, who: int) -> None:
    ledger = Ledger(path)
    for i in range(200):
        ledger.append("server_launch", label=f"writer {who}", port=i, argv=["x" * 200])


def test_concurrent_writers_do_not_interleave(tmp_path):
    path = str(tmp_path / "ledger.jsonl")
    procs = [multiprocessing.Process(target=_writer, args=(path, w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    entries = Ledger(path).entries()
    assert len(entries) == 600
    for w in range(3):
        assert [e.port for e in entries if e.label == f"writer {w}"] == list(range(200))


def test_each_entry_names_its_run_and_has_an_id(tmp_path, monkeypatch):
    from llmtrial.core.ledger import RUN_ENV

    monkeypatch.setenv(RUN_ENV, "run-a")
    Ledger(tmp_path / "l.jsonl").append("service_quiet")
    Ledger(tmp_path / "l.jsonl", run="run-b").append("service_quiet")
    a, b = Ledger(tmp_path / "l.jsonl").entries()
    assert (a.run, b.run) == ("run-a", "run-b") and a.id != b.id


def test_undo_is_matched_change_by_change_not_by_name(tmp_path):
    from llmtrial.core.ledger import match_undos

    ledger1, ledger2 = Ledger(tmp_path / "l.jsonl", run="r1"), Ledger(tmp_path / "l.jsonl", run="r2")
    first = ledger1.append("stop", name="web")
    ledger1.append("start", name="web", undoes=first.id)
    second = ledger2.append("stop", name="web")  # the same service, stopped again by the next run
    outstanding, undone = match_undos(Ledger(tmp_path / "l.jsonl").entries(), lambda e: e.action == "stop",
                                      lambda e: e.action == "start", lambda e: e.name)
    assert list(outstanding) == [second.id] and list(undone) == [first.id]


def test_an_old_format_ledger_reads_as_one_earlier_run(tmp_path):
    import json

    from llmtrial.core.ledger import EARLIER_RUN, match_undos

    path = tmp_path / "l.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in [
        {"t": 1, "action": "stop", "name": "web"}, {"t": 2, "action": "start", "name": "web"},
        {"t": 3, "action": "stop", "name": "web"}]))
    entries = Ledger(path).entries()
    assert {e.run for e in entries} == {EARLIER_RUN} and len({e.id for e in entries}) == 3
    outstanding, _ = match_undos(entries, lambda e: e.action == "stop", lambda e: e.action == "start", lambda e: e.name)
    assert [e.t for e in outstanding.values()] == [3]  # the old start undid the stop before it, not the later one


def test_every_entry_names_its_node_and_an_old_entry_reads_as_the_local_node(tmp_path):
    from llmtrial.core.ledger import LOCAL_NODE

    path = tmp_path / "l.jsonl"
    path.write_text('{"t": 1, "action": "service_quiet", "run": "r0", "id": "x"}\n')
    Ledger(path).append("cleanup_start")
    Ledger(path, node="gpu-2").append("cleanup_start")
    assert [e.node for e in Ledger(path).entries()] == [LOCAL_NODE, LOCAL_NODE, "gpu-2"]
    assert '"node": "local"' in path.read_text().splitlines()[1]


def test_the_vocabulary_declares_each_action_and_which_undo_answers_each_change():
    from llmtrial.core.ledger import ACTIONS, CHANGES, Action

    assert set(ACTIONS) == set(Action)
    for kind, change in CHANGES.items():
        assert all(ACTIONS[a].change == kind and not ACTIONS[a].undo for a in change.makes), kind
        assert all(ACTIONS[a].change == kind and ACTIONS[a].undo for a in change.undone_by), kind
    assert {a for a, spec in ACTIONS.items() if spec.change} == {a for c in CHANGES.values()
                                                                  for a in (*c.makes, *c.undone_by)}


def test_no_module_writes_an_action_outside_the_vocabulary():
    import re

    from conftest import REPO

    for path in (REPO / "workflow").rglob("*.py"):
        for line in path.read_text().splitlines():
            assert not re.search(r"ledger\.append\(\s*[\"']", line), f"{path}: {line.strip()}"


def test_replay_returns_what_is_still_outstanding_by_kind_on_each_node(tmp_path):
    import json

    from llmtrial.core.ledger import Action, missing_fields, replay

    ledger = Ledger(tmp_path / "l.jsonl", run="r1")
    job = ledger.append(Action.JOB_STARTED, label="t/a", pid=1, create_time=0.0)
    ledger.append(Action.JOB_FINISHED, label="t/a", pid=1, undoes=job.id)
    server = ledger.append(Action.SERVER_STARTED, label="t/a", pid=2, pgid=2, host="h", port=1, launched_at=0.0)
    ledger.append(Action.SERVICE_QUIET, service={"name": "web"}, was_running=False, state_seen="stopped")
    quiet = ledger.append(Action.SERVICE_QUIET, service={"name": "db"}, was_running=True, state_seen="running")
    staged = ledger.append(Action.WEIGHTS_STAGED, path="/s/m", root="/s", after="keep")
    failed = ledger.append(Action.GPU_FAILED, gpu=0, uuid="GPU-a", label="t/a", evidence="x", kernel_lines=[])
    sick = ledger.append(Action.GPU_FAILED, gpu=1, uuid="GPU-b", label="t/a", evidence="x", kernel_lines=[])
    ledger.append(Action.GPU_CLEARED, gpu=0, uuid="GPU-a", undoes=failed.id, evidence="allocated")
    state = replay(Ledger(tmp_path / "l.jsonl").entries())
    assert {k: list(v) for k, v in state.outstanding.items()} == {
        "jobs": [], "servers": [server.id], "patches": [], "services": [quiet.id], "weights": [staged.id],
        "gpus": [sick.id], "locks": []}  # no lock outside a workflow run
    assert list(state.undone) == [job.id, failed.id] and state.any_open(besides=("weights",))
    lines = [json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert all(missing_fields(line) == [] for line in lines)
    assert missing_fields({"action": "server_started", "pid": 3}) == [
        "t", "run", "id", "node", "label", "pgid", "host", "port", "launched_at"]


def test_an_old_undo_matches_by_key_only_on_its_own_node(tmp_path):
    import json

    from llmtrial.core.ledger import replay

    path = tmp_path / "l.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in [
        {"t": 1, "action": "service_quiet", "service": {"name": "web"}, "was_running": True, "node": "a"},
        {"t": 2, "action": "service_quiet", "service": {"name": "web"}, "was_running": True, "node": "b"},
        {"t": 3, "action": "service_restored", "name": "web", "node": "b"}]))
    assert [e.node for e in replay(Ledger(path).entries()).open("services")] == ["a"]


def test_an_entry_with_a_field_the_ledger_does_not_declare_is_refused_and_nothing_is_written(tmp_path):
    import pytest
    from pydantic import ValidationError

    ledger = Ledger(tmp_path / "l.jsonl")
    with pytest.raises(ValidationError, match="pidd"):
        ledger.append("server_started", label="t/a", pidd=12)
    with pytest.raises(ValidationError, match="port"):
        ledger.append("server_launch", label="t/a", port="eighty")
    assert not ledger.path.exists()


def test_a_later_versions_field_is_left_out_and_a_line_that_is_no_entry_is_named(tmp_path, caplog):
    import json

    import pytest

    from llmtrial.core.ledger import LedgerError

    path = tmp_path / "l.jsonl"
    path.write_text(json.dumps({"t": 1.5, "action": "server_started", "run": "r1", "id": "a", "pid": 7, "pgid": 7,
                                "cgroup": "/sys/fs/cgroup/trial"}) + "\n")
    [entry] = Ledger(path).entries()
    assert (entry.id, entry.pgid) == ("a", 7) and "cgroup" not in entry.written()
    assert f"{path} line 1: fields this version does not know, left out: cgroup" in caplog.text
    with open(path, "a") as fh:
        fh.write(json.dumps({"t": 2.0, "action": "server_stopped", "pgid": "seven"}) + "\n")
    with pytest.raises(LedgerError, match=rf"{path} line 2: not a ledger entry: pgid: "):
        Ledger(path).entries()
