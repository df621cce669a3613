from __future__ import annotations

from datetime import timedelta
from typing import Any

import factory
from django.contrib.auth.models import Group, User
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.core.roles import Role
from pandaweb.core.services import roles_sync

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


class ApprovalRequestFactory(factory.django.DjangoModelFactory[ApprovalRequest]):
    class Meta:
        model = ApprovalRequest

    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))
