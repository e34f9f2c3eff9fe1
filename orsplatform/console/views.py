"""Team pages: members and API keys. Writes go through teams.services."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from orsplatform.auditlog.selectors import retention_of, storage_report
from orsplatform.console.forms import ApiKeyForm
from orsplatform.teams import selectors
from orsplatform.teams.models import ApiKey
from orsplatform.teams.services import api_key_create, api_key_revoke

KEYS_PER_PAGE = 25


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    teams = selectors.teams_for_user(user=request.user)
    if len(teams) == 1 and not request.user.is_superuser:
        return redirect("console:team", slug=teams[0][0].slug)
    return render(request, "console/team_list.html", {"teams": teams})


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    team, role = selectors.team_for_user(user=request.user, slug=slug)
    manage = selectors.can_manage(user=request.user, role=role)
    form = ApiKeyForm(team=team)
    new_token = None
    if request.method == "POST":
        if not manage:
            raise PermissionDenied("Only owners and admins manage keys.")
        form = ApiKeyForm(request.POST, team=team)
        if form.is_valid():
            days = form.cleaned_data["expires_in_days"]
            try:
                created = api_key_create(
                    team=team, name=form.cleaned_data["name"], scopes=form.cleaned_data["scopes"],
                    environment=form.cleaned_data["environment"], created_by=request.user,
                    expires_at=timezone.now() + timedelta(days=days) if days else None,
                )
            except ValidationError as exc:
                # A taken name is the name field's error, shown beside it; the rest are the form's.
                form.add_error("name" if exc.code == "name_taken" else None, exc)
            else:
                # Shown in this response only; never stored, never put in a redirect or a message.
                new_token = created.token
                form = ApiKeyForm(team=team)
    keys = Paginator(selectors.api_keys_for_team(team=team), KEYS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "console/team_detail.html", {
        "team": team, "role": role, "can_manage": manage, "form": form, "new_token": new_token,
        "keys": keys.object_list, "page": keys, "members": selectors.members_for_team(team=team),
        "retention": retention_of(team=team),
    })


@login_required
def storage(request: HttpRequest) -> HttpResponse:
    """Disk per table and team, the audit log's partitions and its archive: operators only (it
    spans every team)."""
    if not request.user.is_superuser:
        raise PermissionDenied("The storage page is for operators.")
    return render(request, "console/storage.html", storage_report())


@login_required
@require_POST
def api_key_revoke_view(request: HttpRequest, slug: str, prefix: str) -> HttpResponse:
    team, role = selectors.team_for_user(user=request.user, slug=slug)
    if not selectors.can_manage(user=request.user, role=role):
        raise PermissionDenied("Only owners and admins manage keys.")
    key = get_object_or_404(ApiKey, team=team, prefix=prefix)
    api_key_revoke(api_key=key)
    messages.success(request, f"Key {key.prefix} ({key.name}) revoked.")
    return redirect("console:team", slug=team.slug)
