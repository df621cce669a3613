"""State changes of the project-wide pieces: roles, demo people, worker heartbeats."""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.utils import timezone

from pandaweb.core.dispatch import dispatch, task_named
from pandaweb.core.models import Capability as CapabilityHolder
from pandaweb.core.models import WorkerHeartbeat
from pandaweb.core.roles import CAPABILITY_LABELS, DEMO_USERS, ROLE_CAPABILITIES, Role


@transaction.atomic
def roles_sync() -> dict[Role, list[str]]:
    """Create the role groups and give each exactly its capabilities.

    Idempotent: running it again changes nothing, and it removes capabilities a role no longer
    has, so an upgrade that narrows a role takes effect.
    """
    content_type = ContentType.objects.get_for_model(CapabilityHolder, for_concrete_model=False)
    permissions = {}
    for capability, label in CAPABILITY_LABELS.items():
        permission, _ = Permission.objects.update_or_create(
            content_type=content_type, codename=capability.value, defaults={"name": label}
        )
        permissions[capability] = permission
    granted: dict[Role, list[str]] = {}
    for role, capabilities in ROLE_CAPABILITIES.items():
        group, _ = Group.objects.get_or_create(name=role.value)
        group.permissions.set([permissions[c] for c in capabilities])
        granted[role] = sorted(c.value for c in capabilities)
    return granted


@dataclass(frozen=True)
class DemoLogin:
    role: Role
    username: str
    password: str


def demo_users_ensure(*, password_file: Path) -> list[DemoLogin]:
    """Make one demo user per role and return their logins.

    Passwords are random per installation and kept in ``password_file`` (mode 0600) so that the
    quick start can print them again on every start. A user whose password is not in the file
    (the file was deleted) gets a new one. Idempotent otherwise.
    """
    roles_sync()
    known: dict[str, str] = {}
    if password_file.exists():
        known = json.loads(password_file.read_text())
    logins = []
    with transaction.atomic():
        for role, username in DEMO_USERS.items():
            user, created = User.objects.get_or_create(
                username=username,
                defaults={"first_name": username.split(".")[0].title(), "email": ""},
            )
            password = known.get(username)
            if created or password is None or not user.check_password(password):
                password = secrets.token_urlsafe(12)
                user.set_password(password)
                user.save(update_fields=["password"])
            user.groups.set([Group.objects.get(name=role.value)])
            known[username] = password
            logins.append(DemoLogin(role=role, username=username, password=password))
    password_file.parent.mkdir(parents=True, exist_ok=True)
    password_file.write_text(json.dumps(known, indent=2))
    password_file.chmod(0o600)
    return logins


def heartbeat_record(*, mode: WorkerHeartbeat.Mode, worker: str, nonce: str) -> WorkerHeartbeat:
    """Record that ``worker`` is alive and reached the database. Idempotent per worker."""
    heartbeat, _ = WorkerHeartbeat.objects.update_or_create(
        worker=worker,
        defaults={
            "mode": mode,
            "pid": os.getpid(),
            "database_vendor": connection.vendor,
            "seen_at": timezone.now(),
            "ping_nonce": nonce,
        },
    )
    return heartbeat


def thread_worker_name() -> str:
    return f"threads@{socket.gethostname()}:{os.getpid()}"


def workers_ping() -> str:
    """Ask every worker to answer with a heartbeat carrying a new nonce, and return the nonce.

    Queued on commit (at once outside a transaction). Not idempotent: each call is a new ping.
    """
    nonce = secrets.token_hex(8)
    dispatch(task_named("core.worker_ping"), nonce=nonce)
    return nonce
