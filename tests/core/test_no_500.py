"""No input gives a 500: arbitrary text thrown at every field of every form the dashboard shows
(found by reading the pages themselves), at the audit filters in the query string and at the
workflow import. A refused submission saves nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from approvals.models import ApprovalDecision
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions.models import Run
from tests.factories import ApprovalRequestFactory, user_with_role
from tests.sessions.conftest import EXAMPLE, acme_credential, no_background_runs, operator, publish
from workflows.models import Credential, Workflow

__all__ = ["acme_credential", "no_background_runs", "operator"]

pytestmark = pytest.mark.django_db

# What the drill threw, and what parsers trip over, besides hypothesis's own arbitrary text.
NASTY = [
    "1e30", "1e309", "9" * 29, "-0", "NaN", "Infinity", "547,70", "1,,,2", "7,130.90 EUR",
    "9999-12-31", "0001-01-01", "10000-01-01", "2026-02-30", "99999999999999999999999",
    "-1", "0", "\x00", "' OR 1=1 --", "<script>alert(1)</script>", "{{ 7*7 }}", "%s%n",
    "../../etc/passwd", "a" * 20_000, "\u202e\ufeff", "[" * 5000, "{a: " * 3000,
]  # fmt: skip
values = st.one_of(st.text(max_size=300), st.sampled_from(NASTY))
FAST = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class PageForm:
    action: str
    method: str
    fields: list[str] = field(default_factory=list)


class FormReader(HTMLParser):
    """The forms of a page: where they go and the names of their fields."""

    def __init__(self, page_url: str) -> None:
        super().__init__()
        self.page_url = page_url
        self.forms: list[PageForm] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form":
            action = attributes.get("action") or attributes.get("hx-post") or self.page_url
            method = (attributes.get("method") or "get").lower()
            self.forms.append(PageForm(action=action, method=method))
        elif tag in ("input", "select", "textarea") and self.forms:
            name = attributes.get("name")
            if name and attributes.get("type") not in ("submit", "file"):
                self.forms[-1].fields.append(name)


def forms_of(client: Client, url: str) -> list[PageForm]:
    response = client.get(url)
    assert response.status_code == 200, url
    reader = FormReader(url)
    reader.feed(response.content.decode())
    # Signing out would leave every later example on the login page.
    return [form for form in reader.forms if form.fields and form.action != "/logout/"]


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


@pytest.fixture
def client(admin: User) -> Client:
    client = Client()
    client.force_login(admin)
    return client


@pytest.fixture
def published(admin: User, acme_credential: Credential) -> Workflow:
    return publish(admin, yaml.safe_load(EXAMPLE.read_text()))


def saved() -> tuple[int, int, int]:
    """What a refused submission must leave as it was."""
    return AuditEvent.objects.count(), Run.objects.count(), ApprovalDecision.objects.count()


def throw(
    client: Client, form: PageForm, data: dict[str, Any], *, accepted: Callable[[Any], bool]
) -> None:
    before = saved()
    if form.method == "post":
        response = client.post(form.action, data)
    else:
        response = client.get(form.action, data)
    assert response.status_code < 500, (form.action, data)
    if not accepted(response):
        assert saved() == before, (form.action, data)


def refused_page(response: Any) -> bool:
    """A form shown again (200, 400, 403, 404) is a refusal; a redirect may be a success, and so
    is a download (an export of whatever the filters matched, which the trail records)."""
    downloaded = "attachment" in response.get("Content-Disposition", "")
    return response.status_code in (301, 302, 303) or downloaded


def form_pages(slug: str, approval_id: int) -> list[str]:
    return [
        "/workflows/new/",
        "/workflows/credentials/new/",
        f"/workflows/{slug}/",
        f"/workflows/{slug}/settings/",
        *(
            f"/workflows/{slug}/steps/add/?type={step_type}"
            for step_type in ("goto", "click", "fill", "select", "extract", "assert", "login")
        ),
        f"/workflows/{slug}/steps/0/edit/",
        f"/workflows/{slug}/parameters/0/edit/",
        f"/workflows/{slug}/parameters/add/",
        f"/runs/launch/{slug}/",
        "/audit/",
        f"/approvals/{approval_id}/",
    ]


def test_every_form_field_survives_arbitrary_text(client: Client, published: Workflow) -> None:
    # Evidence as the runner freezes it (the decision page shows its page text).
    approval = ApprovalRequestFactory.create(evidence={"page_text": "Pay INV-1001: 547.70 EUR"})
    forms = [
        form for url in form_pages(published.slug, approval.pk) for form in forms_of(client, url)
    ]
    assert len(forms) >= 10

    @settings(FAST, max_examples=120)
    @given(st.data())
    def submit(data: st.DataObject) -> None:
        form = data.draw(st.sampled_from(forms))
        filled = {name: data.draw(values) for name in form.fields}
        throw(client, form, filled, accepted=refused_page)

    submit()


def test_the_launch_form_saves_no_run_for_a_value_it_refuses(
    client: Client, published: Workflow
) -> None:
    launch_url = f"/runs/launch/{published.slug}/"
    (form,) = [f for f in forms_of(client, launch_url) if f.method == "post"]
    assert {"param_invoice", "param_amount"} <= set(form.fields)

    @FAST
    @given(values, values)
    def launch(invoice: str, amount: str) -> None:
        runs = Run.objects.count()
        response = client.post(form.action, {"param_invoice": invoice, "param_amount": amount})
        assert response.status_code in (200, 302)
        if response.status_code == 200:
            assert Run.objects.count() == runs

    launch()


@pytest.mark.parametrize("path", ["/audit/", "/audit/export/", "/audit/verify/"])
def test_the_audit_filters_survive_arbitrary_query_values(client: Client, path: str) -> None:
    names = ["date_from", "date_to", "actor", "action", "workflow", "run", "before", "after"]

    @settings(FAST, max_examples=60)
    @given(st.dictionaries(st.sampled_from(names), values))
    def filtered(query: dict[str, str]) -> None:
        events = AuditEvent.objects.count()
        send = client.post if path == "/audit/export/" else client.get
        response = send(path, query)
        assert response.status_code < 500, query
        if path == "/audit/" or response.status_code == 302:
            assert AuditEvent.objects.count() == events

    filtered()


def test_the_far_ends_of_the_calendar_get_the_forms_own_words(client: Client) -> None:
    response = client.get("/audit/", {"date_to": "9999-12-31"})

    assert response.status_code == 200
    assert "Pick a day between 1970-01-01 and 9998-12-31." in response.content.decode()
    events = AuditEvent.objects.count()
    response = client.post("/audit/export/", {"date_to": "9999-12-31"}, follow=True)
    assert "Nothing was exported: correct the filters first." in response.content.decode()
    assert AuditEvent.objects.count() == events


def test_the_import_survives_arbitrary_files(client: Client) -> None:
    files = st.one_of(
        st.binary(max_size=2000),
        st.text(max_size=2000).map(str.encode),
        st.sampled_from(NASTY).map(str.encode),
        st.recursive(
            st.one_of(st.none(), st.integers(), st.text(max_size=20)),
            lambda children: (
                st.lists(children, max_size=4)
                | st.dictionaries(st.text(max_size=10), children, max_size=4)
            ),
            max_leaves=30,
        ).map(lambda data: yaml.safe_dump(data).encode()),
    )

    @FAST
    @given(files)
    def upload(content: bytes) -> None:
        workflows = Workflow.objects.count()
        response = client.post(
            "/workflows/import/", {"file": SimpleUploadedFile("w.yaml", content)}
        )
        assert response.status_code == 200
        assert Workflow.objects.count() == workflows

    upload()


def test_deep_nesting_gets_the_imports_own_words(client: Client) -> None:
    response = client.post(
        "/workflows/import/",
        {"file": SimpleUploadedFile("w.yaml", ("[" * 5000 + "]" * 5000).encode())},
    )

    assert response.status_code == 200
    assert "nested more than 40 levels deep" in response.content.decode()
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("amount", ["1e30", "1e309", "9" * 29, "547,70", "1,,,2"])
def test_a_launch_with_an_impossible_amount_gets_the_forms_own_words(
    client: Client, published: Workflow, amount: str
) -> None:
    response = client.post(
        f"/runs/launch/{published.slug}/", {"param_invoice": "INV-1001", "param_amount": amount}
    )

    assert response.status_code == 200
    assert f"&#x27;{amount}&#x27;" in response.content.decode()
    assert not Run.objects.exists()


def test_an_id_beyond_64_bits_is_an_unknown_choice(client: Client, published: Workflow) -> None:
    events = AuditEvent.objects.count()

    response = client.post(
        f"/workflows/{published.slug}/settings/",
        {"name": "Renamed", "credentials": str(2**63), "step_budget": "10"},
    )

    assert response.status_code == 200
    assert "is not one of the available choices" in response.content.decode()
    assert AuditEvent.objects.count() == events
    published.refresh_from_db()
    assert published.name != "Renamed"
