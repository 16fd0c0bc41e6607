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
