"""Optional help from a language model, off unless an endpoint is configured
(``PANDAWEB_ASSIST_URL``, ``PANDAWEB_ASSIST_MODEL``, ``PANDAWEB_ASSIST_KEY``).

The model only ever proposes: it orders healing candidates, or picks the element a person
describes from the numbered elements of the step's page (a closed menu), and the person then
picks. A question is recorded here (a ``ModelCall`` and its audit event) and asked by a worker
(``calling``, through the assist task): the web process never loads the model's client, and no
request waits on the model. What a prompt may hold is in ``prompts``.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from pandaweb.assist.errors import ModelUnavailable
from pandaweb.assist.models import ModelCall
from pandaweb.audit.services import audit_record
from pandaweb.core.dispatch import dispatch, task_named


def assist_enabled() -> bool:
    """Whether a model is configured: assistance is off by default."""
    return bool(settings.ASSIST_URL)


@transaction.atomic
def model_call_request(
    *,
    user: User,
    purpose: ModelCall.Purpose,
    prompt: str,
    offered: Sequence[int],
    run_id: int | None = None,
    step_index: int | None = None,
    target_field: str = "",
    scratch_id: int | None = None,
    description: str = "",
) -> ModelCall:
    """Record a question for the configured model about a run's step or a scratch session's
    page, and have a worker ask it once this commits (``calling.model_call_answer``). ``prompt``
    holds page words only (see ``prompts``). Raises ModelUnavailable when no model is
    configured. Not idempotent: each call is a new question."""
    if not assist_enabled():
        raise ModelUnavailable("no model is configured (PANDAWEB_ASSIST_URL)")
    call = ModelCall.objects.create(
        requested_by=user,
        run_id=run_id,
        scratch_id=scratch_id,
        step_index=step_index,
        target_field=target_field,
        purpose=purpose,
        description=description,
        prompt=prompt,
        offered=list(offered),
    )
    object_type, object_id = call.about
    audit_record(
        action="assist.model_asked",
        object_type=object_type,
        object_id=object_id,
        team_id=call.about_team_id,
        actor=user,
        after={
            "call": call.pk,
            "purpose": call.get_purpose_display(),
            "prompt_chars": call.prompt_chars,
        },
        run_id=run_id,
    )
    dispatch(task_named("assist.ask"), call_id=call.pk)
    return call
