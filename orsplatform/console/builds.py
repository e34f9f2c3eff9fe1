"""Console: a version's page. Its requirements build, followed live (status, what is installed, the
installer's log), and its verification (the replay of the previous version's episodes and the
reference solutions: a progress bar while it runs, then the report, and the author's confirmation
of a held version), like a task upload's progress page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from orsplatform.catalog import selectors as catalog
from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.console.environments import can_publish
from orsplatform.console.forms import VerifySettingsForm
from orsplatform.containers import selectors as container_selectors
from orsplatform.teams import selectors
from orsplatform.teams.models import Team
from orsplatform.verify import selectors as verify
from orsplatform.verify.models import Verification
from orsplatform.verify.services import NothingToConfirm, verification_confirm, verify_settings_set


def _version(request: HttpRequest, slug: str, env: str, number: int, *,
             write: bool = False) -> tuple[Team, EnvironmentVersion, bool]:
    team, role = selectors.team_for_user(user=request.user, slug=slug)
    publisher = can_publish(user=request.user, role=role)
    environment = catalog.environment_of_team(team_id=team.id, slug=env)
    version = catalog.version_of(environment=environment, number=number) if environment is not None else None
    if version is None:
        raise Http404("No such version.")
    if write and not publisher:
        raise PermissionDenied("Viewers cannot confirm versions.")
    return team, version, publisher


def _verification_state(verification: Verification | None) -> dict | None:
    if verification is None:
        return None
    return {"status": verification.status, "finished": verification.finished, "percent": verification.percent,
            "items_done": verification.items_done, "items_total": verification.items_total,
            "agreement": verification.agreement}


def _state(version: EnvironmentVersion, verification: Verification | None) -> dict:
    verifying = verification is not None and not verification.finished
    return {"status": version.status,
            "finished": version.status != EnvironmentVersion.Status.BUILDING and not verifying,
            "error": version.error, "log": catalog.version_build_log(version=version),
            "verification": _verification_state(verification)}


@login_required
@require_GET
def version_build(request: HttpRequest, slug: str, env: str, number: int) -> HttpResponse:
    team, version, publisher = _version(request, slug, env, number)
    verification = verify.verification_of(team=team, environment=version.environment, number=number)
    chosen = verify.verify_settings_of(team=team, environment=version.environment)
    return render(request, "console/version_build.html", {
        "team": team, "version": version, "state": _state(version, verification), "verification": verification,
        "can_publish": publisher, "settings_form": VerifySettingsForm(initial={
            "sample_size": chosen.sample_size if chosen else None, "threshold": chosen.threshold if chosen else None,
            "report_only": chosen.report_only if chosen else False}),
        "state_url": reverse("console:version_build_json", args=[team.slug, env, number]),
        "image": container_selectors.version_image(version=version),
    })


@login_required
@require_GET
def version_build_json(request: HttpRequest, slug: str, env: str, number: int) -> JsonResponse:
    team, version, _ = _version(request, slug, env, number)
    return JsonResponse(_state(version, verify.verification_of(team=team, environment=version.environment,
                                                                number=number)))


@login_required
@require_POST
def version_confirm(request: HttpRequest, slug: str, env: str, number: int) -> HttpResponse:
    team, version, _ = _version(request, slug, env, number, write=True)
    verification = verify.verification_of(team=team, environment=version.environment, number=number)
    if verification is None:
        raise Http404("This version has no verification.")
    try:
        verification_confirm(verification=verification, user=request.user)
    except NothingToConfirm as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{version.environment.full_name} now serves version {version.number}.")
    return redirect("console:version_build", slug=team.slug, env=env, number=number)


@login_required
@require_POST
def verify_settings(request: HttpRequest, slug: str, env: str) -> HttpResponse:
    team, role = selectors.team_for_user(user=request.user, slug=slug)
    if not can_publish(user=request.user, role=role):
        raise PermissionDenied("Viewers cannot change replay settings.")
    environment = catalog.environment_of_team(team_id=team.id, slug=env)
    if environment is None:
        raise Http404("No such environment.")
    form = VerifySettingsForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Replay settings: " + " ".join(e for errors in form.errors.values() for e in errors))
    else:
        data = form.cleaned_data
        verify_settings_set(environment=environment, sample_size=data["sample_size"],
                            threshold=data["threshold"], report_only=data["report_only"])
        messages.success(request, "Replay settings saved; they apply to the next versions published.")
    back = request.POST.get("next", "")
    if back and url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()},
                                                 require_https=request.is_secure()):
        return redirect(back)
    return redirect("console:environments", slug=team.slug)
