"""Nothing of team B reaches team A: every URL and API endpoint, by id and by search, for each
role a person can hold in a team.

Every record of the every-page seed (runs in each state, an approval, a question, a schedule, a
batch, a webhook with a delivery, a scratch session, the demo workflows and their credential) is
moved to team B; team A's operator, reviewer and compliance person then ask for each of them.

- An object's address (a run, an approval, a workflow, a schedule…) with B's id must answer
  exactly as the same address with an id that does not exist: a refusal that says "exists, not
  yours" leaks as much as the object.
- A list, search, count or export must not show any of B's markers (names, slugs, the invoice
  number in B's runs' inputs).
- Addresses that hold no team's data say why in ``INSTALLATION``.

``test_every_endpoint_has_a_rule`` fails for an address added without a rule here; each role's
test prints one row per endpoint.
"""

# ruff: noqa: E501 (the rules read best as one line per address)
from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from pandaweb.api import services as api_services
from pandaweb.api.scopes import Scope
from pandaweb.core.models import Team
from pandaweb.core.roles import Role
from pandaweb.webhooks.models import Subscription
from sessions.models import Artifact, Run, SavedRunView
from tests.e2e import every_page_seed
from tests.factories import member_of, team_make
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.django_db

MISSING_ID = 987654
MISSING_SLUG = "no-such-workflow-here"


@dataclass(frozen=True)
class Endpoint:
    """``path`` is formatted with B's ids (or, for the comparison, with ids that do not exist)."""

    kind: str  # "object" or "list"
    path: str
    method: str = "GET"
    body: dict[str, Any] = field(default_factory=dict)
    api: bool = False


def obj(path: str, method: str = "GET", **body: Any) -> Endpoint:
    return Endpoint("object", path, method, body, api=path.startswith("/api/"))


def listing(path: str) -> Endpoint:
    return Endpoint("list", path, api=path.startswith("/api/"))


DECISION = {"verdict": "approve", "evidence_sha256": "0" * 64, "reason": "looks right"}
SCHEDULE = {"name": "Mine", "cron": "0 6 * * *", "inputs": {}}
# A new workflow of the asker's own team that names B's credential (a file naming B's slug is
# answered as a taken slug: tests/workflows/test_teams.py).
FILE_NAMING_THE_CREDENTIAL = {
    "pandaweb": 1, "name": "Mine", "slug": "mine-from-team-a",
    "settings": {"allowed_hosts": ["127.0.0.1:8001"], "credentials": ["{credential_name}"]},
    "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/"}],
}  # fmt: skip

