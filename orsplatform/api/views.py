"""REST API v1: the catalog and the team's audit log. Thin adapters over selectors."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import CatalogAccess, TeamAccess, caller_of
from orsplatform.api.serializers import (
    EnvironmentDetailSerializer,
    EnvironmentSerializer,
    SessionDetailSerializer,
    SessionSerializer,
    ToolCallSerializer,
)
from orsplatform.catalog.selectors import environment_get_visible, environments_visible
from orsplatform.episodes.models import Session
from orsplatform.episodes.selectors import session_detail_for_team, sessions_for_team


class EnvironmentListView(APIView):
    permission_classes = [CatalogAccess]

    @extend_schema(responses=EnvironmentSerializer(many=True))
    def get(self, request):
        envs = environments_visible(caller=caller_of(request))
        return Response(EnvironmentSerializer(envs, many=True).data)


class EnvironmentDetailView(APIView):
    permission_classes = [CatalogAccess]

    @extend_schema(responses=EnvironmentDetailSerializer)
    def get(self, request, team: str, slug: str):
        env = environment_get_visible(caller=caller_of(request), team_slug=team, slug=slug)
        if env is None:
            raise Http404("Environment not found.")
        return Response(EnvironmentDetailSerializer(env).data)


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
        found = session_detail_for_team(team_id=caller_of(request).team_id, sid=sid)
        if found is None:
            raise Http404("Session not found.")
        session, calls = found
        data = SessionDetailSerializer(session).data
        data["tool_calls"] = ToolCallSerializer(calls, many=True).data
        return Response(data)



