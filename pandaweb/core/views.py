from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.selectors import questions_for
from pandaweb.core.http import HtmxHttpRequest
from pandaweb.core.permissions import capability_required, user_can
from pandaweb.core.roles import Capability
from pandaweb.core.selectors import deployment_summary, heartbeat_list
from pandaweb.core.services import workers_ping
from sessions import console, retention


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """What needs this person, by what their roles let them do."""

    user = request.user
    context: dict[str, Any] = {}
    if user.is_authenticated:
        sees_runs = user_can(user, Capability.VIEW_RUNS)
        context = {
            "sees_runs": sees_runs,
            "decides": user_can(user, Capability.DECIDE_APPROVALS),
            "can_launch": user_can(user, Capability.LAUNCH_RUNS),
        }
        if context["decides"]:
            context["my_approvals"] = console.approvals_for(user)
        if sees_runs:
            context["my_questions"] = questions_for(user, limit=10)
            context["mine"] = console.my_runs(user)
            context["failures"] = console.failures_today(user=user)
            context["counts"] = console.needs_counts(user)
    return render(request, "core/home.html", context)


@require_GET
@capability_required(Capability.VIEW_SYSTEM)
def system(request: HtmxHttpRequest) -> HttpResponse:
    template = "core/system.html#heartbeats" if request.htmx else "core/system.html"
    context: dict[str, Any] = {"deployment": deployment_summary(), "heartbeats": heartbeat_list()}
    if not request.htmx:
        context["capacity"] = console.capacity()
        context["disk_files"], context["disk_bytes"] = retention.run_files_usage()
    return render(request, template, context)


@require_POST
@capability_required(Capability.VIEW_SYSTEM)
def system_ping(request: HttpRequest) -> HttpResponse:
    nonce = workers_ping()
    messages.info(request, f"Ping {nonce} sent to the workers; answers appear below.")
    return redirect("system")
