from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User

from pandaweb.core.roles import Role
from tests.factories import user_with_role
from workflows import services
from workflows.models import Credential

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples" / "acme-pay-invoice.yaml"


@pytest.fixture
def operator(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="olivia")


@pytest.fixture
def acme_credential(operator: User) -> Credential:
    return services.credential_create(
        user=operator,
        name="acme-portal",
        kind="username_password",
        description="Acme demo login",
        values={"username": "acme-demo", "password": "portal-demo-2026"},
    )
