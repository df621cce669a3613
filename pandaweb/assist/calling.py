"""The worker's side of assistance: asking the model a recorded question and recording what it
said. The one module that loads the model's client (and the ``openai`` SDK, ~0.4 s of import):
only the assist task reaches it (an import-linter contract keeps the web side off it)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from pandaweb.assist import prompts
from pandaweb.assist.client import ChatModel
from pandaweb.assist.errors import ModelUnavailable
from pandaweb.assist.models import ModelCall
from pandaweb.audit.services import audit_record

logger = logging.getLogger(__name__)

SYSTEMS = {
    ModelCall.Purpose.RANK: prompts.RANKING_SYSTEM,
    ModelCall.Purpose.CHOOSE: prompts.CHOOSING_SYSTEM,
    ModelCall.Purpose.DRAFT: prompts.DRAFTING_SYSTEM,
}
# What the row and the audit event keep of an answer: the answers read are a few numbers.
ANSWER_LIMIT = 4000


def model_call_answer(*, call_id: int) -> None:
    """Ask model call ``call_id``'s question and record the answer, or the failure in words,
    with the audit event ``assist.model_called`` (the prompt's size and the answer). Precondition:
    the call exists. Idempotent: a call no longer pending (a second delivery of its task) is
    left alone."""
    call = ModelCall.objects.filter(pk=call_id, status=ModelCall.Status.PENDING).first()
    if call is None:
        logger.info("model call %s is answered already", call_id)
        return
    model = ChatModel(url=settings.ASSIST_URL, model=settings.ASSIST_MODEL, key=settings.ASSIST_KEY)
    answer, error = "", ""
    if not model.url:
        error = "no model is configured on the worker (PANDAWEB_ASSIST_URL)"
    else:
        try:
            answer = model.ask(SYSTEMS[ModelCall.Purpose(call.purpose)], call.prompt)
        except ModelUnavailable as exc:
            error = str(exc)
    with transaction.atomic():
        settled = ModelCall.objects.filter(pk=call.pk, status=ModelCall.Status.PENDING).update(
            status=ModelCall.Status.FAILED if error else ModelCall.Status.ANSWERED,
            model_name=model.model,
            answer=answer[:ANSWER_LIMIT],
            error=error[:500],
            answered_at=timezone.now(),
        )
        # Audited whether or not another delivery recorded its answer first: the call was made
        # (and paid for) all the same.
        object_type, object_id = call.about
        audit_record(
            action="assist.model_called",
            object_type=object_type,
            object_id=object_id,
            team_id=call.about_team_id,
            actor=call.requested_by,
            after={
                "call": call.pk,
                "purpose": call.get_purpose_display(),
                "model": model.model,
                "endpoint": model.url,
                "prompt_chars": call.prompt_chars,
                "answer": answer[:ANSWER_LIMIT],
                **({"error": error[:500]} if error else {}),
            },
            run_id=call.run_id,
        )
    if not settled:
        logger.info("model call %s was answered by another delivery first", call_id)
