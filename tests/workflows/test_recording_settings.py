"""The filmstrip setting travels from the imported file to the published version, off unless
asked for."""

from __future__ import annotations

import pytest
import yaml
from django.contrib.auth.models import User

from workflows import services
from workflows.schema import WorkflowSettings

pytestmark = pytest.mark.django_db


def document(**settings: object) -> str:
    return yaml.safe_dump(
        {
            "pandaweb": 1,
            "name": "Filmed",
            "slug": "filmed",
            "settings": {"allowed_hosts": ["127.0.0.1:8001"], **settings},
            "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/login"}],
        }
    )


def published_settings(operator: User, text: str) -> WorkflowSettings:
    workflow = services.workflow_import(user=operator, text=text)
    version = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v")
    return version.settings_model


def test_a_workflow_keeps_no_filmstrip_unless_it_asks(operator: User) -> None:
    settings = published_settings(operator, document())

    assert settings.filmstrip is False


def test_the_filmstrip_options_reach_the_published_version(operator: User) -> None:
    settings = published_settings(
        operator, document(filmstrip=True, filmstrip_seconds_per_frame=1, filmstrip_max_mb=5)
    )

    assert settings.filmstrip is True
    assert settings.filmstrip_seconds_per_frame == 1
    assert settings.filmstrip_max_mb == 5


def test_it_refuses_a_filmstrip_faster_than_two_frames_a_second(operator: User) -> None:
    with pytest.raises(services.WorkflowError):
        services.workflow_import(user=operator, text=document(filmstrip_seconds_per_frame=0.1))
