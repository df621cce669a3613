from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_POST

from approvals import passkeys, selectors
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required
from pandaweb.core.roles import Capability


@require_POST
@capability_required(Capability.DECIDE_APPROVALS)
def approval_passkey_options(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    """A fresh WebAuthn challenge bound to this request's evidence, for the page's script."""
    approval = selectors.approval_get(approval_id, user=request.user)
    try:
        options = passkeys.step_up_options(approval=approval, user=request.user)
    except passkeys.StepUpRefused as refused:
        return JsonResponse({"error": str(refused)}, status=409)
    return HttpResponse(options, content_type="application/json")
