"""REST API for analytics: the numbers of the analytics pages as JSON, the session explorer, and the
training-data exports. Every endpoint serves the calling key's team only; bad filters are a 400."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.analytics import explorer, export, selectors
from orsplatform.analytics.filters import (
    OUTCOMES,
    SORTS,
    parse_explorer_params,
    parse_report_params,
    parse_session_filters,
)
from orsplatform.api.auth import TeamAccess, caller_of
from orsplatform.catalog import hidden
from orsplatform.teams.models import Team

WINDOW_PARAMETERS = [
    OpenApiParameter("range", str, description="24h, 7d, 30d (default), 90d, 365d or all"),
    OpenApiParameter("start", str, description="YYYY-MM-DD or ISO 8601 date-time (UTC); overrides range"),
    OpenApiParameter("end", str, description="YYYY-MM-DD (inclusive) or ISO 8601 date-time (UTC)"),
]
SESSION_PARAMETERS = [
    *WINDOW_PARAMETERS,
    OpenApiParameter("environment", str, description="team/slug"),
    OpenApiParameter("version", int, description="version number (needs environment)"),
    OpenApiParameter("api_key", str, description="key prefix"),
    OpenApiParameter("status", str),
    OpenApiParameter("outcome", str, description=", ".join(OUTCOMES)),
    OpenApiParameter("split", str),
    OpenApiParameter("task", int, description="task index (with split)"),
    OpenApiParameter("q", str, description="text searched in the task spec"),
    OpenApiParameter("reward_min", float),
    OpenApiParameter("reward_max", float),
]


def _team(request) -> Team:
    return Team.objects.get(pk=caller_of(request).team_id)


def _bad(exc: DjangoValidationError) -> ValidationError:
    return ValidationError({"detail": " ".join(exc.messages)})


class AnalyticsOverviewView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="analytics_overview", parameters=WINDOW_PARAMETERS, responses=OpenApiTypes.OBJECT)
    def get(self, request):
        try:
            params = parse_report_params(request.query_params)
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        return Response(selectors.overview(team=_team(request), window=params.window))


class AnalyticsEnvironmentView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="analytics_environment", parameters=[*WINDOW_PARAMETERS, OpenApiParameter("version", int)],
                   responses=OpenApiTypes.OBJECT)
    def get(self, request, team: str, slug: str):
        team_obj = _team(request)
        reader = hidden.sealed_reader(caller_of(request))
        env = selectors.environment_for_report(team=team_obj, env_team=team, env_slug=slug)
        if env is None:
            raise Http404("Environment not found.")
        try:
            params = parse_report_params(request.query_params, environment=env)
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        return Response(selectors.environment_report(team=team_obj, environment=env, version=params.version,
                                                     window=params.window, sealed_reader=reader))


class AnalyticsSessionListView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="analytics_sessions_list", parameters=[
        *SESSION_PARAMETERS, OpenApiParameter("page", int),
        OpenApiParameter("sort", str, description=f"one of {', '.join(SORTS)}; prefix - for descending (default -started)")],
        responses=OpenApiTypes.OBJECT)
    def get(self, request):
        team_obj = _team(request)
        try:
            params = parse_explorer_params(request.query_params, team=team_obj)
            page = explorer.sessions_page(team=team_obj, filters=params.filters, page=params.page, sort=params.sort,
                                           sealed_reader=hidden.sealed_reader(caller_of(request)))
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        return Response(page)


class AnalyticsSessionDetailView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="analytics_session", responses=OpenApiTypes.OBJECT)
    def get(self, request, sid: str):
        trajectory = explorer.session_trajectory(team=_team(request), sid=sid,
                                                  sealed_reader=hidden.sealed_reader(caller_of(request)))
        if trajectory is None:
            raise Http404("Session not found.")
        return Response(trajectory)


class _ExportView(APIView):
    permission_classes = [TeamAccess]
    writer = staticmethod(export.jsonl_response)

    def get(self, request):
        team_obj = _team(request)
        try:
            filters = parse_session_filters(request.query_params, team=team_obj)
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        # The Django request, not DRF's wrapper: the writer picks a sync or async body by its type.
        return self.writer(request._request, team=team_obj, filters=filters,
                           sealed_reader=hidden.sealed_reader(caller_of(request)))


class AnalyticsExportJsonlView(_ExportView):
    """Sessions with task spec, prompt, calls and rewards, one JSON object per line (streamed)."""

    writer = staticmethod(export.jsonl_response)

    @extend_schema(operation_id="analytics_export_jsonl", parameters=SESSION_PARAMETERS,
                   responses={(200, "application/x-ndjson"): OpenApiTypes.BINARY})
    def get(self, request):
        return super().get(request)


class AnalyticsExportParquetView(_ExportView):
    """The JSONL export's records as a Parquet file (JSON-valued fields as JSON text)."""

    writer = staticmethod(export.parquet_response)

    @extend_schema(operation_id="analytics_export_parquet", parameters=SESSION_PARAMETERS,
                   responses={(200, "application/vnd.apache.parquet"): OpenApiTypes.BINARY})
    def get(self, request):
        return super().get(request)
