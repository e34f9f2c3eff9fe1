"""Console pages for publishing: a team's environments and versions (rollback), package upload with the
validation report, task upload, and an ingest job page whose progress bar polls a small JSON view.
Writes go through catalog.services; owners, admins and members publish, viewers only look."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from orsplatform.catalog import selectors as catalog
from orsplatform.catalog.ingest import IngestError
from orsplatform.catalog.models import Environment, IngestJob, Split
from orsplatform.catalog.packages import remove_quietly, save_upload
from orsplatform.catalog.protection import ProtectionError, split_protection_set
from orsplatform.catalog.services import (
    MAX_MESSAGE_CHARS,
    EnvironmentGone,
    PublishError,
    UploadTooLarge,
    VersionNotFound,
    environment_delete,
    environment_publish_path,
    environment_rollback,
    ingest_job_create,
)
from orsplatform.teams import selectors
from orsplatform.teams.models import Membership, Team
from orsplatform.verify.models import Verification

PUBLISHER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN, Membership.Role.MEMBER)


def can_publish(*, user, role: str) -> bool:
    return user.is_superuser or role in PUBLISHER_ROLES


class PackageForm(forms.Form):
    package = forms.FileField(help_text="A .zip, .tar.gz or a single .py file.")
    slug = forms.CharField(max_length=63, required=False,
                           help_text="Default: the manifest's name, else the file name.")
    visibility = forms.ChoiceField(required=False, choices=[("", "manifest / unchanged")]
                                   + list(Environment.Visibility.choices))
    message = forms.CharField(required=False, max_length=MAX_MESSAGE_CHARS, widget=forms.Textarea(attrs={"rows": 2}),
                              help_text="What changed in this version (shown in its history).")


class TaskFileForm(forms.Form):
    environment = forms.ModelChoiceField(queryset=Environment.objects.none())
    split = forms.CharField(max_length=100)
    split_type = forms.ChoiceField(required=False, label="Split type",
                                   choices=[("", "keep / from the name")] + list(Split.Type.choices))
    format = forms.ChoiceField(required=False, choices=[("", "from the file name"), ("jsonl", "JSONL"),
                                                        ("csv", "CSV"), ("parquet", "Parquet")])
    mode = forms.ChoiceField(choices=IngestJob.Mode.choices, initial=IngestJob.Mode.APPEND)
    file = forms.FileField(help_text="One task per line (JSONL) or row (CSV, Parquet).")
    accept_failing_rows = forms.BooleanField(
        required=False, label="Accept rows that fail the check",
        help_text="A sample of rows runs through the environment's setup() and get_prompt() first; by default a "
                  "failing row refuses the upload, with this it is kept and reported as a warning.")

    def __init__(self, *args, team: Team, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["environment"].queryset = Environment.objects.filter(team=team, deleted_at__isnull=True).order_by("slug")


def _team(request: HttpRequest, slug: str, *, write: bool = False) -> tuple[Team, str, bool]:
    team, role = selectors.team_for_user(user=request.user, slug=slug)
    publisher = can_publish(user=request.user, role=role)
    if write and not publisher:
        raise PermissionDenied("Viewers cannot publish.")
    return team, role, publisher


def _page(request: HttpRequest, team: Team, role: str, publisher: bool, *, package_form=None, task_form=None,
          failure: PublishError | None = None, status: int = 200) -> HttpResponse:
    page = catalog.environments_of_team_page(team=team, page=request.GET.get("page") or 1)
    return render(request, "console/environments.html", {
        "team": team, "role": role, "can_publish": publisher,
        "can_delete": selectors.can_manage(user=request.user, role=role),
        "environments": page.object_list, "page": page,
        "jobs": catalog.ingest_jobs_of_team(team=team, limit=10),
        "package_form": package_form or PackageForm(), "task_form": task_form or TaskFileForm(team=team),
        "failure": failure,
        "undo": catalog.rollback_undo(team_id=team.id, ref=request.GET.get("undo", "")[:80]) if publisher else None,
    }, status=status)


@login_required
@require_GET
def environments_home(request: HttpRequest) -> HttpResponse:
    teams = selectors.teams_for_user(user=request.user)
    if len(teams) == 1:
        return redirect("console:environments", slug=teams[0][0].slug)
    return render(request, "console/environments_teams.html", {"teams": teams})


@login_required
@require_GET
def environments(request: HttpRequest, slug: str) -> HttpResponse:
    team, role, publisher = _team(request, slug)
    return _page(request, team, role, publisher)


@login_required
@require_POST
def package_upload(request: HttpRequest, slug: str) -> HttpResponse:
    team, role, publisher = _team(request, slug, write=True)
    form = PackageForm(request.POST, request.FILES)
    if not form.is_valid():
        return _page(request, team, role, publisher, package_form=form, status=400)
    upload = form.cleaned_data["package"]
    if upload.size > settings.ORS_MAX_PACKAGE_BYTES:
        form.add_error("package", f"The package is {upload.size} bytes; the limit is {settings.ORS_MAX_PACKAGE_BYTES}.")
        return _page(request, team, role, publisher, package_form=form, status=413)
    path = save_upload(upload)
    try:
        result = environment_publish_path(team=team, path=path, filename=upload.name,
                                          slug=form.cleaned_data["slug"] or None,
                                          visibility=form.cleaned_data["visibility"] or None,
                                          created_by=request.user, message=form.cleaned_data["message"])
    except PublishError as exc:
        return _page(request, team, role, publisher, package_form=form, failure=exc,
                     status=413 if exc.check == "size" else 400)
    finally:
        remove_quietly(path)
    version = result.version
    if version.status == version.Status.BUILDING:
        # No flash message: the version's page says where the build is (a banner that follows it),
        # so a build failing at once never shows "installing" above "Status: failed".
        return redirect("console:version_build", slug=team.slug, env=version.environment.slug, number=version.number)
    if result.created:
        report = result.report
        tools = ", ".join(t["name"] for t in report.get("tools", []))
        splits = ", ".join(s["name"] for s in report.get("splits", []))
        prompt = "a sample prompt rendered" if report.get("prompt_checked") else "no task to render a prompt for"
        messages.success(request, f"Published {version.environment.full_name}@{version.number}: validation passed "
                                  f"(entrypoint {version.entrypoint}, {report.get('sdk') or 'ors'} SDK; "
                                  f"tools: {tools}; splits: {splits}; {prompt}).")
        if Verification.objects.filter(version=version).exists():
            # Its replay runs now: the version's page follows it with a progress bar.
            return redirect("console:version", slug=team.slug, env=version.environment.slug, number=version.number)
    else:
        messages.success(request, f"Identical content: {version.environment.full_name}@{version.number} "
                                  "already holds it; nothing changed.")
    return redirect("console:environments", slug=team.slug)


def _back(request: HttpRequest, raw: str) -> str | None:
    """``next`` when it is a path of this site (never another host)."""
    if raw and url_has_allowed_host_and_scheme(raw, allowed_hosts={request.get_host()},
                                               require_https=request.is_secure()):
        return raw
    return None


def _with_undo(url: str, ref: str) -> str:
    """``url`` with its ``undo`` parameter set to ``ref`` (replacing an earlier one)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "undo"] + [("undo", ref)]
    return urlunsplit(parts._replace(query=urlencode(query)))