# Every named address that holds a team's data: name → the requests that must keep B's apart.
RULES: dict[str, tuple[Endpoint, ...]] = {
    # Dashboard: workflows and credentials
    "workflows:index": (listing("/workflows/"), listing("/workflows/?q=acme")),
    "workflows:detail": (obj("/workflows/{slug}/"),),
    "workflows:settings": (obj("/workflows/{slug}/settings/"), obj("/workflows/{slug}/settings/", "POST", name="x")),
    "workflows:step_add": (obj("/workflows/{slug}/steps/add/?type=click"),),
    "workflows:step_edit": (obj("/workflows/{slug}/steps/0/edit/"),),
    "workflows:step_action": (obj("/workflows/{slug}/steps/0/delete/", "POST"),),
    "workflows:session": (obj("/workflows/{slug}/session/"),),
    "workflows:session_remove": (obj("/workflows/{slug}/session/remove/", "POST"),),
    "workflows:session_step_add": (obj("/workflows/{slug}/session/steps/add/?type=fill"),),
    "workflows:session_step_edit": (obj("/workflows/{slug}/session/steps/0/edit/"),),
    "workflows:session_step_action": (obj("/workflows/{slug}/session/steps/0/delete/", "POST"),),
    "workflows:parameter_add": (obj("/workflows/{slug}/parameters/add/"),),
    "workflows:parameter_edit": (obj("/workflows/{slug}/parameters/0/edit/"),),
    "workflows:parameter_delete": (obj("/workflows/{slug}/parameters/0/delete/", "POST"),),
    "workflows:publish": (obj("/workflows/{slug}/publish/", "POST", message="mine now"),),
    "workflows:archive": (obj("/workflows/{slug}/archive/", "POST"),),
    "workflows:diff": (obj("/workflows/{slug}/diff/?from=1&to=2"),),
    "workflows:version": (obj("/workflows/{slug}/versions/1/"),),
    "workflows:export": (obj("/workflows/{slug}/versions/1/export.yaml"),),
    "workflows:credentials": (listing("/workflows/credentials/"),),
    "workflows:credential_replace": (obj("/workflows/credentials/{credential}/replace/"),),
    # Runs
    "runs:index": (listing("/runs/"), listing("/runs/?q=INV-2042"), listing("/runs/?status=failed")),
    "runs:workflow_runs": (obj("/runs/workflow/{slug}/"),),
    "runs:export": (listing("/runs/export.csv"), listing("/runs/export.csv?q=INV-2042")),
    "runs:view_delete": (obj("/runs/views/{view}/delete/", "POST"),),
    "runs:triage": (listing("/runs/failures/"),),
    "runs:compare": (obj("/runs/failures/compare/?a={failed}&b={failed_again}"),),
    "runs:rerun": (obj("/runs/{failed}/again/"),),
    "runs:launch": (obj("/runs/launch/{slug}/"),),
    "runs:detail": (obj("/runs/{waiting}/"), obj("/runs/{finished}/")),
    "runs:cancel": (obj("/runs/{running}/cancel/", "POST"),),
    "runs:dismiss": (obj("/runs/{failed}/dismiss/", "POST"),),
    "runs:reconcile": (obj("/runs/{unsure}/reconcile/", "POST", happened="no", note="checked"),),
    "runs:step": (obj("/runs/{failed}/steps/0/"),),
    "runs:heal": (obj("/runs/{failed}/steps/3/heal/"),),
    "runs:heal_picture": (obj("/runs/{failed}/steps/3/heal/1.png"),),
    "runs:file": (obj("/runs/{finished}/files/{artifact_path}"),),
    "runs:scratch_open": (obj("/runs/scratch/open/{slug}/", "POST"),),
    "runs:scratch": (obj("/runs/scratch/{scratch}/"),),
    "runs:scratch_ask": (obj("/runs/scratch/{scratch}/ask/", "POST"),),
    "runs:scratch_use": (obj("/runs/scratch/{scratch}/use/", "POST"),),
    "runs:scratch_record": (obj("/runs/scratch/{scratch}/record/", "POST"),),
    "runs:scratch_assist": (obj("/runs/scratch/{scratch}/ask-model/", "POST"),),
    "runs:scratch_assist_add": (obj("/runs/scratch/{scratch}/add-drafted/", "POST"),),
    "runs:scratch_close": (obj("/runs/scratch/{scratch}/close/", "POST"),),
    "runs:scratch_picture": (obj("/runs/scratch/{scratch}/pictures/before.png"),),
    "runs:session_template": (obj("/runs/session-templates/{slug}/"),),
    "runs:session_template_bake": (obj("/runs/session-templates/{slug}/bake/", "POST"),),
    # Approvals and questions
    "approvals:index": (listing("/approvals/"), listing("/approvals/?status=all")),
    "approvals:detail": (obj("/approvals/{approval}/"),),
    "approvals:decide": (obj("/approvals/{approval}/decide/", "POST", verdict="approve"),),
    "approvals:passkey_options": (obj("/approvals/{approval}/passkey/", "POST"),),
    "approvals:comment": (obj("/approvals/{approval}/comment/", "POST", text="hello"),),
    "approvals:reassign": (obj("/approvals/{approval}/reassign/", "POST"),),
    "approvals:question_answer": (obj("/approvals/questions/{question}/answer/", "POST", answer="123456"),),
    "slack:preview": (obj("/integrations/slack/preview/{approval}/"),),
    # Audit
    "audit:index": (listing("/audit/"), listing("/audit/?q=INV-2042")),
    "audit:export": (listing("/audit/export/"),),
    "audit:run": (obj("/audit/runs/{finished}/"),),
    "audit:run_bundle": (obj("/audit/runs/{finished}/bundle.zip"),),
    # Schedules and batches
    "schedules:create": (obj("/schedules/new/{slug}/"),),
    "schedules:detail": (obj("/schedules/{schedule}/"),),
    "schedules:pause": (obj("/schedules/{schedule}/pause/", "POST"),),
    "schedules:batch_create": (obj("/batches/new/{slug}/"),),
    "schedules:batch_template": (obj("/batches/new/{slug}/template.csv"),),
    "schedules:batch": (obj("/batches/{batch}/"),),
    "schedules:batch_outputs": (obj("/batches/{batch}/outputs.csv"),),
    # Webhooks
    "webhooks:index": (listing("/webhooks/"),),
    "webhooks:detail": (obj("/webhooks/{subscription}/"),),
    "webhooks:active": (obj("/webhooks/{subscription}/active/", "POST"),),
    "webhooks:secret": (obj("/webhooks/{subscription}/secret/", "POST"),),
    "webhooks:deliveries": (listing("/webhooks/deliveries/"),),
    "webhooks:delivery": (obj("/webhooks/deliveries/{message}/"),),
    "webhooks:redeliver": (obj("/webhooks/deliveries/{message}/redeliver/", "POST"),),
    # Home: counts and the person's own lists
    "home": (listing("/"),),
    # The HTTP API
    "api:workflow_list": (listing("/api/v1/workflows/"),),
    "api:workflow_import": (obj("/api/v1/workflows/import", "POST", **FILE_NAMING_THE_CREDENTIAL),),
    "api:workflow_get": (obj("/api/v1/workflows/{slug}"),),
    "api:workflow_version": (obj("/api/v1/workflows/{slug}/versions/1"),),
    "api:workflow_version_yaml": (obj("/api/v1/workflows/{slug}/versions/1/yaml"),),
    "api:workflow_draft": (obj("/api/v1/workflows/{slug}/draft"),),
    "api:workflow_draft_start": (obj("/api/v1/workflows/{slug}/draft", "POST"),),
    "api:workflow_settings": (obj("/api/v1/workflows/{slug}/settings", "PATCH", name="x"),),
    "api:workflow_publish": (obj("/api/v1/workflows/{slug}/publish", "POST", message="x"),),
    "api:workflow_archive": (obj("/api/v1/workflows/{slug}/archive", "POST"),),
    "api:workflow_restore": (obj("/api/v1/workflows/{slug}/restore", "POST"),),
    "api:workflow_versions": (obj("/api/v1/workflows/{slug}/versions"),),
    "api:workflow_diff": (obj("/api/v1/workflows/{slug}/diff?from_version=1&to_version=2"),),
    "api:session_template_get": (obj("/api/v1/workflows/{slug}/session-template"),),
    "api:session_template_bake": (obj("/api/v1/workflows/{slug}/session-template/bake", "POST"),),
    "api:run_launch": (obj("/api/v1/runs/", "POST", workflow="{slug}", inputs={}),),
    "api:run_list": (listing("/api/v1/runs/"), listing("/api/v1/runs/?workflow={slug}")),
    "api:run_get": (obj("/api/v1/runs/{waiting}"),),
    "api:run_cancel": (obj("/api/v1/runs/{running}/cancel", "POST"),),
    "api:run_again": (obj("/api/v1/runs/{failed}/again", "POST"),),
    "api:run_reconcile": (obj("/api/v1/runs/{unsure}/reconcile", "POST", happened=False, note="checked"),),
    "api:heal_get": (obj("/api/v1/runs/{failed}/steps/3/healing"),),
    "api:heal_picture": (obj("/api/v1/runs/{failed}/steps/3/healing/elements/1.png"),),
    "api:heal_model": (obj("/api/v1/runs/{failed}/steps/3/healing/model", "POST"),),
    "api:heal_apply": (obj("/api/v1/runs/{failed}/steps/3/healing", "POST", number=1),),
    "api:question_answer": (obj("/api/v1/runs/{answering}/questions/{question}/answer", "POST", answer="123456"),),
    "api:run_file": (obj("/api/v1/runs/{finished}/files/{artifact_path}"),),
    "api:run_artifact": (obj("/api/v1/runs/{finished}/artifacts/{artifact}"),),
    "api:run_bundle": (obj("/api/v1/runs/{finished}/bundle"),),
    "api:question_list": (listing("/api/v1/questions/"),),
    "api:approval_list": (listing("/api/v1/approvals/"), listing("/api/v1/approvals/?status=all")),
    "api:approval_get": (obj("/api/v1/approvals/{approval}"),),
    "api:approval_decide": (obj("/api/v1/approvals/{approval}/decision", "POST", **DECISION),),
    "api:approval_comment": (obj("/api/v1/approvals/{approval}/comments", "POST", body="hello"),),
    "api:approval_hand_over": (obj("/api/v1/approvals/{approval}/assignee", "POST", group="Reviewers", note="yours"),),
    "api:audit_export": (listing("/api/v1/audit/export"),),
    "api:audit_events": (listing("/api/v1/audit/events"), listing("/api/v1/audit/events?action=run.")),
    "api:webhook_list": (listing("/api/v1/webhooks/"),),
    "api:webhook_create": (obj("/api/v1/webhooks/", "POST", name="x", url="http://127.0.0.1:9/", events=["run.finished"], workflow="{slug}"),),
    "api:webhook_get": (obj("/api/v1/webhooks/{subscription}"),),
    "api:webhook_update": (obj("/api/v1/webhooks/{subscription}", "PATCH", name="x"),),
    "api:webhook_delete": (obj("/api/v1/webhooks/{subscription}", "DELETE"),),
    "api:webhook_secret": (obj("/api/v1/webhooks/{subscription}/secret", "POST"),),
    "api:webhook_deliveries": (listing("/api/v1/webhooks/deliveries/"),),
    "api:webhook_delivery": (obj("/api/v1/webhooks/deliveries/{message}"),),
    "api:webhook_redeliver": (obj("/api/v1/webhooks/deliveries/{message}/redeliver", "POST"),),
    "api:credential_list": (listing("/api/v1/credentials/"),),
    "api:credential_value": (obj("/api/v1/credentials/{credential_name}/value", "POST", values={"username": "u", "password": "p"}),),
    "api:schedule_list": (listing("/api/v1/schedules/"), listing("/api/v1/schedules/?workflow={slug}")),
    "api:schedule_create": (obj("/api/v1/schedules/", "POST", workflow="{slug}", **SCHEDULE),),
    "api:schedule_get": (obj("/api/v1/schedules/{schedule}"),),
    "api:schedule_update": (obj("/api/v1/schedules/{schedule}", "PATCH", paused=True),),
    "api:schedule_delete": (obj("/api/v1/schedules/{schedule}", "DELETE"),),
    "api:batch_launch": (obj("/api/v1/batches/", "POST", workflow="{slug}", rows=[{}]),),
    "api:batch_get": (obj("/api/v1/batches/{batch}"),),
    "api:batch_outputs": (obj("/api/v1/batches/{batch}/outputs.csv"),),
    "api:team_list": (listing("/api/v1/teams/"),),
    "api:team_get": (obj("/api/v1/teams/{team}"),),
    "api:team_member_add": (obj("/api/v1/teams/{team}/members", "POST", username="a-operators", role="Operators"),),
    "api:team_member_remove": (obj("/api/v1/teams/{team}/members/a-operators/Operators", "DELETE"),),
}  # fmt: skip

