"""REST API for evaluations: AAP agents a team registered, evaluation runs over an environment's
tasks (launch, progress, cancel, resume) and leaderboards. Every endpoint serves the calling key's
team only; another team's agent or run answers 404, as a missing one does.

Scopes: reading, launching, cancelling, resuming and pinging need `sessions`; registering and
removing agents (the team's configuration, owners' and admins' on the web) need `manage`. A key
bound to one environment launches and resumes runs on that environment only (403)."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import TeamAccess, authorize_request, caller_of
from orsplatform.catalog.selectors import environment_get_visible, environment_resolve
from orsplatform.evals import selectors, services
from orsplatform.evals.aap import STREAM_MODES
from orsplatform.evals.models import Agent, EvalRun
from orsplatform.teams.auth import Access, AccessDenied, admit_environment
from orsplatform.teams.models import Team


def _team(request) -> Team:
    return Team.objects.get(pk=caller_of(request).team_id)


def _bad(exc: DjangoValidationError) -> ValidationError:
    return ValidationError({"detail": " ".join(exc.messages)})


def _bound_to(request, environment_id: int, name: str) -> None:
    """403 when the calling key is bound to another environment than the run's."""
    try:
        admit_environment(caller_of(request), environment_id, name)
    except AccessDenied as exc:
        raise PermissionDenied(str(exc)) from None


def agent_json(agent: Agent) -> dict:
    # The API key is write-only: only whether one is set.
    meta = agent.meta or {}
    return {"id": agent.id, "name": agent.name, "url": agent.url, "agent": agent.agent, "options": agent.options,
            "stream": agent.stream, "trusted_tools": agent.trusted_tools, "has_api_key": bool(agent.api_key_encrypted),
            "version": meta.get("version"), "title": meta.get("title"),
            "protocol_version": meta.get("protocol_version"), "capabilities": meta.get("capabilities") or {},
            "tools": [t.get("name") for t in meta.get("tools") or [] if isinstance(t, dict)],
            "created_at": agent.created_at}


class AgentIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    url = serializers.URLField(max_length=500)
    api_key = serializers.CharField(required=False, allow_blank=True, max_length=4000, trim_whitespace=True)
    agent = serializers.CharField(max_length=200)
    options = serializers.DictField(child=serializers.CharField(allow_blank=True, max_length=10_000), required=False)
    stream = serializers.ChoiceField(choices=STREAM_MODES, default="none")
    trusted_tools = serializers.ListField(child=serializers.CharField(max_length=200), required=False)


class AgentListView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="agents_list", responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response({"agents": [agent_json(a) for a in selectors.agents_of_team(team=_team(request))]})

    @extend_schema(operation_id="agents_create", request=AgentIn, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        authorize_request(request, Access.MANAGE)
        data = AgentIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            agent = services.agent_register(team=_team(request), **data.validated_data)
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        return Response(agent_json(agent), status=status.HTTP_201_CREATED)


def _agent(request, agent_id: int) -> Agent:
    agent = selectors.agent_of_team(team=_team(request), agent_id=agent_id)
    if agent is None:
        raise Http404("Agent not found.")
    return agent


class AgentDetailView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="agents_get", responses=OpenApiTypes.OBJECT)
    def get(self, request, agent_id: int):
        return Response(agent_json(_agent(request, agent_id)))

    @extend_schema(operation_id="agents_delete", responses={204: None})
    def delete(self, request, agent_id: int):
        authorize_request(request, Access.MANAGE)
        services.agent_remove(agent=_agent(request, agent_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class AgentPingView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="agents_ping", request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, agent_id: int):
        agent = _agent(request, agent_id)
        try:
            services.agent_ping(agent=agent)
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        return Response({"ok": True, **agent_json(agent)})


class RunIn(serializers.Serializer):
    agent = serializers.IntegerField()
    environment = serializers.CharField(max_length=200)
    split = serializers.CharField(max_length=100)
    start = serializers.IntegerField(min_value=0, default=0)
    stop = serializers.IntegerField(min_value=1, required=False)
    concurrency = serializers.IntegerField(min_value=1, default=4)
    max_turns = serializers.IntegerField(min_value=1, default=20)
    pass_threshold = serializers.FloatField(default=1.0)
    turn_timeout = serializers.FloatField(required=False)
    secrets = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)