@login_required
@require_http_methods(["GET", "POST"])
def version_rollback(request: HttpRequest, slug: str, env: str) -> HttpResponse:
    """GET: the confirmation ("Serve @N instead of @M?"), which changes nothing; POST: serve it,
    and come back to the page it started from, which then offers "Undo: serve @M again"."""
    team, _, _ = _team(request, slug, write=True)
    environment = catalog.environment_of_team(team_id=team.id, slug=env)
    if environment is None:
        raise Http404("No such environment.")
    data = request.POST if request.method == "POST" else request.GET
    raw = str(data.get("version", ""))
    back = _back(request, str(data.get("next", ""))) or reverse("console:environments", args=[team.slug])
    if request.method == "GET":
        version = (catalog.version_of(environment=environment, number=int(raw))
                   if raw.isdigit() and len(raw) <= 9 else None)
        if version is None or version.status != version.Status.READY:
            raise Http404("No such version.")
        return render(request, "console/rollback_confirm.html", {
            "team": team, "environment": environment, "version": version, "current": environment.current_version,
            "next": back, "cache_seconds": settings.ORS_CATALOG_CACHE_SECONDS,
        })
    if not (raw.isdigit() and len(raw) <= 9):  # no version number at all (nor one past the column's range)
        raise Http404("No such version.")
    try:
        rolled = environment_rollback(environment=environment, number=int(raw))
    except VersionNotFound as exc:
        raise Http404("No such version.") from exc
    messages.success(request, f"{environment.full_name} now serves version {rolled.version.number}.")
    if rolled.previous is None or rolled.previous == rolled.version.number:
        return redirect(back)
    return redirect(_with_undo(back, f"{environment.slug}@{rolled.previous}"))


