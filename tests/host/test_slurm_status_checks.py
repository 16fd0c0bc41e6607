"""The wait between the SLURM executor's status checks, capped (llmtrial.host.slurm_hosts.cap_status_checks):
the login side's snakemake notices a trial's end within STATUS_CHECK_MAX_S seconds."""

from __future__ import annotations

import asyncio
import inspect
import logging
from types import SimpleNamespace

from snakemake_executor_plugin_slurm import Executor

from llmtrial.host.slurm_hosts import STATUS_CHECK_MAX_S, cap_status_checks


class BackoffDouble:
    """A double of the SLURM executor's status checks (snakemake-executor-plugin-slurm 2.8.0): after a check
    that finds no job finished it waits 10 s longer, up to 180 s; after one that does, it starts again."""

    def __init__(self, asked: int | None = None) -> None:
        self.workflow = SimpleNamespace(remote_execution_settings=SimpleNamespace(seconds_between_status_checks=asked))
        self.next_seconds_between_status_checks = 2
        self.finished_at: set[int] = set()
        self.checks = 0

    async def check_active_jobs(self, active_jobs):
        self.checks += 1
        if self.checks in self.finished_at:
            self.next_seconds_between_status_checks = 2
        else:
            for job in active_jobs:
                yield job
            self.next_seconds_between_status_checks = min(self.next_seconds_between_status_checks + 10, 180)


def waits(executor, checks: int) -> list[float]:
    async def run() -> list[float]:
        out = []
        for _ in range(checks):
            still = [job async for job in executor.check_active_jobs(["job"])]
            assert still in (["job"], [])
            out.append(executor.next_seconds_between_status_checks)
        return out
    return asyncio.run(run())


def test_the_executors_wait_grows_no_longer_than_the_cap():
    class Capped(BackoffDouble):
        pass

    assert waits(BackoffDouble(), 20)[-1] == 180  # the executor's own rule: three minutes between checks
    cap_status_checks(Capped)
    cap_status_checks(Capped)  # once per class, however often the workflow is read
    capped = Capped()
    capped.finished_at = {5}
    assert waits(capped, 20) == [12, STATUS_CHECK_MAX_S, STATUS_CHECK_MAX_S, STATUS_CHECK_MAX_S, 2, 12,
                                 *[STATUS_CHECK_MAX_S] * 14]


def test_a_longer_wait_the_run_asked_for_is_kept():
    class Capped(BackoffDouble):
        pass

    cap_status_checks(Capped)
    assert max(waits(Capped(asked=60), 20)) == 60  # --seconds-between-status-checks 60: at most 60 s


def test_the_installed_executor_backs_off_and_the_cap_applies_to_its_own_checks():
    """What the cap is for is still in the installed plugin (a newer one may have a setting of its own), and
    the capped class runs the executor's own check: with no job active it sets its first wait, 40 s by
    default, which the cap brings to 20 s."""
    source = inspect.getsource(Executor.check_active_jobs)
    assert inspect.isasyncgenfunction(Executor.check_active_jobs)
    assert "self.next_seconds_between_status_checks + 10" in source and "max_sleep_time = 180" in source

    class Capped(Executor):
        pass

    cap_status_checks(Capped)
    executor = Capped.__new__(Capped)  # no workflow to run: only the status check's own path
    executor.workflow = SimpleNamespace(executor_settings=SimpleNamespace(init_seconds_before_status_checks=40),
                                        remote_execution_settings=SimpleNamespace(seconds_between_status_checks=10))
    executor.logger = logging.getLogger("test")
    executor._next_seconds_between_status_checks = 170

    async def check() -> list:
        return [job async for job in executor.check_active_jobs([])]

    assert asyncio.run(check()) == [] and executor.next_seconds_between_status_checks == STATUS_CHECK_MAX_S
    assert Executor.check_active_jobs is not Capped.check_active_jobs  # the plugin's own class is untouched here
