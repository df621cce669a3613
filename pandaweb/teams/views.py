from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.models import Membership, Team
from pandaweb.core.permissions import is_admin
from pandaweb.teams import selectors, services


def _admin_only(request: AuthenticatedRequest) -> None:
    if not is_admin(request.user):
        raise PermissionDenied("teams and their members are managed by admins")


@require_http_methods(["GET", "POST"])
def team_index(request: AuthenticatedRequest) -> HttpResponse:
    """Everyone: the teams they belong to and their role in each. Admins: every team, and a new
    one."""
    admin = is_admin(request.user)
    error = ""
    if request.method == "POST":
        _admin_only(request)
        try:
            team = services.team_create(
                name=request.POST.get("name", ""),
                slug=request.POST.get("slug", ""),
                user=request.user,
            )
            messages.success(request, f"Team “{team.name}” made; now add its people.")
            return redirect("teams:detail", slug=team.slug)
        except services.TeamError as exc:
            error = str(exc)
    context = {
        "teams": selectors.teams_listed(request.user),
        "admin": admin,
        "error": error,
        "form": request.POST if error else {},
    }
    return render(request, "teams/index.html", context)


@require_GET
def team_detail(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    _admin_only(request)
    team = get_object_or_404(Team, slug=slug)
    return render(request, "teams/detail.html", _detail_context(team))


def _detail_context(team: Team, **extra: object) -> dict[str, object]:
    return {
        "team": team,
        "memberships": selectors.team_members(team),
        "roles": Membership.TeamRole.choices,
        **extra,
    }


@require_POST
def member_add(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    _admin_only(request)
    team = get_object_or_404(Team, slug=slug)
    username = request.POST.get("username", "").strip()
    member = User.objects.filter(username__iexact=username, is_active=True).first()
    error = ""
    if member is None:
        error = f"nobody here is called {username!r}" if username else "say whose role it is"
    else:
        try:
            services.membership_grant(
                team_id=team.pk, member=member, role=request.POST.get("role", ""),
                user=request.user,
            )  # fmt: skip
        except services.TeamError as exc:
            error = str(exc)
    if error:
        context = _detail_context(team, error=error, form=request.POST)
        return render(request, "teams/detail.html", context, status=400)
    assert member is not None
    messages.success(request, f"{member.get_username()} added to {team.name}.")
    return redirect("teams:detail", slug=team.slug)


@require_POST
def member_remove(request: AuthenticatedRequest, slug: str, membership_id: int) -> HttpResponse:
    _admin_only(request)
    membership = get_object_or_404(
        Membership.objects.select_related("team", "user"), pk=membership_id, team__slug=slug
    )
    services.membership_revoke(
        team_id=membership.team_id, member=membership.user, role=membership.role,
        user=request.user,
    )  # fmt: skip
    messages.success(
        request,
        f"{membership.user.get_username()} is no longer "
        f"{membership.get_role_display().lower()} in {membership.team.name}.",
    )
    return redirect("teams:detail", slug=slug)
