"""A worker that starts (a deploy, a restart) starts a Playwright driver in the process that
will run its tasks, before any task: the first continuation it takes does not wait for one."""

from __future__ import annotations

import psutil
import pytest

from tests.drills.conftest import Workers, until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def drivers_of(worker_pid: int) -> list[psutil.Process]:
    """Playwright drivers (Node.js, ``run-driver``) among a worker's processes."""
    found = []
    for process in psutil.Process(worker_pid).children(recursive=True):
        try:
            if "run-driver" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_starts_a_playwright_driver_before_its_first_task(
    pool: str, workers: Workers
) -> None:
    worker = workers.start(pool=pool, concurrency=2)

    # Prefork: one in each child, which runs the tasks (a driver does not survive a fork).
    expected = 2 if pool == "prefork" else 1
    until(lambda: len(drivers_of(worker.pid)) >= expected, 30, "the warm drivers", workers)
    if pool == "prefork":
        children = psutil.Process(worker.pid).children()
        assert {d.ppid() for d in drivers_of(worker.pid)} <= {c.pid for c in children}
        assert all(d.ppid() != worker.pid for d in drivers_of(worker.pid))
