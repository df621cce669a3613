from __future__ import annotations

import secrets

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from pandaweb.core.dispatch import dispatch
from pandaweb.core.http import HtmxHttpRequest
from pandaweb.core.permissions import capability_required
from pandaweb.core.roles import Capability
from pandaweb.core.selectors import deployment_summary, heartbeat_list
from pandaweb.core.tasks import worker_ping


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "core/home.html")


@require_GET
@capability_required(Capability.VIEW_SYSTEM)
def system(request: HtmxHttpRequest) -> HttpResponse:
    template = "core/system.html#heartbeats" if request.htmx else "core/system.html"
    context = {"deployment": deployment_summary(), "heartbeats": heartbeat_list()}
    return render(request, template, context)


@require_POST
@capability_required(Capability.VIEW_SYSTEM)
def system_ping(request: HttpRequest) -> HttpResponse:
    nonce = secrets.token_hex(8)
    dispatch(worker_ping, nonce=nonce)
    messages.info(request, f"Ping {nonce} sent to the workers; answers appear below.")
    return redirect("system")
