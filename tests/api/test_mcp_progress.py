"""A tool call's progress: one notification per executed step, however many finish between two
looks at the run."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models.signals import post_save
from django.utils import timezone
from mcp import Client

from pandaweb.api.mcp_server import build_server
from sessions.models import Run, StepResult
from tests.api.conftest import make_token
from workflows.models import Workflow

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_background_runs"),
]

SENTENCES = ["Open the login page", "Type the username", "Click the button 'Log in'"]


def finish_at_once(launched: threading.Event, run_ids: list[int]) -> None:
    """Record three steps and the run's success in one transaction, as a fast worker would
    between two polls."""
    try:
        assert launched.wait(30)
        with transaction.atomic():
            StepResult.objects.bulk_create(
                StepResult(
                    run_id=run_ids[0], index=index, step_id=f"s{index}", step_type="goto",
                    sentence=sentence, status="succeeded", started_at=timezone.now(),
                    duration_ms=1,
                )
                for index, sentence in enumerate(SENTENCES)
            )  # fmt: skip
            Run.objects.filter(pk=run_ids[0]).update(status=Run.Status.SUCCEEDED)
    finally:
        connection.close()


def test_each_step_gets_its_own_progress_notification(
    operator: User, demo_workflow: Workflow
) -> None:
    Workflow.objects.filter(pk=demo_workflow.pk).update(offer_as_tool=True)
    raw = make_token(operator, ["tools:call"])
    launched, run_ids = threading.Event(), []

    def on_launch(sender: Any, instance: Run, created: bool, **kwargs: Any) -> None:
        if created:
            run_ids.append(instance.pk)
            transaction.on_commit(launched.set)

    post_save.connect(on_launch, sender=Run, weak=False)
    worker = threading.Thread(target=finish_at_once, args=(launched, run_ids))
    worker.start()
    server = build_server(
        lambda ctx: raw,
        base_url="http://127.0.0.1:8000",
        session_of=lambda ctx: "s1",
        wait_seconds=30,
    )
    notes: list[tuple[float, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message))

    async def main() -> Any:
        async with Client(server) as client:
            return await client.call_tool(
                "acme-pay-invoice",
                {"invoice": "INV-1040", "amount": "547.70"},
                progress_callback=progress,
            )

    try:
        result = asyncio.run(main())
    finally:
        post_save.disconnect(on_launch, sender=Run)
        launched.set()
        worker.join()

    assert not result.is_error
    assert notes == [(1, SENTENCES[0]), (2, SENTENCES[1]), (3, SENTENCES[2])]
