"""A launch's ``callback_url``: the run's end and its approval requests, signed like webhooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from pandaweb.core.roles import Role
from pandaweb.webhooks import selectors as webhook_selectors
from pandaweb.webhooks import services as webhook_services
from pandaweb.webhooks.models import Message
from sessions.models import Run
from tests.factories import user_with_role
from tests.webhooks.conftest import Receiver, receiver
from workflows.models import Workflow

__all__ = ["receiver"]

pytestmark = pytest.mark.usefixtures(
    "no_background_runs", "deliveries_by_hand", "callbacks_to_loopback"
)


@pytest.fixture
def callbacks_to_loopback(settings: Any) -> None:
    """The administrators' list of callback hosts: the receivers of these tests, on loopback."""
    settings.CALLBACK_HOSTS = ["127.0.0.1"]


INPUTS = {"invoice": "INV-1001", "amount": "12.00"}


@pytest.fixture
def deliveries_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test delivers the outbox itself (``messages_drain``), at the moment it chooses."""
    monkeypatch.setattr(webhook_services, "dispatch", lambda task, **kwargs: None)


def launch(api: Any, callback_url: str = "", **headers: str) -> Any:
    body = {"workflow": "acme-pay-invoice", "inputs": INPUTS, "callback_url": callback_url}
    return api.post("/runs/", body, **headers)


def test_it_posts_the_runs_end_to_the_callback_url_signed(
    api_for: Callable[..., Any], operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    api = api_for(operator)
    response = launch(api, callback_url=receiver.url)
    assert response.status_code == 201
    run_id, callback = response.json()["id"], response.json()["callback"]
    assert callback["url"] == receiver.url
    assert callback["secret"].startswith("whsec_")

    assert api.post(f"/runs/{run_id}/cancel").status_code == 200
    receiver.secret = callback["secret"]
    assert webhook_services.messages_drain() == 1

    [delivery] = receiver.received
    assert delivery["verified"]
    assert delivery["payload"]["type"] == "run.failed"
    assert delivery["payload"]["data"]["id"] == run_id
    assert delivery["payload"]["data"]["status"] == "cancelled"
    assert Message.objects.get().status == Message.Status.DELIVERED


def test_it_sends_a_callback_only_for_its_own_run(
    api_for: Callable[..., Any], operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    api = api_for(operator)
    launch(api, callback_url=receiver.url)
    other = launch(api).json()
    assert other["callback"] is None

    api.post(f"/runs/{other['id']}/cancel")

    assert webhook_services.messages_drain() == 0
    assert receiver.received == []
    # A run's callback is not one of the installation's subscriptions.
    assert not webhook_selectors.subscriptions(user_with_role(Role.ADMINS)).exists()


def test_a_replayed_launch_answers_with_the_same_callback_secret(
    api_for: Callable[..., Any], operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    api = api_for(operator)
    key = {"Idempotency-Key": "erp-4712"}
    first = launch(api, receiver.url, **key)
    again = launch(api, receiver.url, **key)
    elsewhere = launch(api, receiver.url + "/elsewhere", **key)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["callback"] == first.json()["callback"]
    assert elsewhere.status_code == 409
    assert elsewhere.json()["type"].endswith("idempotency-key-reused")


def test_it_refuses_a_callback_url_that_is_not_http(
    api_for: Callable[..., Any], operator: User, demo_workflow: Workflow
) -> None:
    response = launch(api_for(operator), "ftp://example.test/hook")

    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "callback_url", "message": "The address must start with http:// or https://."}
    ]
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("hosts", "url", "said"),
    [
        ([], "http://127.0.0.1:9/hook", "Callbacks are off on this installation"),
        (["erp.example.com"], "http://169.254.169.254/latest/meta-data/", "may only go to"),
        (["erp.example.com"], "http://10.0.0.7/hook", "may only go to"),
        (["erp.example.com"], "https://erp.example.com.evil.test/hook", "may only go to"),
        (["*.example.com"], "https://example.com/hook", "may only go to"),
    ],
)
def test_a_callback_goes_only_to_a_host_the_administrators_listed(
    settings: Any, hosts: list[str], url: str, said: str
) -> None:
    # The decision alone: nothing is sent anywhere in this test.
    settings.CALLBACK_HOSTS = hosts
    assert said in webhook_services.callback_url_problem(url)


def test_a_listed_host_is_a_callback_address(settings: Any) -> None:
    settings.CALLBACK_HOSTS = ["erp.example.com", "*.payables.example.com"]
    assert webhook_services.callback_url_problem("https://erp.example.com/hooks/pandaweb") == ""
    assert webhook_services.callback_url_problem("https://eu.payables.example.com/h") == ""


def test_a_launch_with_a_callback_to_an_unlisted_host_is_refused_in_words(
    api_for: Callable[..., Any], operator: User, demo_workflow: Workflow
) -> None:
    response = launch(api_for(operator), callback_url="http://169.254.169.254/latest/")
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["field"] == "callback_url"
    assert "may only go to 127.0.0.1" in error["message"]
    assert not Run.objects.exists()
