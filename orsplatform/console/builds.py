"""Console: a version's requirements build, followed live (status, what is installed, the
installer's log), like a task upload's progress page."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from orsplatform.catalog import selectors as catalog
from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.teams import selectors
from orsplatform.teams.models import Team


def _version(request: HttpRequest, slug: str, env: str, number: int) -> tuple[Team, EnvironmentVersion]:
    team, _ = selectors.team_for_user(user=request.user, slug=slug)
    environment = catalog.environment_of_team(team_id=team.id, slug=env)
    version = catalog.version_of(environment=environment, number=number) if environment is not None else None
    if version is None:
        raise Http404("No such version.")
    return team, version


def _state(version: EnvironmentVersion) -> dict:
    return {"status": version.status, "finished": version.status != EnvironmentVersion.Status.BUILDING,
            "error": version.error, "log": catalog.version_build_log(version=version)}


@login_required
@require_GET
def version_build(request: HttpRequest, slug: str, env: str, number: int) -> HttpResponse:
    team, version = _version(request, slug, env, number)
    return render(request, "console/version_build.html", {
        "team": team, "version": version, "state": _state(version),
        "state_url": reverse("console:version_build_json", args=[team.slug, env, number]),
    })


@login_required
@require_GET
def version_build_json(request: HttpRequest, slug: str, env: str, number: int) -> JsonResponse:
    _, version = _version(request, slug, env, number)
    return JsonResponse(_state(version))
