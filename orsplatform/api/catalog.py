"""REST API v1, publishing: versions (upload, list, rollback), splits, tasks (upload, page) and ingest
jobs. Thin adapters over catalog.services and catalog.selectors.

Writes need a key with the ``publish`` scope and only ever touch the key's own team: a path naming
another team answers 404, exactly like a missing environment, so nothing about it is revealed.
"""

from __future__ import annotations

from django.conf import settings
from django.http import Http404
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import CatalogAccess, authorize_request, caller_of
from orsplatform.api.parsers import BoundedJSONParser
from orsplatform.catalog import hidden, selectors
from orsplatform.catalog.ingest import IngestError
from orsplatform.catalog.models import Environment, EnvironmentVersion, IngestJob, Split
from orsplatform.catalog.packages import remove_quietly, save_upload
from orsplatform.catalog.protection import ProtectionError, split_protection_set
from orsplatform.catalog.services import (
    MAX_MESSAGE_CHARS,
    PublishError,
    UploadTooLarge,
    VersionNotFound,
    environment_publish_path,
    environment_rollback,
    ingest_job_create,
)
from orsplatform.teams.auth import Access, Caller
from orsplatform.teams.models import Team
from orsplatform.teams.selectors import api_key_of_team

# Room for the multipart envelope around the file when the body size is checked before parsing.
MULTIPART_SLACK = 64 * 1024
MAX_PAGE = 1000
# Publishing checks whose failure means "more than the platform takes" (413), not "wrong" (400).
TOO_LARGE = ("size", "quota")


class PublishAccess(BasePermission):
    """Publishing: a key with the publish scope (reads stay open like the rest of the catalog)."""

    def has_permission(self, request, view) -> bool:
        read = request.method in ("GET", "HEAD", "OPTIONS")
        authorize_request(request, Access.CATALOG if read else Access.PUBLISH)
        return True


class VersionSerializer(serializers.Serializer):
    environment = serializers.CharField(source="environment.full_name")
    number = serializers.IntegerField()
    content_hash = serializers.CharField()
    entrypoint = serializers.CharField()
    status = serializers.CharField(help_text="building (installing requirements), ready or failed")
    current = serializers.SerializerMethodField()
    tools = serializers.JSONField()
    splits = serializers.JSONField()
    manifest = serializers.JSONField()
    requirements = serializers.JSONField(help_text="What the package asks to have installed; [] runs on the "
                                                   "platform's own runtime.")
    notes = serializers.JSONField(help_text="What the platform noticed but does not use (a Dockerfile).")
    error = serializers.CharField(help_text="Why a failed version failed: '<check>: <message>'.")
    build_log = serializers.SerializerMethodField(help_text="The tail of the requirements build's log.")
    data_sha256 = serializers.CharField(source="data_hash", help_text="The data archive mounted at /orwd_data "
                                        "(sha256 of the archive); empty: the package's data/ folder, if any.")
    message = serializers.CharField(help_text="The publisher's note on this version.")
    published_by = serializers.SerializerMethodField(help_text="Who published: a user (\"alice\"), an API key "
                                                     "(\"key ci-bot (alice)\") or the command line.")
    tags = serializers.JSONField(help_text="The manifest's tags.")
    created_at = serializers.DateTimeField()

    def get_published_by(self, version: EnvironmentVersion) -> str:
        return version.publisher

    def get_current(self, version: EnvironmentVersion) -> bool:
        return version.environment.current_version_id == version.id

    def get_build_log(self, version: EnvironmentVersion) -> str:
        return selectors.version_build_log(version=version)


class PublishedSerializer(VersionSerializer):
    created = serializers.BooleanField()
    validation = serializers.JSONField()


class PublishFailureSerializer(serializers.Serializer):
    detail = serializers.CharField()
    check = serializers.CharField()
    traceback = serializers.CharField()


class SplitStateSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.CharField()
    num_tasks = serializers.IntegerField()
    revision = serializers.IntegerField()
    hidden_fields = serializers.ListField(child=serializers.CharField(), help_text=(
        "Top-level task fields only the environment's code sees (docs/hidden-tasks.md)."))
    sealed = serializers.BooleanField(help_text="Task specs readable only with the owning team's publish keys.")


class SplitProtectionSerializer(serializers.Serializer):
    hidden_fields = serializers.ListField(child=serializers.CharField(max_length=200), max_length=100,
                                          required=False)
    sealed = serializers.BooleanField(required=False)


class IndexedTaskSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    spec = serializers.JSONField()


