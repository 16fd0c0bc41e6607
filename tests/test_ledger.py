"""The ledger: append-only, durable before the action, tolerant of a torn last line."""

from __future__ import annotations

import multiprocessing

from llmtrial.ledger import Ledger


def test_entries_come_back_in_order_with_their_data(tmp_path):
    ledger = Ledger(tmp_path / "sub" / "ledger.jsonl")
    ledger.append("server_launch", port=8100)
    ledger.append("server_started", pid=12, pgid=12)
    assert [(e["action"], e.get("port"), e.get("pid")) for e in ledger.entries()] == [
        ("server_launch", 8100, None), ("server_started", None, 12)]
    assert all(isinstance(e["t"], float) for e in ledger.entries())


def test_a_line_torn_by_a_crash_is_skipped(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("a")
    with open(ledger.path, "a") as fh:
        fh.write('{"action": "half')
    assert [e["action"] for e in ledger.entries()] == ["a"]


def test_missing_ledger_has_no_entries(tmp_path):
    assert Ledger(tmp_path / "none.jsonl").entries() == []


def _writer(path: str, who: int) -> None:
    ledger = Ledger(path)
    for i in range(200):
        ledger.append("tick", who=who, i=i, pad="x" * 200)


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
        assert [e["i"] for e in entries if e["who"] == w] == list(range(200))


def test_each_entry_names_its_run_and_has_an_id(tmp_path, monkeypatch):
    from llmtrial.ledger import RUN_ENV

    monkeypatch.setenv(RUN_ENV, "run-a")
    Ledger(tmp_path / "l.jsonl").append("service_quiet")
    Ledger(tmp_path / "l.jsonl", run="run-b").append("service_quiet")
    a, b = Ledger(tmp_path / "l.jsonl").entries()
    assert (a["run"], b["run"]) == ("run-a", "run-b") and a["id"] != b["id"]


def test_undo_is_matched_change_by_change_not_by_name(tmp_path):
    from llmtrial.ledger import match_undos

    ledger1, ledger2 = Ledger(tmp_path / "l.jsonl", run="r1"), Ledger(tmp_path / "l.jsonl", run="r2")
    first = ledger1.append("stop", name="web")
    ledger1.append("start", name="web", undoes=first["id"])
    second = ledger2.append("stop", name="web")  # the same service, stopped again by the next run
    outstanding, undone = match_undos(Ledger(tmp_path / "l.jsonl").entries(), lambda e: e["action"] == "stop",
                                      lambda e: e["action"] == "start", lambda e: e.get("name"))
    assert list(outstanding) == [second["id"]] and list(undone) == [first["id"]]


def test_an_old_format_ledger_reads_as_one_earlier_run(tmp_path):
    import json

    from llmtrial.ledger import EARLIER_RUN, match_undos

    path = tmp_path / "l.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in [
        {"t": 1, "action": "stop", "name": "web"}, {"t": 2, "action": "start", "name": "web"},
        {"t": 3, "action": "stop", "name": "web"}]))
    entries = Ledger(path).entries()
    assert {e["run"] for e in entries} == {EARLIER_RUN} and len({e["id"] for e in entries}) == 3
    outstanding, _ = match_undos(entries, lambda e: e["action"] == "stop", lambda e: e["action"] == "start",
                                 lambda e: e.get("name"))
    assert [e["t"] for e in outstanding.values()] == [3]  # the old start undid the stop before it, not the later one
