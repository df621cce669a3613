"""Sign-ins, sign-outs, failed sign-ins and changes to who holds which role or permission.

These changes happen in Django's own code (the login view, the admin, ``setup_roles``), so they
are caught by signals; each handler writes its audit event inside the transaction of the change
(``m2m_changed`` fires inside it) or, for a sign-in, of its own.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission, User
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db import transaction
from django.db.models.signals import m2m_changed
from django.dispatch import receiver
from django.http import HttpRequest

from pandaweb.audit.context import current_request
from pandaweb.audit.services import audit_record


@receiver(user_logged_in)
def _logged_in(sender: Any, request: HttpRequest | None, user: User, **kwargs: Any) -> None:
    with transaction.atomic():
        audit_record(
            action="auth.logged_in", object_type="user", object_id=user.pk, actor=user,
            request=request,
        )  # fmt: skip


@receiver(user_logged_out)
def _logged_out(sender: Any, request: HttpRequest | None, user: User | None, **kwargs: Any) -> None:
    if user is None:  # the session had expired already: nobody to name
        return
    with transaction.atomic():
        audit_record(
            action="auth.logged_out", object_type="user", object_id=user.pk, actor=user,
            request=request,
        )  # fmt: skip


@receiver(user_login_failed)
def _login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    # Django has already replaced the password with asterisks; only the name is kept anyway.
    username = str(credentials.get("username", ""))[:150]
    with transaction.atomic():
        audit_record(
            action="auth.login_failed", object_type="user", object_id=username or "-",
            after={"username": username}, request=request,
        )  # fmt: skip


_WATCHED = {
    User.groups.through: ("user", "groups", Group),
    Group.permissions.through: ("group", "permissions", Permission),
    User.user_permissions.through: ("user", "permissions", Permission),
}


@receiver(m2m_changed)
def _membership_changed(
    sender: Any,
    instance: Any,
    action: str,
    reverse: bool,
    model: Any,
    pk_set: set[int] | None,
    **kwargs: Any,
) -> None:
    watched = _WATCHED.get(sender)
    if watched is None or action not in {"post_add", "post_remove", "pre_clear"}:
        return
    owner_type, relation, _ = watched
    if reverse:
        # group.user_set.add(user) and the like: recorded once per user changed, from its side.
        owners = list(model.objects.filter(pk__in=pk_set or ()))
        names = [str(instance)]
    else:
        owners = [instance]
        if action == "pre_clear":
            names = [str(item) for item in getattr(instance, relation).all()]
        else:
            names = [str(item) for item in model.objects.filter(pk__in=pk_set or ())]
    if not names:
        return
    verb = "added" if action == "post_add" else "removed"
    # Who made the change, when a person did it through the dashboard or the admin.
    request = current_request.get()
    user = getattr(request, "user", None)
    actor = user if user is not None and user.is_authenticated else None
    with transaction.atomic():
        for owner in owners:
            audit_record(
                action=f"auth.{relation}_changed",
                object_type=owner_type,
                object_id=owner.pk,
                actor=actor,
                after={verb: sorted(names), "of": str(owner)},
            )