OWN = "the person's own account, not a team's data"
POST_FORM = "a form to make something new in one of the person's own teams; what it makes is checked by the rules of the thing made"
ADMIN = "installation administration (admins only, who hold every team)"
INSTALLATION: dict[str, str] = {
    "login": "signing in",
    "logout": "signing out",
    "sso_start": "single sign-on's redirect to the provider",
    "sso_callback": "single sign-on's return from the provider",
    "oauth_token": "the OAuth token endpoint: machine identities, their scopes capped per object",
    "profile": OWN,
    "profile_slack_code": OWN,
    "profile_slack_unlink": OWN,
    "profile_passkey_options": OWN,
    "profile_passkey_register": OWN,
    "profile_passkey_delete": OWN,
    "profile_notifications": OWN,
    "profile_push": OWN,
    "account:tokens": OWN,
    "account:token_revoke": OWN,
    "account:service_accounts": ADMIN,
    "account:oauth_client_revoke": ADMIN,
    "teams:index": "the person's own teams (test_views: a member sees only theirs)",
    "teams:detail": ADMIN,
    "teams:member_add": ADMIN,
    "teams:member_remove": ADMIN,
    "system": ADMIN,
    "system_ping": ADMIN,
    "workflows:create": POST_FORM,
    "workflows:import": POST_FORM,
    "workflows:credential_create": POST_FORM,
    "webhooks:create": POST_FORM,
    "runs:view_create": "saves the person's own filter; what it lists is runs:index's rule",
    "schedules:preview": "the next times of a cron expression typed in a form: no stored data",
    "slack:interactions": "Slack's signed callback: it decides through approval_decide, whose team rule tests/approvals/test_teams.py checks",
    "slack:commands": "Slack's signed slash command: lists through the same selectors",
    "slack:card_image": "an unguessable token's picture, made for one card sent to one person",
    "api:openapi-json": "the API's description",
    "api:openapi-view": "the API's description",
    "api:api-root": "the API's description",
    "api:None": "the API's catch-all 404",
    "api:credential_create": POST_FORM,
    "api:batch_launch_csv": "a CSV batch: the same service and rule as api:batch_launch",
    "audit:verify": "answers whether the trail the person may read verifies, and where not: no event's content",
    "api:events": "a stream that never ends on its own: its team rule is tests/api/test_events_stream.py::test_a_stream_hears_only_its_owners_teams",
    "api:audit_verify": "verifies the caller's own file; reads no stored team data",
    "api:token_list": OWN,
    "api:token_create": OWN,
    "api:token_revoke": OWN,
    "api:service_account_list": ADMIN,
    "api:service_account_create": ADMIN,
    "api:service_account_token_create": ADMIN,
    "api:system_health": ADMIN,
    "api:system_ping": ADMIN,
    "api:team_create": ADMIN,
}
TEAM_ROLES = (Role.OPERATORS, Role.REVIEWERS, Role.COMPLIANCE)


