"""REST API v1, verified versions: a version's verification (progress, then the report), the
author's confirmation of a held version, and the environment's replay settings. Thin adapters over
verify.services and verify.selectors.

Only the environment's own team sees any of it (the report names its sessions): reads need a key
with the sessions scope, writes the publish scope; another team's environment answers 404, exactly
like a missing one."""

from __future__ import annotations

from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import authorize_request, caller_of
from orsplatform.api.parsers import BoundedJSONParser
from orsplatform.catalog import selectors as catalog
from orsplatform.catalog.models import Environment
from orsplatform.teams.auth import Access
from orsplatform.verify import selectors
from orsplatform.verify.models import Verification
from orsplatform.verify.services import NothingToConfirm, verification_confirm, verify_settings_set


class VerifyAccess(BasePermission):
    """Reads: the team's data (sessions scope); writes: the publish scope."""

    def has_permission(self, request, view) -> bool:
        read = request.method in ("GET", "HEAD", "OPTIONS")
        authorize_request(request, Access.TEAM if read else Access.PUBLISH)
        return True


class VerificationSerializer(serializers.Serializer):
    version = serializers.IntegerField(source="version.number")
    baseline = serializers.IntegerField(source="baseline.number", allow_null=True,
                                        help_text="The version whose recorded episodes are replayed.")
    status = serializers.CharField(help_text="queued, running, reported (report only), passed (made current), "
                                             "held (waits for a confirmation), confirmed, error")
    gated = serializers.BooleanField(help_text="Whether the version waits for this verification to be served.")
    current = serializers.SerializerMethodField()
    sample_size = serializers.IntegerField()
    threshold = serializers.FloatField(allow_null=True, help_text="null: report only.")
    solutions = serializers.IntegerField(help_text="Reference solutions in verify/solutions.jsonl.")
    items_total = serializers.IntegerField()
    items_done = serializers.IntegerField()
    percent = serializers.IntegerField()
    agreement = serializers.FloatField(allow_null=True)
    report = serializers.JSONField(help_text="Per task and overall agreement, the changed episodes (old and new "
                                             "reward, first differing call), the reference solutions' scores.")
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    confirmed_at = serializers.DateTimeField(allow_null=True)

    def get_current(self, verification: Verification) -> bool:
        return verification.version.environment.current_version_id == verification.version_id


class VerifySettingsSerializer(serializers.Serializer):
    sample_size = serializers.IntegerField(min_value=0, allow_null=True, required=False,
                                           help_text="Episodes replayed (null: the manifest's, else the default).")
    threshold = serializers.FloatField(min_value=0, max_value=1, allow_null=True, required=False,
                                       help_text="Agreement below which a new version waits (null: the manifest's).")
    report_only = serializers.BooleanField(required=False, default=False,
                                           help_text="Never hold a version for its agreement.")

    def validate_sample_size(self, value: int | None) -> int | None:
        if value is not None and value > settings.ORS_REPLAY_MAX_SAMPLE:
            raise ValidationError(f"At most {settings.ORS_REPLAY_MAX_SAMPLE}.")
        return value


def _own_environment(request, team: str, slug: str) -> Environment:
    caller = caller_of(request)
    environment = catalog.environment_of_team(team_id=caller.team_id, slug=slug) if caller.team_slug == team else None
    if environment is None:
        raise Http404("Environment not found.")
    return environment


def _verification(request, team: str, slug: str, number: int) -> Verification:
    environment = _own_environment(request, team, slug)
    verification = selectors.verification_of(team=environment.team_id, environment=environment, number=number)
    if verification is None:
        raise Http404("This version has no verification (no earlier version to replay, no reference solutions).")
    return verification


class VerificationView(APIView):
    permission_classes = [VerifyAccess]

    @extend_schema(responses=VerificationSerializer)
    def get(self, request, team: str, slug: str, number: int):
        return Response(VerificationSerializer(_verification(request, team, slug, number)).data)


class VersionConfirmView(APIView):
    permission_classes = [VerifyAccess]
    parser_classes = [BoundedJSONParser, FormParser]

    @extend_schema(request=None, responses={200: VerificationSerializer, 409: None})
    def post(self, request, team: str, slug: str, number: int):
        verification = _verification(request, team, slug, number)
        try:
            confirmed = verification_confirm(verification=verification)
        except NothingToConfirm as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(VerificationSerializer(confirmed).data)


class VerifySettingsView(APIView):
    permission_classes = [VerifyAccess]
    parser_classes = [BoundedJSONParser, FormParser]

    @extend_schema(responses=VerifySettingsSerializer)
    def get(self, request, team: str, slug: str):
        environment = _own_environment(request, team, slug)
        chosen = selectors.verify_settings_of(team=environment.team_id, environment=environment)
        return Response({"sample_size": chosen.sample_size if chosen else None,
                         "threshold": chosen.threshold if chosen else None,
                         "report_only": chosen.report_only if chosen else False})

    @extend_schema(request=VerifySettingsSerializer, responses=VerifySettingsSerializer)
    def put(self, request, team: str, slug: str):
        environment = _own_environment(request, team, slug)
        body = VerifySettingsSerializer(data=request.data)
        if not body.is_valid():
            raise ValidationError(body.errors)
        data = body.validated_data
        chosen = verify_settings_set(environment=environment, sample_size=data.get("sample_size"),
                                     threshold=data.get("threshold"), report_only=data.get("report_only", False))
        return Response({"sample_size": chosen.sample_size, "threshold": chosen.threshold,
                         "report_only": chosen.report_only})
