"""The caller's team's retention of tool calls (docs/audit-log.md): read with the sessions scope,
changed with the manage scope. A key only ever reaches its own team's policy."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import authorize_request, caller_of
from orsplatform.api.parsers import BoundedJSONParser
from orsplatform.auditlog import selectors, services
from orsplatform.teams.auth import Access
from orsplatform.teams.models import Team


class RetentionAccess(BasePermission):
    def has_permission(self, request, view) -> bool:
        read = request.method in ("GET", "HEAD", "OPTIONS")
        authorize_request(request, Access.TEAM if read else Access.MANAGE)
        return True


class RetentionSerializer(serializers.Serializer):
    hot_days = serializers.IntegerField(help_text="Days of tool calls kept in the database; older days are "
                                                  "archived (Parquet), verified, then dropped.")
    platform_default = serializers.BooleanField(help_text="True when the team has no policy of its own.")
    archived_days = serializers.IntegerField()
    archived_rows = serializers.IntegerField()
    archived_bytes = serializers.IntegerField()


class RetentionChangeSerializer(serializers.Serializer):
    hot_days = serializers.IntegerField(allow_null=True, min_value=1, max_value=services.MAX_HOT_DAYS,
                                        help_text="null: back to the platform's default.")


class RetentionView(APIView):
    permission_classes = [RetentionAccess]
    parser_classes = [BoundedJSONParser]

    @extend_schema(operation_id="retention_get", responses=RetentionSerializer)
    def get(self, request):
        team = Team.objects.get(pk=caller_of(request).team_id)
        return Response(selectors.retention_of(team=team).as_dict())

    @extend_schema(operation_id="retention_set", request=RetentionChangeSerializer, responses=RetentionSerializer)
    def put(self, request):
        team = Team.objects.get(pk=caller_of(request).team_id)
        body = RetentionChangeSerializer(data=request.data)
        if not body.is_valid():
            raise ValidationError(body.errors)
        services.retention_set(team=team, hot_days=body.validated_data["hot_days"])
        return Response(selectors.retention_of(team=team).as_dict())
