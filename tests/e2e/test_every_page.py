"""Every page of the dashboard, as every role that may see it, in a real Chromium on a real
installation: axe-core finds no serious or critical accessibility violation, and at phone width
(390 x 844) nothing scrolls sideways.

The pages come from the URL configuration: each named pattern is either a page below (one case
per page and state) or exempt with the reason it is not a page (a POST action, a file, the JSON
API). A new pattern with neither fails ``test_every_url_pattern_is_a_checked_page_or_exempt``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from axe_playwright_python.base import AXE_SCRIPT
from django.urls import URLPattern, URLResolver, get_resolver
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Page,
    Response,
    ViewportSize,
    expect,
)

from pandaweb.core.roles import DEMO_USERS, ROLE_CAPABILITIES, Capability, Role
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.presentation]

DESKTOP: ViewportSize = {"width": 1440, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}
BLOCKING_IMPACTS = {"serious", "critical"}


def roles_with(*capabilities: Capability) -> tuple[Role, ...]:
    return tuple(r for r in Role if set(capabilities) <= ROLE_CAPABILITIES[r])


EVERYONE = tuple(Role)
ADMINS = (Role.ADMINS,)
AUTHORS = roles_with(Capability.AUTHOR_WORKFLOWS)


@dataclass(frozen=True)
class PageCase:
    """One page in one state: ``path`` is formatted with the seeded ids; ``roles`` are who may
    see it (None: a visitor who is not signed in)."""

    url_name: str
    state: str
    path: str
    roles: tuple[Role | None, ...]
    status: int = 200

    @property
    def label(self) -> str:
        return f"{self.url_name}[{self.state}]" if self.state else self.url_name


def case(
    url_name: str, path: str, roles: tuple[Role | None, ...], state: str = "", **kw: Any
) -> PageCase:
    return PageCase(url_name=url_name, state=state, path=path, roles=roles, **kw)


RUNS = roles_with(Capability.VIEW_RUNS)
WORKFLOWS = roles_with(Capability.VIEW_WORKFLOWS)
LAUNCHERS = roles_with(Capability.LAUNCH_RUNS)
HEALERS = roles_with(Capability.VIEW_RUNS, Capability.AUTHOR_WORKFLOWS)
# The step forms differ by kind, not by who looks (the editor page itself runs as every
# author): one author is enough for each kind's form.
ONE_AUTHOR = (Role.OPERATORS,)
STEP_KINDS = (
    "goto", "login", "click", "fill", "select", "check", "uncheck", "press", "wait_for", "wait",
    "extract", "assert", "screenshot", "download", "ask",
)  # fmt: skip
SESSION = "acme-download-invoices"  # the demo workflow that logs in through a session template

PAGES: list[PageCase] = [
    case("login", "/login/", (None,)),
    case("home", "/", EVERYONE),
    case("system", "/system/", ADMINS),
    case("profile", "/profile/", EVERYONE),
    case("account:tokens", "/account/tokens/", EVERYONE),
    case("account:service_accounts", "/account/service-accounts/", ADMINS),
    case("teams:index", "/teams/", EVERYONE),
    case("teams:detail", "/teams/default/", ADMINS),
    # Runs
    case("runs:index", "/runs/", RUNS),
    case("runs:workflow_runs", "/runs/workflow/{slug}/", RUNS),
    case("runs:triage", "/runs/failures/", RUNS),
    case("runs:compare", "/runs/failures/compare/?a={failed}&b={failed_again}", RUNS),
    case("runs:launch", "/runs/launch/{slug}/", LAUNCHERS),
    case("runs:rerun", "/runs/{failed}/again/", LAUNCHERS),
    case("runs:detail", "/runs/{running}/", RUNS, "running"),
    case("runs:detail", "/runs/{waiting}/", RUNS, "waiting for approval"),
    case("runs:detail", "/runs/{answering}/", RUNS, "waiting for an answer"),
    case("runs:detail", "/runs/{failed}/", RUNS, "failed"),
    case("runs:detail", "/runs/{finished}/", RUNS, "finished"),
    case("runs:detail", "/runs/{unsure}/", RUNS, "needs reconciliation"),
    case("runs:detail", "/runs/{cancelled}/", RUNS, "cancelled"),
    case("runs:step", "/runs/{failed}/steps/3/", RUNS, "failed step"),
    case("runs:step", "/runs/{finished}/steps/0/", RUNS, "succeeded step"),
    case("runs:heal", "/runs/{failed}/steps/3/heal/", HEALERS),
    # A scratch session is its author's alone (anyone else gets a 404).
    case("runs:scratch", "/runs/scratch/{scratch}/", (Role.OPERATORS,)),
    # Approvals and questions (a question is answered on its run's page, above)
    case("approvals:index", "/approvals/", roles_with(Capability.VIEW_APPROVALS)),
    case("approvals:index", "/approvals/?status=all", roles_with(Capability.VIEW_APPROVALS), "all"),
    case("approvals:detail", "/approvals/{approval}/", RUNS),
    case("slack:preview", "/integrations/slack/preview/{approval}/", ADMINS),
    # Workflows
    case("workflows:index", "/workflows/", WORKFLOWS),
    case("workflows:detail", "/workflows/{slug}/", WORKFLOWS),
    case("workflows:create", "/workflows/new/", AUTHORS),
    case("workflows:import", "/workflows/import/", AUTHORS),
    case("workflows:settings", "/workflows/{slug}/settings/", AUTHORS),
    case("workflows:version", "/workflows/{slug}/versions/1/", WORKFLOWS),
    case("workflows:diff", "/workflows/{slug}/diff/?from=1&to=2", WORKFLOWS),
    case("workflows:credentials", "/workflows/credentials/", WORKFLOWS),
    case("workflows:credential_create", "/workflows/credentials/new/", AUTHORS),
    case("workflows:credential_replace", "/workflows/credentials/{credential}/replace/", AUTHORS),
    *[
        case("workflows:step_add", f"/workflows/{{slug}}/steps/add/?type={kind}", ONE_AUTHOR, kind)
        for kind in STEP_KINDS
    ],
    case("workflows:step_edit", "/workflows/{slug}/steps/3/edit/", AUTHORS),
    case("workflows:session", f"/workflows/{SESSION}/session/", AUTHORS),
    case(
        "workflows:session_step_add",
        f"/workflows/{SESSION}/session/steps/add/?type=fill",
        ONE_AUTHOR,
    ),
    case("workflows:session_step_edit", f"/workflows/{SESSION}/session/steps/0/edit/", ONE_AUTHOR),
    case("workflows:parameter_add", "/workflows/{slug}/parameters/add/", ONE_AUTHOR),
    case("workflows:parameter_edit", "/workflows/{slug}/parameters/0/edit/", AUTHORS),
    # Schedules and batches
    case("schedules:create", "/schedules/new/{slug}/", LAUNCHERS),
    case("schedules:detail", "/schedules/{schedule}/", WORKFLOWS),
    case("schedules:batch_create", "/batches/new/{slug}/", LAUNCHERS),
    case("schedules:batch", "/batches/{batch}/", RUNS),
    # Webhooks
    case("webhooks:index", "/webhooks/", ADMINS),
    case("webhooks:create", "/webhooks/new/", ADMINS),
    case("webhooks:detail", "/webhooks/{subscription}/", ADMINS),
    case("webhooks:deliveries", "/webhooks/deliveries/", ADMINS),
    case("webhooks:delivery", "/webhooks/deliveries/{message}/", ADMINS),
    # Audit
    case("audit:index", "/audit/", roles_with(Capability.VIEW_AUDIT)),
    case("audit:run", "/audit/runs/{finished}/", roles_with(Capability.VIEW_AUDIT)),
    # The error pages, reached as a person would.
    case("error", "/runs/999999/", (Role.OPERATORS,), "404", status=404),
    case("error", "/audit/", (Role.REVIEWERS,), "403", status=403),
]

POST_ONLY = "a POST action: it answers with a redirect or a fragment, never a page of its own"
FILE = "a file download (CSV, ZIP, PNG, YAML), not an HTML page"
EXEMPT: dict[str, str] = {
    "logout": POST_ONLY,
    "sso_start": "a redirect to the identity provider (tests/oidc signs in through it)",
    "sso_callback": "the identity provider's redirect back (tests/oidc; its refusal page too)",
    "account:oauth_client_revoke": POST_ONLY,
    "oauth_token": "the OAuth token endpoint: a POST answered with JSON",
    "runs:export": FILE,
    "runs:view_create": POST_ONLY,
    "runs:view_delete": POST_ONLY,
    "runs:cancel": POST_ONLY,
    "runs:dismiss": POST_ONLY,
    "runs:reconcile": POST_ONLY,
    "runs:heal_picture": FILE,
    "runs:file": FILE,
    "runs:scratch_open": POST_ONLY,
    "runs:scratch_ask": POST_ONLY,
    "runs:scratch_use": POST_ONLY,
    "runs:scratch_record": POST_ONLY,
    "runs:scratch_assist": POST_ONLY,
    "runs:scratch_assist_add": POST_ONLY,
    "runs:scratch_close": POST_ONLY,
    "runs:scratch_picture": FILE,
    "runs:session_template_bake": POST_ONLY,
    "approvals:decide": POST_ONLY,
    "approvals:passkey_options": "a POST answering WebAuthn options as JSON",
    "approvals:comment": POST_ONLY,
    "approvals:reassign": POST_ONLY,
    "approvals:question_answer": POST_ONLY,
    "slack:interactions": "Slack's callback (a signed POST from Slack, answered with JSON)",
    "slack:commands": "Slack's slash command callback (a signed POST from Slack)",
    "slack:card_image": FILE,
    "audit:verify": POST_ONLY,
    "audit:export": FILE,
    "audit:run_bundle": FILE,
    "webhooks:active": POST_ONLY,
    "webhooks:secret": POST_ONLY,
    "webhooks:redeliver": POST_ONLY,
    "schedules:preview": "an htmx fragment inside the schedule form, checked with that page",
    "runs:session_template": "an htmx fragment the workflow's page polls, checked with that page",
    "schedules:pause": POST_ONLY,
    "schedules:batch_template": FILE,
    "schedules:batch_outputs": FILE,
    "workflows:step_action": POST_ONLY,
    "workflows:session_step_action": POST_ONLY,
    "workflows:session_remove": POST_ONLY,
    "workflows:parameter_delete": POST_ONLY,
    "workflows:publish": POST_ONLY,
    "workflows:archive": POST_ONLY,
    "workflows:export": FILE,
    "account:token_revoke": POST_ONLY,
    "teams:member_add": POST_ONLY,
    "teams:member_remove": POST_ONLY,
    "system_ping": POST_ONLY,
    "profile_slack_code": POST_ONLY,
    "profile_slack_unlink": POST_ONLY,
    "profile_passkey_options": POST_ONLY,
    "profile_passkey_register": POST_ONLY,
    "profile_passkey_delete": POST_ONLY,
    "profile_notifications": POST_ONLY,
    "profile_push": POST_ONLY,
}
# Whole parts of the site that are not the dashboard's own pages, by their address.
EXEMPT_PREFIXES: dict[str, str] = {
    "api/v1/": "the JSON HTTP API (its docs page is django-ninja's Swagger UI, not ours)",
    "admin/": "Django's own admin site and its templates",
}


def url_patterns(
    patterns: list[URLPattern | URLResolver] | None = None, prefix: str = "", namespace: str = ""
) -> Iterator[tuple[str, str]]:
    """(namespaced name, route) of every pattern the dashboard serves; the websocket routes
    live in asgi.py, not here."""
    for item in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(item.pattern)
        if isinstance(item, URLResolver):
            inner = f"{namespace}{item.namespace}:" if item.namespace else namespace
            yield from url_patterns(item.url_patterns, route, inner)
        else:
            yield (f"{namespace}{item.name}" if item.name else "", route)


def test_every_url_pattern_is_a_checked_page_or_exempt() -> None:
    checked = {page.url_name for page in PAGES}
    missing = []
    for name, route in url_patterns():
        if route.startswith(tuple(EXEMPT_PREFIXES)):
            continue
        if name not in checked and name not in EXEMPT:
            missing.append(f"{name or '(unnamed)'} ({route})")
    assert missing == [], (
        "URL patterns with no case in test_every_page.PAGES and no reason in EXEMPT: "
        + ", ".join(missing)
    )
    known = {name for name, _ in url_patterns()}
    stale = sorted((checked | set(EXEMPT)) - known - {"error"})
    assert stale == [], f"cases or exemptions for URL names that no longer exist: {stale}"


@pytest.fixture(scope="module")
def seeded(live_stack: Stack) -> Iterator[dict[str, Any]]:
    live_stack.manage("demo_workflow")
    out = live_stack.manage("shell", "-c", "from tests.e2e.every_page_seed import seed; seed()")
    ids = dict(json.loads(out.strip().splitlines()[-1]))
    yield ids
    live_stack.manage(
        "shell", "-c", f"from tests.e2e.every_page_seed import settle; settle({ids!r})"
    )


@pytest.fixture(scope="module")
def signed_in(browser: Browser, live_stack: Stack) -> Iterator[dict[Role | None, Page]]:
    """One page per role, signed in once for the whole module (None: not signed in)."""
    pages: dict[Role | None, Page] = {}
    for role in (None, *Role):
        context = browser.new_context(viewport=DESKTOP)
        # axe-core (the copy axe-playwright-python ships) in every page this context loads.
        context.add_init_script(AXE_SCRIPT)
        page = context.new_page()
        page.set_default_timeout(15_000)
        watch_errors(page)
        if role is not None:
            username = DEMO_USERS[role]
            page.goto(f"{live_stack.url}/login/")
            page.get_by_label("Username").fill(username)
            page.get_by_label("Password").fill(live_stack.logins[username])
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(f"{live_stack.url}/")
        pages[role] = page
    yield pages
    for page in pages.values():
        page.context.close()


# What each page said went wrong while it was checked: its console's errors (a resource it was
# refused, a websocket turned away, a script error) and the requests it made that failed.
PAGE_ERRORS: dict[Page, list[str]] = {}


def watch_errors(page: Page) -> None:
    errors = PAGE_ERRORS.setdefault(page, [])

    def console(message: ConsoleMessage) -> None:
        # The page's own status (a 404 page checked as such) is the case's, not an error of it.
        own = message.location.get("url") == page.url and "Failed to load resource" in message.text
        if message.type == "error" and not own:
            errors.append(f"console: {message.text} ({message.location.get('url')})")

    page.on("console", console)
    page.on("pageerror", lambda exc: errors.append(f"script error: {exc}"))

    def failed(response: Response) -> None:
        # The page's own answer is the case's to check (a 404 page answers 404).
        if response.status >= 400 and not response.request.is_navigation_request():
            errors.append(f"{response.request.method} {response.url} answered {response.status}")

    page.on("response", failed)


def start_axe(page: Page) -> None:
    """Start axe-core on the page without waiting: the roles' pages live in separate renderer
    processes, so their checks run side by side (the check, not the page load, is the slow
    part)."""
    page.evaluate("() => { window.__axeRun = axe.run(document, {resultTypes: ['violations']}); }")


def blocking_violations(page: Page) -> list[str]:
    results = page.evaluate("() => window.__axeRun")
    lines = []
    for violation in results["violations"]:
        if violation["impact"] not in BLOCKING_IMPACTS:
            continue
        for node in violation["nodes"][:5]:
            lines.append(
                f"{violation['impact']} {violation['id']} ({violation['help']}): "
                f"{', '.join(map(str, node['target']))}: {node['failureSummary']}"
            )
    return lines


# The element whose right edge reaches furthest past the window, named by a selector a person
# can find it by (id, else tag and classes, with its parent's).
WIDEST = """() => {
  const inner = window.innerWidth;
  let widest = null, right = inner;
  for (const el of document.body.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    const edge = box.right + window.scrollX;
    if (box.width > 0 && edge > right + 0.5) { widest = el; right = edge; }
  }
  const name = (el) => el.id ? '#' + el.id
    : el.tagName.toLowerCase() + [...el.classList].map((c) => '.' + c).join('');
  if (!widest) return '';
  const parent = widest.parentElement ? name(widest.parentElement) + ' > ' : '';
  return `${parent}${name(widest)} reaches ${Math.round(right)} px: `
    + JSON.stringify((widest.outerHTML || '').slice(0, 200));
}"""


def sideways_overflow(page: Page) -> str:
    page.evaluate("window.scrollTo(0, 0)")
    width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    if width <= inner:
        return ""
    return f"{width} px wide in a {inner} px window; widest: {page.evaluate(WIDEST)}"


@pytest.mark.parametrize("page_case", [pytest.param(p, id=p.label) for p in PAGES])
def test_the_page_has_no_serious_accessibility_violation_and_fits_a_phone(
    page_case: PageCase,
    seeded: dict[str, Any],
    signed_in: dict[Role | None, Page],
    live_stack: Stack,
) -> None:
    path = page_case.path.format(**seeded)
    checked: dict[str, Page] = {}
    for role in page_case.roles:
        page = signed_in[role]
        page.set_viewport_size(DESKTOP)
        PAGE_ERRORS[page].clear()
        response = page.goto(live_stack.url + path)
        assert response is not None
        where = f"{page_case.label} as {role or 'anonymous'} ({page.url})"
        assert response.status == page_case.status, (
            f"{where} answered {response.status}:\n{live_stack.log_tail(60)}"
        )
        # A page that redirects elsewhere (a missing record, a refused state) checks another.
        assert urlsplit(page.url).path == urlsplit(path).path, f"{where} redirected"
        start_axe(page)
        checked[where] = page

    problems = [line for where, page in checked.items() for line in page_problems(page, where)]
    assert problems == [], "\n".join(problems)


def page_problems(page: Page, where: str) -> list[str]:
    """What axe-core (started on the page) found, then whether the page fits a phone."""
    problems = [f"{where}: {line}" for line in blocking_violations(page)]
    page.set_viewport_size(PHONE)
    if overflow := sideways_overflow(page):
        problems.append(f"{where} scrolls sideways on a phone: {overflow}")
    # A page the person may open loads nothing it is refused, and runs without script errors.
    problems += [f"{where}: {error}" for error in PAGE_ERRORS[page]]
    return problems


def rotate_a_webhook_secret(page: Page, url: str, seeded: dict[str, Any]) -> None:
    page.goto(f"{url}/webhooks/{seeded['subscription']}/")
    page.get_by_role("button", name="New secret").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("New signing secret")


def make_a_token(page: Page, url: str, seeded: dict[str, Any]) -> None:
    page.goto(f"{url}/account/tokens/")
    page.get_by_label("Name").fill("quarterly supplier statements for the finance team's ledger")
    page.locator("input[name=scopes]:not([disabled])").first.check()
    page.get_by_role("button", name="Make token").click()
    expect(page.get_by_role("heading", name="Your new token")).to_be_visible()


# Pages that only answer a form (a secret shown once): no address to visit, so each is reached
# the way a person reaches it.
FORM_ANSWERS: dict[str, tuple[Role, Callable[[Page, str, dict[str, Any]], None]]] = {
    "webhooks:secret": (Role.ADMINS, rotate_a_webhook_secret),
    "account:tokens[new secret]": (Role.OPERATORS, make_a_token),
}


@pytest.mark.parametrize("answer", list(FORM_ANSWERS))
def test_a_page_that_answers_a_form_has_no_serious_violation_and_fits_a_phone(
    answer: str,
    seeded: dict[str, Any],
    signed_in: dict[Role | None, Page],
    live_stack: Stack,
) -> None:
    role, reach = FORM_ANSWERS[answer]
    page = signed_in[role]
    page.set_viewport_size(DESKTOP)
    PAGE_ERRORS[page].clear()
    # A "are you sure?" confirm() before a form is sent: the person says yes.
    page.on("dialog", accept)
    try:
        reach(page, live_stack.url, seeded)
    finally:
        page.remove_listener("dialog", accept)
    start_axe(page)
    problems = page_problems(page, f"{answer} as {role} ({page.url})")
    assert problems == [], "\n".join(problems)


def accept(dialog: Dialog) -> None:
    dialog.accept()
