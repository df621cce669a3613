from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from pandaweb.core.permissions import capability_required
from pandaweb.core.roles import Capability


@require_GET
@capability_required(Capability.VIEW_RUNS)
def run_index(request: HttpRequest) -> HttpResponse:
    return render(request, "sessions/index.html")