def url_names(
    patterns: list[URLPattern | URLResolver] | None = None, namespace: str = ""
) -> Iterator[str]:
    for item in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(item, URLResolver):
            if str(item.pattern).startswith("admin/"):
                continue  # Django's admin: superusers only
            inner = f"{namespace}{item.namespace}:" if item.namespace else namespace
            yield from url_names(item.url_patterns, inner)
        else:
            yield f"{namespace}{item.name}"


def test_every_endpoint_has_a_rule() -> None:
    names = set(url_names())
    missing = sorted(names - set(RULES) - set(INSTALLATION))
    stale = sorted((set(RULES) | set(INSTALLATION)) - names)

    assert missing == [], f"addresses with no team rule in test_isolation_matrix: {missing}"
    assert stale == [], f"rules for addresses that no longer exist: {stale}"


@dataclass
class World:
    ids: dict[str, Any]
    markers: tuple[str, ...]


@pytest.fixture
def team_b_world(tmp_path: Path, run_files_in_tmp: Path) -> World:
    """The every-page seed, all of it in team B."""
    call_command("setup_roles", "--demo-users", "--password-file", str(tmp_path / "logins.json"),
                 stdout=io.StringIO())  # fmt: skip
    call_command("demo_workflow", stdout=io.StringIO())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        every_page_seed.seed()
    ids: dict[str, Any] = json.loads(printed.getvalue().strip().splitlines()[-1])
    team_b = team_make("team-b")
    Workflow.objects.update(team=team_b)
    Run.objects.update(team=team_b)
    Credential.objects.update(team=team_b)
    Subscription.objects.update(team=team_b)
    finished = Run.objects.get(pk=ids["finished"])
    artifact = Artifact.objects.create(
        run=finished, step_index=0, name="invoice", filename="invoice.pdf",
        path="downloads/invoice.pdf", size=4, sha256="0" * 64,
    )  # fmt: skip
    b_operator = Run.objects.get(pk=ids["finished"]).launched_by
    view = SavedRunView.objects.create(user=b_operator, name="B's view", query="q=INV-2042")
    credential = Credential.objects.get(pk=ids["credential"])
    ids |= {
        "artifact": artifact.pk,
        "artifact_path": artifact.path,
        "view": view.pk,
        "team": team_b.slug,
        "credential_name": credential.name,
    }
    names = list(Workflow.objects.values_list("name", flat=True))
    slugs = list(Workflow.objects.values_list("slug", flat=True))
    # B's people's names too (the audit trail's actor suggestions).
    markers = (*names, *slugs, credential.name, "INV-2042", "Monthly supplier payment",
               "ERP run outcomes", b_operator.get_username())  # fmt: skip
    return World(ids=ids, markers=markers)


