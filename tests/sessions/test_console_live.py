from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from sessions import services
from sessions.models import Run
from tests.factories import user_with_role
from tests.sessions.test_live import INPUTS, cookie_for, socket
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def launch(operator: User, workflow: Workflow) -> Run:
    return services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs=INPUTS)


@database_sync_to_async
def cancel(operator: User, run: Run) -> None:
    services.run_cancel(run_id=run.pk, user=operator)


async def test_the_runs_list_gets_only_the_changed_row(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await launch(operator, demo_workflow)
    watcher = socket("/ws/runs/", await cookie_for(operator))
    connected, _ = await watcher.connect(timeout=10)
    assert connected

    await cancel(operator, run)
    html = await watcher.receive_from(timeout=10)
    await watcher.disconnect()

    # One row, swapped by its id: the filters, sort and page of the list stay as they are.
    assert html.startswith(f'<tr id="run-{run.pk}" hx-swap-oob="outerHTML">')
    assert "Cancelled" in html
    assert "<table" not in html


async def test_home_counts_are_live_and_refused_to_people_without_runs(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await launch(operator, demo_workflow)
    home = socket("/ws/home/", await cookie_for(operator))
    connected, _ = await home.connect(timeout=10)
    assert connected

    await cancel(operator, run)
    html = await home.receive_from(timeout=10)
    await home.disconnect()

    assert 'id="home-counts"' in html
    assert 'hx-swap-oob="true"' in html
    no_role = await cookie_for(await database_sync_to_async(user_with_role)(None))
    refused, _ = await socket("/ws/home/", no_role).connect(timeout=10)
    assert refused is False


@database_sync_to_async
def launch_with(operator: User, workflow: Workflow, invoice: str) -> Run:
    inputs = {**INPUTS, "invoice": invoice}
    return services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs=inputs)


async def test_a_new_run_matching_the_filters_goes_on_top_of_the_first_page(
    operator: User, demo_workflow: Workflow
) -> None:
    shown = await launch(operator, demo_workflow)
    watcher = socket(f"/ws/runs/?q=inv-7&newer_than={shown.pk}", await cookie_for(operator))
    connected, _ = await watcher.connect(timeout=10)
    assert connected

    await launch_with(operator, demo_workflow, "INV-6000")  # not matching: nothing to insert
    other = await watcher.receive_from(timeout=10)
    matching = await launch_with(operator, demo_workflow, "INV-7000")
    inserted = await watcher.receive_from(timeout=10)
    await cancel(operator, matching)
    changed = await watcher.receive_from(timeout=10)
    await watcher.disconnect()

    assert 'hx-swap-oob="outerHTML"' in other  # only a swap of a row that is not on screen
    assert inserted.startswith('<tbody hx-swap-oob="afterbegin:#run-rows">')
    assert f'<tr id="run-{matching.pk}"' in inserted
    assert 'id="run-rows-empty" hx-swap-oob="delete"' in inserted
    # Once on screen it is an ordinary row: changed in place, never inserted twice.
    assert changed.startswith(f'<tr id="run-{matching.pk}" hx-swap-oob="outerHTML">')
    assert "Cancelled" in changed


async def test_a_waiting_runs_page_hears_its_place_move_up(
    operator: User, acme_credential: Credential
) -> None:
    from tests.sessions.test_queue import limited

    workflow = await database_sync_to_async(limited)(operator, 1)
    running = await launch(operator, workflow)
    first = await launch(operator, workflow)
    second = await launch(operator, workflow)
    page = socket(f"/ws/runs/{second.pk}/queue/", await cookie_for(operator))
    connected, _ = await page.connect(timeout=10)
    assert connected
    assert "Queued, 1 ahead" in await page.receive_from(timeout=10)

    await cancel(operator, first)
    moved = await page.receive_from(timeout=10)
    await cancel(operator, running)
    dispatched = await page.receive_from(timeout=10)
    await page.disconnect()

    assert "Queued, 0 ahead" in moved
    assert "Waiting for a worker" in dispatched
    no_role = await cookie_for(await database_sync_to_async(user_with_role)(None))
    refused, _ = await socket(f"/ws/runs/{second.pk}/queue/", no_role).connect(timeout=10)
    assert refused is False
