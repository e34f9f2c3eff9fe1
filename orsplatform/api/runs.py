"""REST API for training runs: the runs list, a run with its series, and one trajectory (a rollout's
messages with its linked session's tool calls). Every endpoint serves the calling key's team only."""

from __future__ import annotations

from dataclasses import asdict

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import TeamAccess, caller_of
from orsplatform.runs import selectors
from orsplatform.teams.models import Team


def _team(request) -> Team:
    return Team.objects.get(pk=caller_of(request).team_id)


class RunSummarySerializer(serializers.Serializer):
    name = serializers.CharField()
    rollouts = serializers.IntegerField(help_text="Rollouts logged through the Rollout API")
    episodes = serializers.IntegerField(help_text="ORS/OpenEnv sessions whose run is this one")
    messages = serializers.IntegerField()
    mean_reward = serializers.FloatField(allow_null=True)
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    model_name = serializers.CharField(allow_blank=True)
    info = serializers.DictField(help_text="The latest RunInfo (model_name, rl_algorithm, lr, ...)")


class RunPointSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["rollout", "session"])
    ref = serializers.CharField(help_text="Rollout event id or session id: GET /api/v1/rollouts/{ref}")
    order = serializers.IntegerField(help_text="1-based position in the run by start time")
    step = serializers.IntegerField(allow_null=True, help_text="RolloutInfo.current_step, when sent")
    x = serializers.IntegerField(help_text="step when sent, else order")
    reward = serializers.FloatField(allow_null=True)
    passed = serializers.BooleanField(allow_null=True)
    length = serializers.IntegerField(help_text="messages (rollout) or tool calls (session)")
    error = serializers.BooleanField()
    split = serializers.CharField(allow_blank=True)
    environment = serializers.CharField(allow_blank=True)
    version = serializers.IntegerField(allow_null=True)
    started_at = serializers.DateTimeField()
    session = serializers.CharField(allow_null=True, source="session_sid", help_text="linked session id")
    trajectory = serializers.CharField(help_text="URL of the trajectory")


class RunFacetsSerializer(serializers.Serializer):
    environments = serializers.ListField(child=serializers.CharField())
    versions = serializers.ListField(child=serializers.IntegerField())
    splits = serializers.ListField(child=serializers.CharField())


class RunDetailSerializer(RunSummarySerializer):
    facets = RunFacetsSerializer()
    series = RunPointSerializer(many=True)


class RunListSerializer(serializers.Serializer):
    runs = RunSummarySerializer(many=True)


class SeriesQuery(serializers.Serializer):
    environment = serializers.RegexField(r"^[^/]+/[^/]+$", required=False, help_text="team/slug")
    version = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    split = serializers.CharField(required=False, max_length=100)


class RolloutMessageSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    type = serializers.CharField()
    content = serializers.CharField(allow_blank=True)
    summary = serializers.CharField(allow_blank=True)
    name = serializers.CharField(allow_blank=True)
    call_id = serializers.CharField(allow_blank=True)
    reward = serializers.FloatField(allow_null=True)
    is_finished = serializers.BooleanField()
    metadata = serializers.DictField()
    timestamp = serializers.DateTimeField()


class TrajectoryCallSerializer(serializers.Serializer):
    task_id = serializers.CharField()
    name = serializers.CharField()
    input = serializers.JSONField()
    status = serializers.CharField()
    output = serializers.JSONField(allow_null=True)
    reward = serializers.FloatField(allow_null=True)
    finished = serializers.BooleanField()
    started_at = serializers.DateTimeField()


class TrajectorySerializer(serializers.Serializer):
    run = serializers.CharField(allow_null=True)
    rollout = serializers.DictField(allow_null=True)
    session = serializers.DictField(allow_null=True)
    messages = RolloutMessageSerializer(many=True)
    tool_calls = TrajectoryCallSerializer(many=True)


def _point(point: selectors.RunPoint) -> dict:
    data = asdict(point)
    data["trajectory"] = f"/api/v1/rollouts/{point.ref}"
    return data


class RunListView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="runs_list", responses=RunListSerializer)
    def get(self, request):
        runs = selectors.runs_for_team(team=_team(request))
        return Response({"runs": RunSummarySerializer([asdict(r) for r in runs], many=True).data})


class RunDetailView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="runs_retrieve", parameters=[SeriesQuery], responses=RunDetailSerializer)
    def get(self, request, name: str):
        query = SeriesQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        team = _team(request)
        # PostgreSQL cannot compare text holding NUL; no run can be named so.
        summary = None if "\x00" in name else selectors.run_summary(team=team, name=name)
        if summary is None:
            raise Http404("Run not found.")
        series = selectors.run_series(team=team, name=name, **query.validated_data)
        data = RunSummarySerializer(asdict(summary)).data
        data["facets"] = selectors.run_facets(team=team, name=name)
        data["series"] = RunPointSerializer([_point(p) for p in series], many=True).data
        return Response(data)


class TrajectoryView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="rollouts_retrieve", responses=TrajectorySerializer,
                   parameters=[OpenApiParameter("ref", str, OpenApiParameter.PATH,
                                                description="a rollout's event id or a session id")])
    def get(self, request, ref: str):
        found = None if "\x00" in ref else selectors.rollout_trajectory(team=_team(request), ref=ref)
        if found is None:
            raise Http404("Rollout not found.")
        r, s = found.rollout, found.session
        rollout = None if r is None else {
            "ref": r.event_id, "name": r.name, "environment": r.environment_name, "split": r.split,
            "task_spec": r.task_spec, "task_index": r.task_index, "step": r.step, "reward": r.reward,
            "finished": r.finished, "error": r.error, "messages": r.messages, "info": r.info or {},
            "run_info": r.run_info or {}, "metadata": r.metadata, "started_at": r.started_at}
        session = None if s is None else {
            "sid": s.sid, "status": s.status, "run": s.run_name, "environment": s.environment.full_name,
            "version": s.version.number, "split": s.split, "task_index": s.task_index, "calls": s.calls,
            "total_reward": s.total_reward, "finished": s.finished, "created_at": s.created_at}
        return Response({
            "run": r.run.name if r is not None else (s.run_name if s is not None else None),
            "rollout": rollout, "session": session,
            "messages": RolloutMessageSerializer(found.messages, many=True).data,
            "tool_calls": TrajectoryCallSerializer(found.tool_calls, many=True).data})