def missing_ids(ids: dict[str, Any]) -> dict[str, Any]:
    return {
        key: MISSING_SLUG if isinstance(value, str) else MISSING_ID for key, value in ids.items()
    } | {"artifact_path": "downloads/missing.pdf", "credential_name": "no-such-credential"}


def fill(value: Any, ids: dict[str, Any]) -> Any:
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, dict):
        return {key: fill(item, ids) for key, item in value.items()}
    if isinstance(value, list):
        return [fill(item, ids) for item in value]
    return value


def ask(client: Client, token: str, endpoint: Endpoint, ids: dict[str, Any]) -> tuple[int, str]:
    path = endpoint.path.format(**ids)
    body = fill(endpoint.body, ids)
    headers = {"Authorization": f"Bearer {token}"} if endpoint.api else {}
    method = getattr(client, endpoint.method.lower())
    if endpoint.api and endpoint.method != "GET":
        response = method(
            path, data=json.dumps(body), content_type="application/json", headers=headers
        )
    else:
        response = method(path, data=body or None, headers=headers)
    content = b"".join(response) if response.streaming else response.content
    return response.status_code, content.decode("utf-8", "replace")


def unnamed(text: str, ids: list[Any]) -> str:
    """``text`` without the ids it may have been asked about (the asker's own words)."""
    for value in sorted({str(v) for v in ids}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(value)}(?![\w.-])", "…", text)
    return text