class TaskPageSerializer(serializers.Serializer):
    split = serializers.CharField()
    num_tasks = serializers.IntegerField()
    offset = serializers.IntegerField()
    limit = serializers.IntegerField()
    next = serializers.IntegerField(allow_null=True, help_text="The next page's offset; null on the last page.")
    tasks = IndexedTaskSerializer(many=True)


class IngestJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    environment = serializers.CharField(source="environment.full_name")
    split = serializers.CharField(source="split_name")
    mode = serializers.CharField()
    format = serializers.CharField()
    file_name = serializers.CharField()
    status = serializers.CharField()
    rows_done = serializers.IntegerField()
    bytes_done = serializers.IntegerField()
    bytes_total = serializers.IntegerField()
    percent = serializers.IntegerField()
    num_tasks = serializers.IntegerField(allow_null=True)
    error_report = serializers.JSONField()
    accept_failing_rows = serializers.BooleanField()
    row_check = serializers.JSONField(help_text="the row check of an accepted upload: rows sampled, and the "
                                                "failing rows accepted as warnings (row, line, field, error, "
                                                "traceback)")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class RollbackSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)


class RolledBackSerializer(VersionSerializer):
    previous = serializers.IntegerField(allow_null=True, help_text="The version served before: roll back to it "
                                                                   "to undo (null: none was).")


class TaskPageQuery(serializers.Serializer):
    offset = serializers.IntegerField(min_value=0, default=0)
    limit = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=100)


class TaskUploadQuery(serializers.Serializer):
    mode = serializers.ChoiceField(choices=IngestJob.Mode.values, default=IngestJob.Mode.APPEND)
    format = serializers.ChoiceField(choices=["jsonl", "csv", "parquet"], required=False)
    type = serializers.ChoiceField(choices=Split.Type.values, required=False)
    accept_failing_rows = serializers.BooleanField(
        default=False, help_text="Rows that fail the row check (a sample run through setup() and get_prompt()) "
                                 "are accepted and reported as warnings; by default they refuse the upload.")


def _visible_environment(request, team: str, slug: str) -> Environment:
    environment = selectors.environment_get_visible(caller=caller_of(request), team_slug=team, slug=slug)
    if environment is None:
        raise Http404("Environment not found.")
    return environment


def _own_team(request, team: str) -> Caller:
    caller = caller_of(request)
    if caller.team_slug != team:
        raise Http404("Environment not found.")
    return caller


def _own_environment(request, team: str, slug: str) -> Environment:
    caller = _own_team(request, team)
    environment = selectors.environment_of_team(team_id=caller.team_id, slug=slug)
    if environment is None:
        raise Http404("Environment not found.")
    return environment


