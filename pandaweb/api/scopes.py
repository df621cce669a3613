"""What a token may be allowed to do, and the capability of its owner that each scope needs
(no Django imports).

A scope never grants more than the owner's role: ``runs:launch`` on the token of a reviewer, who
cannot launch, grants nothing. The token is the narrower of the two, checked on every request, so a
role taken away from the owner takes the power away from their tokens at once.
"""

from __future__ import annotations

from enum import StrEnum

from pandaweb.core.roles import Capability


class Scope(StrEnum):
    WORKFLOWS_READ = "workflows:read"
    RUNS_READ = "runs:read"
    RUNS_LAUNCH = "runs:launch"
    APPROVALS_READ = "approvals:read"
    APPROVALS_DECIDE = "approvals:decide"
    # Comment on the requests the owner may open (``approval_visible_to``: the queue of their
    # teams, or their own run's). Apart from ``approvals:read``, so a token given out to read
    # writes nothing, and from ``approvals:decide``: whoever comments need not decide.
    APPROVALS_COMMENT = "approvals:comment"
    AUDIT_READ = "audit:read"
    # Answer the ``ask`` steps the owner is asked (the question's own rule says who: its launcher
    # or a member of its group), and list them. Not implied by ``runs:launch``: a token that
    # launches need not answer, and one that answers (an SMS gateway forwarding codes) need not
    # launch or read runs.
    QUESTIONS_ANSWER = "questions:answer"
    # MCP (docs/mcp.md): list and call the workflows offered as tools, follow and cancel the
    # token's own runs. Never decides an approval, whatever else the token holds.
    TOOLS_CALL = "tools:call"
    # Import files, change settings, publish: what the workflow editor lets its author do.
    WORKFLOWS_WRITE = "workflows:write"
    # Log in again for a workflow's runs (a stale session template): what the workflow page's
    # re-bake button lets whoever may launch do. Apart from ``runs:launch``: a bake types the
    # workflow's credentials into the portal.
    SESSION_TEMPLATES_BAKE = "session-templates:bake"
    # Webhook subscriptions, their secrets and the delivery log: the webhooks pages' Admins' matter.
    WEBHOOKS_READ = "webhooks:read"
    WEBHOOKS_WRITE = "webhooks:write"
    # The owner's own tokens (and, for admins, service accounts and theirs): what the token pages
    # let anyone signed in do. A token never makes one with a scope it lacks itself.
    TOKENS_READ = "tokens:read"
    TOKENS_WRITE = "tokens:write"
    # Database, channel layer, workers and queue depth: the system page.
    SYSTEM_READ = "system:read"
    # Store a credential and replace its value: what the credentials page lets authors do.
    # Reading the credentials' names (never their values) is ``workflows:read``, as on the page.
    CREDENTIALS_WRITE = "credentials:write"
    # Make, change, pause and delete schedules: what the schedule page lets whoever may launch
    # do (a schedule launches runs as the person who saved it). Reading them is
    # ``workflows:read``, as on the page.
    SCHEDULES_WRITE = "schedules:write"
    # The teams the owner belongs to and their roles there, as the Teams page lists them; an
    # admin's token sees every team and its people, and makes teams and gives and takes roles
    # (the teams services refuse anyone else, and a token limited to one team).
    TEAMS_READ = "teams:read"
    TEAMS_WRITE = "teams:write"


# None: no capability is needed, only an active owner (the token pages are every person's).
SCOPE_CAPABILITY: dict[Scope, Capability | None] = {
    Scope.WORKFLOWS_READ: Capability.VIEW_WORKFLOWS,
    Scope.RUNS_READ: Capability.VIEW_RUNS,
    Scope.RUNS_LAUNCH: Capability.LAUNCH_RUNS,
    Scope.APPROVALS_READ: Capability.VIEW_APPROVALS,
    Scope.APPROVALS_DECIDE: Capability.DECIDE_APPROVALS,
    # What the request page's comment form needs: whoever may watch runs, the launcher of the
    # run included; the request's own rule (``approval_visible_to``) says which requests.
    Scope.APPROVALS_COMMENT: Capability.VIEW_RUNS,
    # Signed exports, chain verification and run evidence bundles: what Compliance does.
    Scope.AUDIT_READ: Capability.EXPORT_AUDIT,
    # What answering on the run page needs: whoever may watch runs and is the one asked.
    Scope.QUESTIONS_ANSWER: Capability.VIEW_RUNS,
    Scope.TOOLS_CALL: Capability.LAUNCH_RUNS,
    Scope.WORKFLOWS_WRITE: Capability.AUTHOR_WORKFLOWS,
    Scope.SESSION_TEMPLATES_BAKE: Capability.LAUNCH_RUNS,
    Scope.WEBHOOKS_READ: Capability.VIEW_SYSTEM,
    Scope.WEBHOOKS_WRITE: Capability.VIEW_SYSTEM,
    Scope.TOKENS_READ: None,
    Scope.TOKENS_WRITE: None,
    Scope.SYSTEM_READ: Capability.VIEW_SYSTEM,
    Scope.CREDENTIALS_WRITE: Capability.AUTHOR_WORKFLOWS,
    Scope.SCHEDULES_WRITE: Capability.LAUNCH_RUNS,
    Scope.TEAMS_READ: None,
    Scope.TEAMS_WRITE: None,
}

SCOPE_LABELS: dict[Scope, str] = {
    Scope.WORKFLOWS_READ: "Read workflows and their parameter schemas",
    Scope.RUNS_READ: "Read runs, their steps, outputs and files",
    Scope.RUNS_LAUNCH: "Launch and cancel runs",
    Scope.APPROVALS_READ: "Read approval requests and their evidence",
    Scope.APPROVALS_DECIDE: "Approve or reject irreversible steps, hand requests over",
    Scope.APPROVALS_COMMENT: "Comment on the approval requests you may open (never a verdict)",
    Scope.AUDIT_READ: "Export and verify the audit trail, download evidence bundles",
    Scope.QUESTIONS_ANSWER: "Answer the questions runs ask you (ask steps), list them",
    Scope.TOOLS_CALL: "AI agents (MCP): call the workflows offered as tools, follow and cancel "
    "the token's own runs (never decides approvals)",
    Scope.WORKFLOWS_WRITE: "Import workflow files, change workflow settings, publish versions",
    Scope.SESSION_TEMPLATES_BAKE: "Re-bake a workflow's session template (logs in to the portal)",
    Scope.WEBHOOKS_READ: "Read webhook subscriptions and the delivery log",
    Scope.WEBHOOKS_WRITE: "Make, change and delete webhook subscriptions, renew their secrets, "
    "send a delivery again",
    Scope.TOKENS_READ: "List your API tokens (admins: service accounts and their tokens)",
    Scope.TOKENS_WRITE: "Make and revoke your API tokens, never with a scope this token lacks "
    "(admins: service accounts and their tokens)",
    Scope.SYSTEM_READ: "Read the system's health: database, channel layer, workers, queues",
    Scope.CREDENTIALS_WRITE: "Store credentials and replace their values (never read them back)",
    Scope.SCHEDULES_WRITE: "Make, change, pause and delete schedules (they launch as you)",
    Scope.TEAMS_READ: "List your teams and your roles there (admins: every team and its people)",
    Scope.TEAMS_WRITE: "Admins: make teams, give and take people's roles in them",
}
