from __future__ import annotations

from django.contrib.auth.models import User
from django.http import Http404

from pandaweb.assist.models import ModelCall


def model_call_get(call_id: int, *, user: User, run_id: int, step_index: int) -> ModelCall:
    """The model call ``call_id`` about step ``step_index`` of run ``run_id``, if ``user`` asked
    it (404 otherwise): a question and its answer are the asker's page, not a colleague's."""
    try:
        return ModelCall.objects.get(
            pk=call_id, requested_by=user, run_id=run_id, step_index=step_index
        )
    except ModelCall.DoesNotExist:
        raise Http404("no such model call") from None