def _too_large(request, limit: int) -> Response | None:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit + MULTIPART_SLACK:
        return Response({"detail": f"The upload is larger than the limit of {limit} bytes."},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    return None


def _upload(request, field: str):
    upload = request.FILES.get(field)
    if upload is None:
        raise ValidationError(f"Send the file as the multipart field '{field}'.")
    return upload


PACKAGE_REQUEST = {"multipart/form-data": {"type": "object", "required": ["package"], "properties": {
    "package": {"type": "string", "format": "binary", "description": ".zip, .tar.gz or a single .py"},
    "visibility": {"type": "string", "enum": Environment.Visibility.values},
    "message": {"type": "string", "maxLength": MAX_MESSAGE_CHARS,
                "description": "what changed in this version (shown in its history)"},
    "data": {"type": "string", "format": "binary",
             "description": "a data archive (.zip or .tar.gz, up to ORS_MAX_DATA_ARCHIVE_BYTES) mounted read-only "
                            "at /orwd_data"},
}}}
TASKS_REQUEST = {"multipart/form-data": {"type": "object", "required": ["file"], "properties": {
    "file": {"type": "string", "format": "binary", "description": "tasks as .jsonl, .csv or .parquet"},
}}}


class VersionListView(APIView):
    permission_classes = [PublishAccess]
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(responses=VersionSerializer(many=True))
    def get(self, request, team: str, slug: str):
        environment = _visible_environment(request, team, slug)
        return Response(VersionSerializer(selectors.versions_of(environment=environment), many=True).data)

    @extend_schema(request=PACKAGE_REQUEST,
                   parameters=[OpenApiParameter("wait", bool, OpenApiParameter.QUERY, required=False,
                                                description="Build a package's requirements within the request "
                                                            "(else 202 and the version shows the build).")],
                   responses={201: PublishedSerializer, 200: PublishedSerializer, 202: PublishedSerializer,
                              400: PublishFailureSerializer})
    def post(self, request, team: str, slug: str):
        caller = _own_team(request, team)
        limit, data_limit = settings.ORS_MAX_PACKAGE_BYTES, settings.ORS_MAX_DATA_ARCHIVE_BYTES
        refused = _too_large(request, limit + data_limit)
        if refused is not None:
            return refused
        upload = _upload(request, "package")
        if upload.size > limit:
            return Response({"detail": f"The package is {upload.size} bytes; the limit is {limit}."},
                            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        data_upload = request.FILES.get("data")
        if data_upload is not None and data_upload.size > data_limit:
            return Response({"detail": f"The data archive is {data_upload.size} bytes; the limit is {data_limit} "
                                       "(ORS_MAX_DATA_ARCHIVE_BYTES)."}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        visibility = request.data.get("visibility") or None
        if visibility is not None and visibility not in Environment.Visibility.values:
            raise ValidationError(f"Unknown visibility {visibility!r}: public or private.")
        message = request.data.get("message") or ""
        if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
            raise ValidationError(f"'message' must be text of at most {MAX_MESSAGE_CHARS} characters.")
        # ?wait=1: a package with requirements is built within the request (scripts that want the
        # outcome in one call); by default the answer is 202 and the version shows the build.
        wait = request.query_params.get("wait", "").lower() in ("1", "true", "yes")
        team_obj = Team.objects.get(id=caller.team_id)
        key = api_key_of_team(team_id=caller.team_id, key_id=caller.api_key_id)
        path = save_upload(upload)
        data_path = save_upload(data_upload) if data_upload is not None else None
        try:
            result = environment_publish_path(team=team_obj, path=path, filename=upload.name, slug=slug,
                                              visibility=visibility, wait=wait, data_path=data_path,
                                              data_filename=data_upload.name if data_upload is not None else None,
                                              message=message, created_by_key=key)
        except PublishError as exc:
            code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE if exc.check in TOO_LARGE else status.HTTP_400_BAD_REQUEST
            return Response({"detail": str(exc), "check": exc.check, "traceback": exc.traceback}, status=code)
        finally:
            remove_quietly(path)
            remove_quietly(data_path)
        if result.version.status == EnvironmentVersion.Status.FAILED:
            check, _, detail = result.version.error.partition(": ")
            code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE if check in TOO_LARGE else status.HTTP_400_BAD_REQUEST
            return Response({"detail": detail, "check": check, "traceback": "",
                             "version": VersionSerializer(result.version).data}, status=code)
        data = dict(VersionSerializer(result.version).data)
        data["created"] = result.created
        data["validation"] = _validation_summary(result.report)
        if result.version.status == EnvironmentVersion.Status.BUILDING:
            # Accepted: its requirements are being installed; GET the version to follow the build.
            return Response(data, status=status.HTTP_202_ACCEPTED, headers={"Location": reverse(
                "api-version", args=[team, result.version.environment.slug, result.version.number])})
        return Response(data, status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)


def _validation_summary(report: dict) -> dict:
    if not report or "tools" not in report:
        return {}
    return {"entrypoint": report.get("entrypoint"), "tools": [t["name"] for t in report.get("tools", [])],
            "splits": report.get("splits", []), "class_task_counts": report.get("task_counts", {}),
            "prompt_checked": report.get("prompt_checked", False), "sdk": report.get("sdk")}


class VersionDetailView(APIView):
    permission_classes = [CatalogAccess]

    @extend_schema(responses=VersionSerializer)
    def get(self, request, team: str, slug: str, number: int):
        environment = _visible_environment(request, team, slug)
        version = selectors.version_of(environment=environment, number=number)
        if version is None:
            raise Http404("Version not found.")
        return Response(VersionSerializer(version).data)


class RollbackView(APIView):
    permission_classes = [PublishAccess]
    parser_classes = [BoundedJSONParser, FormParser, MultiPartParser]

    @extend_schema(request=RollbackSerializer, responses=RolledBackSerializer)
    def post(self, request, team: str, slug: str):
        environment = _own_environment(request, team, slug)
        body = RollbackSerializer(data=request.data)
        if not body.is_valid():
            raise ValidationError(body.errors)
        try:
            rolled = environment_rollback(environment=environment, number=body.validated_data["version"])
        except VersionNotFound as exc:
            raise Http404(str(exc)) from exc
        return Response({**VersionSerializer(rolled.version).data, "previous": rolled.previous})


class SplitListView(APIView):
    permission_classes = [CatalogAccess]

    @extend_schema(responses=SplitStateSerializer(many=True))
    def get(self, request, team: str, slug: str):
        environment = _visible_environment(request, team, slug)
        return Response(SplitStateSerializer(selectors.splits_of(environment=environment), many=True).data)


class SplitDetailView(APIView):
    """One split's protection: hidden task fields and sealing (docs/hidden-tasks.md)."""

    permission_classes = [PublishAccess]

    @extend_schema(responses=SplitStateSerializer)
    def get(self, request, team: str, slug: str, split: str):
        environment = _visible_environment(request, team, slug)
        found = selectors.split_of(environment=environment, name=split)
        if found is None:
            raise Http404("Split not found.")
        return Response(SplitStateSerializer(found).data)

    @extend_schema(request=SplitProtectionSerializer, responses=SplitStateSerializer)
    def patch(self, request, team: str, slug: str, split: str):
        environment = _own_environment(request, team, slug)
        found = selectors.split_of(environment=environment, name=split)
        if found is None:
            raise Http404("Split not found.")
        body = SplitProtectionSerializer(data=request.data)
        if not body.is_valid():
            raise ValidationError(body.errors)
        try:
            found = split_protection_set(split=found, hidden_fields=body.validated_data.get("hidden_fields"),
                                         sealed=body.validated_data.get("sealed"))
        except ProtectionError as exc:
            raise ValidationError(str(exc)) from exc
        return Response(SplitStateSerializer(found).data)


class SplitTasksView(APIView):
    permission_classes = [PublishAccess]
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(parameters=[TaskPageQuery], responses=TaskPageSerializer)
    def get(self, request, team: str, slug: str, split: str):
        environment = _visible_environment(request, team, slug)
        found = selectors.split_of(environment=environment, name=split)
        if found is None:
            raise Http404("Split not found.")
        query = TaskPageQuery(data=request.query_params)
        if not query.is_valid():
            raise ValidationError(query.errors)
        offset, limit = query.validated_data["offset"], query.validated_data["limit"]
        caller = caller_of(request)
        owner = hidden.owner_key(caller, environment.team_id)
        if found.sealed and not owner:
            raise PermissionDenied(hidden.sealed_reason(found.name, environment.full_name))
        tasks = selectors.tasks_page(split=found, offset=offset, limit=limit)
        if not owner and found.hidden_fields:
            fields = frozenset(found.hidden_fields)
            tasks = [{"index": t["index"], "spec": hidden.redact(t["spec"], fields)} for t in tasks]
        return Response({
            "split": found.name, "num_tasks": found.num_tasks, "offset": offset, "limit": limit,
            "next": offset + limit if offset + limit < found.num_tasks else None, "tasks": tasks,
        })

    @extend_schema(parameters=[TaskUploadQuery], request=TASKS_REQUEST,
                   responses={202: IngestJobSerializer, 200: IngestJobSerializer})
    def post(self, request, team: str, slug: str, split: str):
        environment = _own_environment(request, team, slug)
        refused = _too_large(request, settings.ORS_MAX_TASK_FILE_BYTES)
        if refused is not None:
            return refused
        query = TaskUploadQuery(data={**request.query_params.dict(),
                                      **{k: v for k, v in request.data.items()
                                         if k in ("mode", "format", "type", "accept_failing_rows")}})
        if not query.is_valid():
            raise ValidationError(query.errors)
        upload = _upload(request, "file")
        try:
            job = ingest_job_create(environment=environment, split_name=split, mode=query.validated_data["mode"],
                                    upload=upload, fmt=query.validated_data.get("format"),
                                    split_type=query.validated_data.get("type"),
                                    accept_failing_rows=query.validated_data["accept_failing_rows"])
        except UploadTooLarge as exc:
            return Response(exc.report(), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        except IngestError as exc:
            return Response(exc.report(), status=status.HTTP_400_BAD_REQUEST)
        # Eager (no broker): the ingest already ran inside ingest_job_create's on_commit.
        job = selectors.ingest_job_of_team(team_id=environment.team_id, job_id=job.id)
        data = IngestJobSerializer(job).data
        if job.status == IngestJob.Status.FAILED:
            code = (status.HTTP_413_REQUEST_ENTITY_TOO_LARGE if job.error_report.get("check") == "quota"
                    else status.HTTP_400_BAD_REQUEST)
            return Response({**job.error_report, "job": data}, status=code)
        code = status.HTTP_200_OK if job.status == IngestJob.Status.SUCCEEDED else status.HTTP_202_ACCEPTED
        return Response(data, status=code)


class IngestJobView(APIView):
    @extend_schema(responses=IngestJobSerializer,
                   parameters=[OpenApiParameter("job_id", int, OpenApiParameter.PATH)])
    def get(self, request, job_id: int):
        caller = authorize_request(request, Access.KEY)
        job = selectors.ingest_job_of_team(team_id=caller.team_id, job_id=job_id)
        if job is None:
            raise Http404("Ingest job not found.")
        return Response(IngestJobSerializer(job).data)
