"""REST API v1: the catalog and the team's audit log. Thin adapters over selectors."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import CatalogAccess, TeamAccess, authorize_request, caller_of
from orsplatform.api.serializers import (
    EnvironmentDetailSerializer,
    EnvironmentSerializer,
    SessionDetailSerializer,
    SessionSerializer,
    ToolCallSerializer,
)
from orsplatform.catalog import hidden
from orsplatform.catalog.selectors import environment_get_visible, environment_of_team, environments_visible
from orsplatform.catalog.services import EnvironmentGone, environment_delete
from orsplatform.episodes.models import Session
from orsplatform.episodes.selectors import session_detail_for_team, sessions_for_team
from orsplatform.teams.auth import Access
from orsplatform.teams.selectors import api_key_manages


class EnvironmentListView(APIView):
    permission_classes = [CatalogAccess]

    @extend_schema(responses=EnvironmentSerializer(many=True))
    def get(self, request):
        envs = environments_visible(caller=caller_of(request))
        return Response(EnvironmentSerializer(envs, many=True).data)


class EnvironmentDeletedSerializer(serializers.Serializer):
    deleted = serializers.CharField(source="name", help_text="team/slug as it was")
    sessions_kept = serializers.IntegerField(help_text="sessions, tool calls and analytics stay (the audit log)")
    open_sessions = serializers.IntegerField(help_text="not cut: they run to their end")
    keys_revoked = serializers.IntegerField(help_text="API keys bound to it, revoked")


class EnvironmentDetailView(APIView):
    permission_classes = [CatalogAccess]

    def get_permissions(self):
        return [] if self.request.method == "DELETE" else super().get_permissions()

    @extend_schema(responses=EnvironmentDetailSerializer)
    def get(self, request, team: str, slug: str):
        env = environment_get_visible(caller=caller_of(request), team_slug=team, slug=slug)
        if env is None:
            raise Http404("Environment not found.")
        return Response(EnvironmentDetailSerializer(env).data)

    @extend_schema(responses={200: EnvironmentDeletedSerializer})
    def delete(self, request, team: str, slug: str):
        """Delete one of the key's team's environments (docs/environment-lifecycle.md): a key with the
        manage scope whose creator is an owner or admin. Another team's answers 404."""
        caller = authorize_request(request, Access.KEY)
        env = environment_of_team(team_id=caller.team_id, slug=slug) if caller.team_slug == team else None
        if env is None:
            raise Http404("Environment not found.")
        if not api_key_manages(api_key_id=caller.api_key_id, team_id=caller.team_id):
            raise PermissionDenied("Deleting an environment needs a key with the manage scope, created by an "
                                   "owner or admin of the team.")
        try:
            report = environment_delete(environment=env)
        except EnvironmentGone as exc:
            raise Http404("Environment not found.") from exc
        return Response(EnvironmentDeletedSerializer(report).data, status=status.HTTP_200_OK)


class SessionQuery(serializers.Serializer):
    environment = serializers.CharField(required=False, max_length=200)
    status = serializers.ChoiceField(choices=Session.Status.values, required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=100)
    before_id = serializers.IntegerField(required=False, min_value=1)


class SessionListView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(parameters=[SessionQuery], responses=SessionSerializer(many=True))
    def get(self, request):
        query = SessionQuery(data=request.query_params)
        if not query.is_valid():
            raise ValidationError(query.errors)
        sessions = sessions_for_team(team_id=caller_of(request).team_id, **query.validated_data)
        return Response(SessionSerializer(sessions, many=True).data)


class SessionDetailView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(responses=SessionDetailSerializer)
    def get(self, request, sid: str):
        caller = caller_of(request)
        found = session_detail_for_team(team_id=caller.team_id, sid=sid, sealed_reader=hidden.sealed_reader(caller))
        if found is None:
            raise Http404("Session not found.")
        session, calls = found
        data = SessionDetailSerializer(session).data
        data["tool_calls"] = ToolCallSerializer(calls, many=True).data
        return Response(data)



