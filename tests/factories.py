from __future__ import annotations

from datetime import timedelta
from typing import Any

import factory
import yaml
from django.contrib.auth.models import Group, User
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from pandaweb.core.services import roles_sync
from sessions.models import Run

PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"person{n}")
    password = factory.django.Password(PASSWORD)


def user_with_role(role: Role | None, **kwargs: Any) -> User:
    """A user holding ``role`` (None: signed in, but no role at all)."""
    user = UserFactory.create(**kwargs)
    if role is not None:
        roles_sync()
        user.groups.add(Group.objects.get(name=role.value))
    return user


def waiting_run() -> Run:
    """A run of a small published workflow, parked at its gate (no browser behind it)."""
    from workflows import services as workflow_services

    launcher = user_with_role(Role.OPERATORS)
    slug = f"gated-{launcher.pk}"
    document = {
        "pandaweb": 1, "name": f"Gated {launcher.pk}", "slug": slug,
        "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
        "steps": [{"id": "pay", "type": "click", "target": {"role": "button", "name": "Pay"},
                   "irreversible": True, "expect": {"text": "Paid"}}],
    }  # fmt: skip
    try:
        workflow = workflow_services.workflow_import(user=launcher, text=yaml.safe_dump(document))
        version = workflow_services.workflow_publish(
            workflow_id=workflow.pk, user=launcher, message="gated", accept_warnings=True
        )
    except workflow_services.ImportUnchanged as unchanged:
        # A launcher made again (a new process, the same database) gets the same workflow.
        workflow = unchanged.workflow
        version = workflow.versions.get(number=unchanged.version)
    return Run.objects.create(
        workflow=workflow,
        version=version,
        launched_by=launcher,
        status=Run.Status.AWAITING_APPROVAL,
    )


class ApprovalRequestFactory(factory.django.DjangoModelFactory[ApprovalRequest]):
    class Meta:
        model = ApprovalRequest

    run = factory.LazyFunction(waiting_run)
    step_id = "pay"
    action = "Click the button 'Pay' on http://127.0.0.1:8001/"
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))


def team_make(slug: str) -> Team:
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": slug.title()})
    return team


def member_of(team: Team, *roles: Role, **kwargs: Any) -> User:
    """A person holding ``roles`` in ``team`` only (no global role group)."""
    roles_sync()
    user = UserFactory.create(**kwargs)
    for role in roles:
        Membership.objects.create(team=team, user=user, role=role.value)
    return user