def run_json(run: EvalRun, *, episodes: bool = False, offset: int = 0, limit: int = 1000) -> dict:
    body = selectors.run_detail(run=run)
    if episodes:
        body["episodes"] = [selectors.episode_row(e) for e in
                            selectors.run_episodes(run=run, offset=offset, limit=limit)]
    return body


class RunListView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="eval_runs_list", responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response({"runs": [run_json(r) for r in selectors.runs_of_team(team=_team(request))]})

    @extend_schema(operation_id="eval_runs_create", request=RunIn, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        data = RunIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        team = _team(request)
        agent = selectors.agent_of_team(team=team, agent_id=fields.pop("agent"))
        if agent is None:
            raise ValidationError({"detail": "No such agent."})
        caller = caller_of(request)
        if caller.environment_id is not None:
            env = environment_resolve(caller=caller, ref=fields["environment"])
            if env is not None:
                _bound_to(request, env.environment_id, env.full_name)
        try:
            run = services.eval_run_launch(team=team, agent=agent, **fields)
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        run = selectors.run_of_team(team=team, run_id=run.id)
        return Response(run_json(run), status=status.HTTP_201_CREATED)


def _run(request, run_id: int) -> EvalRun:
    run = selectors.run_of_team(team=_team(request), run_id=run_id)
    if run is None:
        raise Http404("Run not found.")
    return run


class RunDetailView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="eval_runs_get", responses=OpenApiTypes.OBJECT,
                   parameters=[OpenApiParameter("offset", int), OpenApiParameter("limit", int)])
    def get(self, request, run_id: int):
        try:
            offset = max(0, int(request.query_params.get("offset", 0)))
            limit = min(10_000, max(0, int(request.query_params.get("limit", 1000))))
        except ValueError:
            raise ValidationError({"detail": "offset and limit must be integers."}) from None
        return Response(run_json(_run(request, run_id), episodes=True, offset=offset, limit=limit))


class RunCancelView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="eval_runs_cancel", request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, run_id: int):
        try:
            run = services.eval_run_cancel(run=_run(request, run_id))
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        return Response(run_json(_run(request, run.id)))


class ResumeIn(serializers.Serializer):
    secrets = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)


class RunResumeView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="eval_runs_resume", request=ResumeIn, responses=OpenApiTypes.OBJECT)
    def post(self, request, run_id: int):
        data = ResumeIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        run = _run(request, run_id)
        _bound_to(request, run.environment_id, f"run {run.id}'s environment")
        try:
            run = services.eval_run_resume(run=run, secrets=data.validated_data.get("secrets"))
        except DjangoValidationError as exc:
            raise _bad(exc) from None
        return Response(run_json(_run(request, run.id)))


class LeaderboardView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="eval_leaderboard", responses=OpenApiTypes.OBJECT,
                   parameters=[OpenApiParameter("split", str, required=True)])
    def get(self, request, team: str, slug: str):
        team_obj = _team(request)
        environment = environment_get_visible(caller=caller_of(request), team_slug=team, slug=slug)
        split = (request.query_params.get("split") or "").strip()
        if environment is None:
            raise Http404("Environment not found.")
        if not split:
            raise ValidationError({"detail": "split is required."})
        rows = selectors.leaderboard(team=team_obj, environment_id=environment.id, split=split)
        sealed = selectors.split_is_sealed(environment_id=environment.id, split=split)
        return Response({"environment": f"{team}/{slug}", "split": split, "sealed": sealed, "rows": [
            {"run": r["run"].id, "agent": r["agent"], "version": r["version"], "episodes": r["done"],
             "pass_rate": r["pass_rate"], "pass_rate_interval": r["pass_rate_interval"],
             "mean_reward": r["mean_reward"], "mean_reward_interval": r["mean_reward_interval"],
             "date": r["run"].created_at, "sealed": sealed} for r in rows]})
