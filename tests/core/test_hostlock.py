"""The host lock (llmtrial.core.hostlock): one trial at a time changes a host, the lock outlives a
killed holder until a cleanup gives the host back, and the ledger records taking and releasing it."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmtrial.core import hostlock
from llmtrial.core.hostlock import PID_ENV, RUN_LOCK_ENV, WAIT_ENV, HostBusy, acquire, holder_for, read_holder, release
from llmtrial.core.ledger import Action, Ledger, replay
from llmtrial.lifecycle.cleanup import run_cleanup


def dead_pid() -> int:
    """The pid of a process that ran and was killed with SIGKILL (a snakemake after kill -9)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.kill()
    proc.wait()
    return proc.pid


def claim(tmp_path: Path, trial: str, run: str):
    return holder_for(tmp_path / "results" / trial, run, "local")


def test_the_first_taking_writes_its_entry_and_a_second_of_the_same_run_is_a_no_op(tmp_path):
    lock, entries = tmp_path / "lock" / "host.json", []
    me = claim(tmp_path, "a", "r1")
    assert acquire(lock, me, wait_s=0, before=entries.append) is True
    assert entries == [None]  # nobody held it before
    held = read_holder(lock)
    assert (held.trial, held.run, held.results) == ("a", "r1", str(tmp_path / "results" / "a")) and held.alive()
    assert acquire(lock, me, wait_s=0, before=entries.append) is False and entries == [None]


class SleeperClock:
    """hostlock's clock in a test: monotonic time moves only when the code under test sleeps, so the
    wait's polls and its deadline come out the same whatever the machine's speed."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_another_trial_waits_saying_who_holds_the_host_then_refuses(tmp_path, monkeypatch):
    lock, said, clock = tmp_path / "host.json", [], SleeperClock()
    acquire(lock, claim(tmp_path, "a", "r1"), wait_s=0, before=lambda _: None)
    monkeypatch.setattr(hostlock, "time", clock)
    with pytest.raises(HostBusy) as busy:
        acquire(lock, claim(tmp_path, "b", "r2"), wait_s=0.6, poll_s=0.1, before=lambda _: None, say=said.append)
    message = str(busy.value)
    assert "held by trial a" in message and "run r1" in message and "running" in message and "waited" in message
    assert clock.slept == pytest.approx([0.1] * 6)  # polled every 0.1 s until the 0.6 s were up
    assert len(said) == 2 and said[0].startswith("llmtrial: waiting for the host") and "trial a" in said[0]
    assert said[1] == f"llmtrial: refusing to change the host: {message}"
    assert read_holder(lock).trial == "a"  # still a's


def test_a_killed_holder_keeps_the_host_until_its_cleanup_and_the_message_says_how(tmp_path, monkeypatch):
    lock = tmp_path / "host.json"
    monkeypatch.setenv(PID_ENV, str(dead_pid()))
    acquire(lock, claim(tmp_path, "a", "r1"), wait_s=0, before=lambda _: None)
    monkeypatch.delenv(PID_ENV)
    with pytest.raises(HostBusy) as busy:
        acquire(lock, claim(tmp_path, "b", "r2"), wait_s=0, before=lambda _: None)
    assert "not running" in str(busy.value) and "`snakemake cleanup`" in str(busy.value)
    assert f"`llmtrial cleanup {tmp_path / 'results' / 'a'}`" in str(busy.value)


def test_a_rerun_of_the_same_trial_takes_the_lock_over_and_only_the_holder_releases_it(tmp_path):
    lock, earlier = tmp_path / "host.json", []
    acquire(lock, claim(tmp_path, "a", "r1"), wait_s=0, before=lambda _: None)
    assert acquire(lock, claim(tmp_path, "a", "r2"), wait_s=0, before=earlier.append) is True
    assert earlier[0].run == "r1" and read_holder(lock).run == "r2"
    results = str(tmp_path / "results" / "a")
    assert release(lock, results, "r1") == "taken over by run r2"
    assert release(lock, str(tmp_path / "results" / "b"), "r9").startswith("held by trial a")
    assert release(lock, results, "r2") == "released" and not lock.exists()
    assert release(lock, results, "r2") == "not held"


def _race(lock: str, trial: str, start, out) -> None:
    start.wait()
    try:
        acquire(Path(lock), holder_for(Path("/r") / trial, trial, "local"), wait_s=0, before=lambda _: None)
        out.put(trial)
    except HostBusy:
        out.put(None)


def test_of_eight_trials_taking_the_host_at_once_exactly_one_holds_it(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path / "host.json"), f"t{i}", start, out)) for i in range(8)]
    for p in procs:
        p.start()
    start.set()
    won = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    winners = [w for w in won if w]
    assert len(winners) == 1 and read_holder(tmp_path / "host.json").trial == winners[0]


def test_a_change_takes_the_lock_before_its_entry_and_the_cleanup_that_gives_the_host_back_releases_it(
        tmp_path, monkeypatch):
    lock = tmp_path / "host.json"
    monkeypatch.setenv(RUN_LOCK_ENV, str(lock))
    monkeypatch.setenv(WAIT_ENV, "0")
    results = tmp_path / "results" / "a"
    ledger = Ledger(results / "ledger.jsonl", run="r1")
    ledger.append(Action.CLEANUP_START)  # a mark: no lock
    assert not lock.exists()
    ledger.append(Action.WEIGHTS_STAGED, path=str(tmp_path / "w"), root=str(tmp_path), after="keep")
    ledger.append(Action.WEIGHTS_STAGED, path=str(tmp_path / "w2"), root=str(tmp_path), after="keep")
    actions = [e.action for e in ledger.entries()]
    assert actions == ["cleanup_start", "host_locked", "weights_staged", "weights_staged"]  # taken once, first
    assert read_holder(lock).results == str(results.resolve())
    record = run_cleanup(results, run="r1")
    assert record.restored and [(r.run, r.outcome) for r in record.host_lock] == [("r1", "released")]
    assert not lock.exists() and replay(ledger.entries()).open("locks") == []


def test_a_cleanup_that_leaves_a_residue_keeps_the_host_locked(tmp_path, monkeypatch):
    from llmtrial.host.services import Service

    lock = tmp_path / "host.json"
    monkeypatch.setenv(RUN_LOCK_ENV, str(lock))
    results = tmp_path / "results" / "a"
    broken = Service.from_config("tts", {"kind": "command", "status": ["false"], "stop": ["true"], "start": ["false"],
                                         "timeouts": {"health_s": 1}})
    Ledger(results / "ledger.jsonl", run="r1").append("service_quiet", service=broken.to_json(), was_running=True,
                                                       state_seen="running")
    record = run_cleanup(results, run="r2")
    assert not record.restored and [(r.run, r.outcome) for r in record.host_lock] == [("r1", "kept")]
    assert read_holder(lock).run == "r1"
    lines = [json.loads(x) for x in (results / "ledger.jsonl").read_text().splitlines()]
    assert "host_unlocked" not in [e["action"] for e in lines]