def check(client: Client, token: str, endpoint: Endpoint, world: World) -> str:
    """'' when team B's data stays apart; else what reached team A."""
    status, text = ask(client, token, endpoint, world.ids)
    if endpoint.kind == "object":
        absent = missing_ids(world.ids)
        absent_status, absent_text = ask(client, token, endpoint, absent)
        if status != absent_status or status < 400:
            return f"B's object answered {status}; a missing one answers {absent_status}"
        # An API's answer is words and fields only: they too must be a missing object's.
        ids = [*world.ids.values(), *absent.values()]
        if endpoint.api and unnamed(text, ids) != unnamed(absent_text, ids):
            return f"B's object answered {unnamed(text, ids)!r}; a missing one {unnamed(absent_text, ids)!r}"
        return ""
    # A search box shows what was searched for: that is the asker's own text, not B's.
    path = endpoint.path.format(**world.ids)
    shown = [
        marker
        for marker in world.markers
        if marker not in path and re.search(re.escape(marker), text)
    ]
    return f"answered {status} showing {shown}" if shown else ""


@pytest.mark.parametrize("role", TEAM_ROLES, ids=[role.value for role in TEAM_ROLES])
def test_nothing_of_team_b_reaches_team_a(
    role: Role, team_b_world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    team_a: Team = team_make("team-a")
    person = member_of(team_a, role, username=f"a-{role.value.lower()}")
    scopes = [str(s) for s in api_services.effective_scopes(person, [s.value for s in Scope])]
    _, token = api_services.token_create(
        actor=person, owner=person, name="matrix", scopes=scopes, expires_at=None
    )
    # A 500 is a row of the table (a refusal that crashed), not the end of the test.
    client = Client(raise_request_exception=False)
    client.force_login(person)

    rows, leaks = [], []
    for name, endpoints in RULES.items():
        for endpoint in endpoints:
            problem = check(client, token, endpoint, team_b_world)
            rows.append(
                f"{'LEAK' if problem else 'ok  '} {name:<34} {endpoint.method:<6} {endpoint.path} {problem}"
            )
            if problem:
                leaks.append(rows[-1])
    with capsys.disabled():
        print(f"\n{role.value} of team A against team B, one row per request:")
        print("\n".join(rows))

    assert leaks == []
