from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client
from pytest_django.fixtures import Settings

from pandaweb.core import dispatch
from pandaweb.core.models import WorkerHeartbeat
from pandaweb.core.roles import Role
from tests.factories import user_with_role


def wait_for_heartbeat(nonce: str, timeout: float = 60.0) -> WorkerHeartbeat:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beat = WorkerHeartbeat.objects.filter(ping_nonce=nonce).first()
        if beat is not None:
            return beat
        time.sleep(0.05)
    raise AssertionError(f"no worker answered ping {nonce}")


@pytest.mark.django_db(transaction=True)
def test_a_ping_from_the_system_page_runs_in_a_thread_of_this_process(
    client: Client,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.RUN_EXECUTION = "thread"
    # A pool of its own: earlier tests' runs may still occupy the process's shared pool.
    monkeypatch.setattr(dispatch, "_pool", None)
    client.force_login(user_with_role(Role.ADMINS))

    # The ping is sent on commit of the request's work (run here whatever transaction state the
    # suite's earlier tests left on this connection).
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/system/ping/", follow=True)

    message = next(iter(response.context["messages"])).message
    nonce = message.split()[1]
    beat = wait_for_heartbeat(nonce)
    assert beat.mode == WorkerHeartbeat.Mode.THREAD
    assert beat.worker.startswith("threads@")


@pytest.mark.django_db
def test_only_admins_may_ping_workers(client: Client) -> None:
    client.force_login(user_with_role(Role.COMPLIANCE))

    assert client.post("/system/ping/").status_code == 403
    assert WorkerHeartbeat.objects.count() == 0
