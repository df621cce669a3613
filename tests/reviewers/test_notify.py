"""``notify(user, event)``: preferences, quiet hours in the user's time zone, e-mail, Slack
direct messages (fake Slack Web API on loopback) and Web Push to a fake push service on loopback.

The push service is faked because a browser's real one is its vendor's (Chromium subscribes
through Google's FCM), which cannot be reached from here; pywebpush posts to whatever endpoint the
subscription names, so a loopback endpoint receives exactly what FCM would. The fake decrypts the
payload with the subscription's private key, as the browser would.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import http_ece
import pytest
import time_machine
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings

from approvals.models import ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.reviewers import services as reviewers
from pandaweb.reviewers.models import NotificationPreference, PushSubscription, SlackIdentity
from pandaweb.reviewers.notify import ApprovalEvent, notify
from pandaweb.reviewers.push import application_server_key
from pandaweb.reviewers.selectors import reach_of, reach_sentence
from tests.approvals.fake_slack import FakeSlack
from tests.approvals.reach import TEAM, background, fake_slack, open_request, reach_workflow
from tests.factories import user_with_role
from tests.sessions.conftest import acme_credential, operator

__all__ = ["acme_credential", "background", "fake_slack", "operator"]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class FakePushService:
    """A push service endpoint: records each message, decrypted with the browser's keys."""

    def __init__(self, status: int = 201) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)
        self.received: list[dict[str, Any]] = []
        self.status = status
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                plain = http_ece.decrypt(body, private_key=fake.key, auth_secret=fake.auth)
                fake.received.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "data": json.loads(plain),
                    }
                )
                self.send_response(fake.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/push/abc123"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def subscription(self) -> dict[str, Any]:
        public = self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return {"endpoint": self.endpoint, "keys": {"p256dh": b64(public), "auth": b64(self.auth)}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def push_service(settings: Settings) -> Iterator[FakePushService]:
    settings.WEB_PUSH_ALLOW_HTTP = True
    service = FakePushService()
    yield service
    service.close()


@pytest.fixture
def rory(db: None) -> User:
    return user_with_role(Role.REVIEWERS, username="rory", email="rory@example.test")


def subscribe(user: User, service: FakePushService) -> PushSubscription:
    data = service.subscription()
    return reviewers.push_subscription_save(
        user=user,
        endpoint=data["endpoint"],
        p256dh=data["keys"]["p256dh"],
        auth=data["keys"]["auth"],
    )


EVENT = ApprovalEvent(
    kind="approval.requested",
    approval_id=0,
    title="Approval needed: Pay an Acme invoice (run #7)",
    body="Click the button 'Submit payment'\n\nmore",
    url="http://127.0.0.1:8000/approvals/3/",
)


@pytest.mark.django_db
def test_it_pushes_an_encrypted_signed_message_to_the_subscription(
    rory: User, push_service: FakePushService, mailoutbox: list[Any]
) -> None:
    subscribe(rory, push_service)

    assert notify(rory, EVENT) == ["email", "push"]

    [message] = push_service.received
    assert message["path"] == "/push/abc123"
    assert message["data"] == {
        "title": EVENT.title,
        "body": "Click the button 'Submit payment'",
        "url": EVENT.url,
    }
    assert message["headers"]["content-encoding"] == "aes128gcm"
    # RFC 8292: a JWT for this push service, signed with the key browsers subscribed with.
    token, key = (
        part.split("=", 1)[1]
        for part in message["headers"]["authorization"].removeprefix("vapid ").split(",")
    )
    assert key == application_server_key()
    header, claims, signature = token.split(".")
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64(key))
    raw = unb64(signature)
    public.verify(
        encode_dss_signature(int.from_bytes(raw[:32]), int.from_bytes(raw[32:])),
        f"{header}.{claims}".encode(),
        ec.ECDSA(hashes.SHA256()),
    )
    assert json.loads(unb64(claims))["aud"] == push_service.endpoint.rsplit("/push", 1)[0]
    [mail] = mailoutbox
    assert mail.to == ["rory@example.test"]
    assert mail.subject == EVENT.title


@pytest.mark.django_db
def test_quiet_hours_in_the_users_time_zone_skip_push_and_slack_but_not_email(
    rory: User, push_service: FakePushService, mailoutbox: list[Any]
) -> None:
    subscribe(rory, push_service)
    reviewers.notification_preference_update(
        user=rory,
        email=True,
        slack=True,
        push=True,
        quiet_start=time(22, 0),
        quiet_end=time(7, 0),
        time_zone="Europe/Berlin",
    )

    # 21:30 UTC is 22:30 in Berlin in winter: quiet.
    with time_machine.travel(datetime(2026, 12, 2, 21, 30, tzinfo=UTC), tick=False):
        assert notify(rory, EVENT) == ["email"]
    assert push_service.received == []
    # 20:30 UTC is 21:30 in Berlin: not quiet yet.
    with time_machine.travel(datetime(2026, 12, 2, 20, 30, tzinfo=UTC), tick=False):
        assert notify(rory, EVENT) == ["email", "push"]
    assert len(push_service.received) == 1
    assert len(mailoutbox) == 2


@pytest.mark.django_db
def test_it_uses_only_the_channels_the_user_chose(
    rory: User, push_service: FakePushService, mailoutbox: list[Any]
) -> None:
    subscribe(rory, push_service)
    reviewers.notification_preference_update(
        user=rory,
        email=False,
        slack=True,
        push=False,
        quiet_start=None,
        quiet_end=None,
        time_zone="UTC",
    )

    assert notify(rory, EVENT) == []
    assert mailoutbox == []
    assert push_service.received == []


@pytest.mark.django_db
def test_a_gone_subscription_is_forgotten(rory: User, push_service: FakePushService) -> None:
    subscribe(rory, push_service)
    push_service.status = 410

    assert notify(rory, EVENT) == ["email"]
    assert not PushSubscription.objects.exists()


@pytest.mark.django_db
def test_it_refuses_push_endpoints_that_are_not_public_https(
    rory: User, settings: Settings
) -> None:
    settings.WEB_PUSH_ALLOW_HTTP = False
    keys = {"p256dh": "BAAA", "auth": "AAAA"}
    for endpoint, why in [
        ("http://push.example.com/x", "https URL"),
        ("https://169.254.169.254/latest/meta-data", "private, loopback or link-local"),
        ("https://10.0.0.7/push", "private, loopback or link-local"),
        ("https://127.0.0.1:9/push", "private, loopback or link-local"),
    ]:
        with pytest.raises(reviewers.ReviewerError, match=why):
            reviewers.push_subscription_save(user=rory, endpoint=endpoint, **keys)
    answer = Client()
    answer.force_login(rory)
    response = answer.post(
        "/profile/push/",
        data=json.dumps({"endpoint": "https://169.254.169.254/x", "keys": keys}),
        content_type="application/json",
    )
    assert response.status_code == 400
    assert not PushSubscription.objects.exists()


@pytest.mark.django_db
def test_it_refuses_quiet_hours_in_an_unknown_time_zone(rory: User) -> None:
    with pytest.raises(reviewers.ReviewerError, match="unknown time zone"):
        reviewers.notification_preference_update(
            user=rory,
            email=True,
            slack=True,
            push=True,
            quiet_start=time(22),
            quiet_end=time(7),
            time_zone="Mars/Olympus",
        )
    assert not NotificationPreference.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_opened_request_reaches_each_reviewer_on_their_channels(
    operator: User,
    acme_credential: Any,
    fake_slack: FakeSlack,
    background: list[dict[str, Any]],
    push_service: FakePushService,
    mailoutbox: list[Any],
) -> None:
    rory = user_with_role(Role.REVIEWERS, username="rory", email="rory@example.test")
    rita = user_with_role(Role.REVIEWERS, username="rita", email="rita@example.test")
    SlackIdentity.objects.create(user=rita, team_id=TEAM, slack_user_id="U0RITA")
    subscribe(rory, push_service)
    workflow = reach_workflow(operator)  # no channel: only the reviewers' own channels

    approval = open_request(operator, workflow)

    assert sorted(m.to[0] for m in mailoutbox) == ["rita@example.test", "rory@example.test"]
    [push] = push_service.received
    assert push["data"]["url"].endswith(f"/approvals/{approval.pk}/")
    [dm] = fake_slack.of("chat.postMessage")
    assert dm.params["channel"] == "U0RITA"
    assert approval.action in json.dumps(dm.params["blocks"])
    assert ApprovalRequest.objects.get().slack_cards.get().channel == "D0RITA"


@pytest.mark.django_db
def test_the_profile_page_saves_preferences_and_issues_a_slack_link_code(rory: User) -> None:
    client = Client()
    client.force_login(rory)
    assert client.get("/profile/").status_code == 200

    client.post(
        "/profile/notifications/",
        {
            "email": "on",
            "push": "on",
            "quiet_start": "22:00",
            "quiet_end": "07:00",
            "time_zone": "Europe/Berlin",
        },
    )
    preference = NotificationPreference.objects.get(user=rory)
    assert (preference.email, preference.slack, preference.push) == (True, False, True)
    assert (preference.quiet_start, preference.quiet_end) == (time(22), time(7))

    page = client.post("/profile/slack/code/", follow=True).content.decode()
    assert "/pandaweb link " in page


@pytest.mark.django_db
def test_a_channel_is_off_until_it_can_deliver(
    push_service: FakePushService, mailoutbox: list[Any], settings: Settings
) -> None:
    settings.SLACK_BOT_TOKEN = ""
    nobody = user_with_role(Role.REVIEWERS, username="nobody", email="")

    assert [(r.channel, r.chosen, r.on) for r in reach_of(nobody)] == [
        ("email", True, False),
        ("slack", True, False),
        ("push", True, False),
    ]
    assert reach_sentence(reach_of(nobody)) == (
        "Nothing reaches you outside this dashboard: add an e-mail address or enable browser "
        "notifications below."
    )
    assert notify(nobody, EVENT) == []

    reviewers.email_address_set(user=nobody, address="nobody@example.test")
    subscribe(nobody, push_service)

    assert reach_sentence(reach_of(nobody)) == (
        "Approval requests and questions for you arrive by e-mail to nobody@example.test and "
        "by push to the browser you enabled."
    )
    assert notify(nobody, EVENT) == ["email", "push"]
    assert [m.to for m in mailoutbox] == [["nobody@example.test"]]


@pytest.mark.django_db
def test_it_sets_a_valid_address_once_and_audits_it(rory: User) -> None:
    assert reviewers.email_address_set(user=rory, address="  Rory@EXAMPLE.test ") == (
        "Rory@example.test"
    )
    assert reviewers.email_address_set(user=rory, address="Rory@example.test") == (
        "Rory@example.test"
    )
    rory.refresh_from_db()
    assert rory.email == "Rory@example.test"
    [event] = AuditEvent.objects.filter(action="notifications.email_changed")
    assert (event.actor_id, event.before, event.after) == (
        rory.pk,
        {"email": "rory@example.test"},
        {"email": "Rory@example.test"},
    )

    for bad in ["rory", "rory@", "rory@example..test", "a b@example.test"]:
        with pytest.raises(reviewers.ReviewerError, match="is not an e-mail address"):
            reviewers.email_address_set(user=rory, address=bad)
    rory.refresh_from_db()
    assert rory.email == "Rory@example.test"


@pytest.mark.django_db
def test_the_profile_page_refuses_a_bad_address_keeping_what_was_typed(rory: User) -> None:
    client = Client()
    client.force_login(rory)

    response = client.post("/profile/", {"email_address": "rory at example"})

    assert response.status_code == 400
    page = response.content.decode()
    assert "Not saved: &#x27;rory at example&#x27; is not an e-mail address" in page
    assert 'value="rory at example"' in page
    rory.refresh_from_db()
    assert rory.email == "rory@example.test"

    saved = client.post("/profile/", {"email_address": "rory@new.example"}, follow=True)
    assert "Approval requests can now be e-mailed to rory@new.example." in saved.content.decode()
    assert "arrive by e-mail to rory@new.example" in saved.content.decode()
    page = client.post("/profile/", {"email_address": ""}, follow=True).content.decode()
    assert "Nothing reaches you outside this dashboard" in page
    rory.refresh_from_db()
    assert rory.email == ""