@login_required
def environment_delete_view(request: HttpRequest, slug: str, env: str) -> HttpResponse:
    """GET: what deleting it does, and a confirmation form; POST: delete. Owners and admins only
    (members and viewers 403, another team 404)."""
    team, role = selectors.team_for_user(user=request.user, slug=slug)
    environment = catalog.environment_of_team(team_id=team.id, slug=env)
    if environment is None:
        raise Http404("No such environment.")
    if not selectors.can_manage(user=request.user, role=role):
        raise PermissionDenied("Only owners and admins delete environments.")
    if request.method == "POST":
        # The name typed again: a slip of the mouse on the wrong environment deletes nothing.
        if request.POST.get("confirm", "").strip() != environment.full_name:
            messages.error(request, f"Type {environment.full_name} to confirm; nothing was deleted.")
            return redirect("console:environment_delete", slug=team.slug, env=environment.slug)
        try:
            report = environment_delete(environment=environment, deleted_by=request.user)
        except EnvironmentGone as exc:
            raise Http404("No such environment.") from exc
        still = f"; {report.open_sessions} open session(s) run to their end" if report.open_sessions else ""
        messages.success(request, f"Deleted {report.name}: its {report.sessions_kept} session(s) stay in the "
                                  f"audit log and analytics{still}.")
        return redirect("console:environments", slug=team.slug)
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    return render(request, "console/environment_delete.html", {
        "team": team, "environment": environment,
        "preview": catalog.environment_delete_preview(environment=environment),
        "last_version": environment.versions.order_by("-number").first(),
    })


@login_required
@require_POST
def tasks_upload(request: HttpRequest, slug: str) -> HttpResponse:
    team, role, publisher = _team(request, slug, write=True)
    form = TaskFileForm(request.POST, request.FILES, team=team)
    if not form.is_valid():
        return _page(request, team, role, publisher, task_form=form, status=400)
    data = form.cleaned_data
    try:
        job = ingest_job_create(environment=data["environment"], split_name=data["split"], mode=data["mode"],
                                upload=data["file"], fmt=data["format"] or None,
                                split_type=data["split_type"] or None, created_by=request.user,
                                accept_failing_rows=data["accept_failing_rows"])
    except IngestError as exc:
        form.add_error("file", str(exc))
        return _page(request, team, role, publisher, task_form=form,
                     status=413 if isinstance(exc, UploadTooLarge) else 400)
    return redirect("console:ingest_job", slug=team.slug, job_id=job.id)


@login_required
@require_POST
def split_protection(request: HttpRequest, slug: str, env: str, split: str) -> HttpResponse:
    """A split's hidden fields (comma-separated names; empty shows them all) and sealing."""
    team, _, _ = _team(request, slug, write=True)
    environment = catalog.environment_of_team(team_id=team.id, slug=env)
    found = catalog.split_of(environment=environment, name=split) if environment is not None else None
    if found is None:
        raise Http404("No such split.")
    fields = [f.strip() for f in request.POST.get("hidden_fields", "")[:4000].split(",") if f.strip()]
    try:
        found = split_protection_set(split=found, hidden_fields=fields, sealed=bool(request.POST.get("sealed")))
    except ProtectionError as exc:
        messages.error(request, str(exc))
        return redirect("console:environments", slug=team.slug)
    hidden = ", ".join(found.hidden_fields) or "none"
    messages.success(request, f"{environment.full_name} split {found.name}: hidden fields {hidden}; "
                              f"{'sealed' if found.sealed else 'not sealed'}.")
    return redirect("console:environments", slug=team.slug)


def _job(request: HttpRequest, slug: str, job_id: int) -> tuple[Team, IngestJob]:
    team, _, _ = _team(request, slug)
    job = catalog.ingest_job_of_team(team_id=team.id, job_id=job_id)
    if job is None:
        raise Http404("No such ingest job.")
    return team, job


def _job_json(job: IngestJob) -> dict:
    return {"id": job.id, "status": job.status, "finished": job.finished, "percent": job.percent,
            "rows_done": job.rows_done, "bytes_done": job.bytes_done, "bytes_total": job.bytes_total,
            "num_tasks": job.num_tasks, "error_report": job.error_report, "row_check": job.row_check}


@login_required
@require_GET
def ingest_job(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    team, job = _job(request, slug, job_id)
    return render(request, "console/ingest_job.html", {
        "team": team, "job": job, "progress_url": reverse("console:ingest_job_json", args=[team.slug, job.id]),
    })


@login_required
@require_GET
def ingest_job_json(request: HttpRequest, slug: str, job_id: int) -> JsonResponse:
    _, job = _job(request, slug, job_id)
    return JsonResponse(_job_json(job))
