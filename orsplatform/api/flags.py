"""REST API for reward-hacking and anomaly flags: the calling key's team's flags, each with links to
the episodes behind it."""

from __future__ import annotations

from django.db.models import Q
from django.http import Http404
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from orsplatform.api.auth import TeamAccess, caller_of
from orsplatform.catalog.models import Environment
from orsplatform.flags import selectors
from orsplatform.flags.models import Flag
from orsplatform.teams.models import Team


class FlagEpisodeSerializer(serializers.Serializer):
    sid = serializers.CharField()
    api = serializers.CharField(help_text="GET it for the session and its tool calls")
    page = serializers.CharField(help_text="The session explorer page")


class FlagSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=Flag.Kind.choices)
    title = serializers.CharField(help_text="What the kind means")
    summary = serializers.CharField()
    environment = serializers.CharField(help_text="team/slug")
    version = serializers.IntegerField(allow_null=True)
    run = serializers.CharField(allow_blank=True)
    split = serializers.CharField(allow_blank=True)
    task_index = serializers.IntegerField(allow_null=True)
    details = serializers.DictField()
    first_seen_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()
    episodes = FlagEpisodeSerializer(many=True)


class FlagListSerializer(serializers.Serializer):
    flags = FlagSerializer(many=True)


class FlagQuery(serializers.Serializer):
    environment = serializers.RegexField(r"^[^/]{1,100}/[^/]{1,100}$", required=False, help_text="team/slug")
    run = serializers.CharField(required=False, max_length=200)
    kind = serializers.ChoiceField(choices=Flag.Kind.choices, required=False)


def flag_data(flag: Flag, team: Team) -> dict:
    episodes = [{"sid": sid, "api": reverse("api-analytics-session", args=[sid]),
                 "page": reverse("analytics:session", args=[team.slug, sid])} for sid in flag.sessions]
    return {"id": flag.id, "kind": flag.kind, "title": flag.get_kind_display(), "summary": flag.summary,
            "environment": flag.environment.full_name, "version": flag.version.number if flag.version else None,
            "run": flag.run_name, "split": flag.split, "task_index": flag.task_index, "details": flag.details,
            "first_seen_at": flag.first_seen_at, "last_seen_at": flag.last_seen_at, "episodes": episodes}


class FlagListView(APIView):
    permission_classes = [TeamAccess]

    @extend_schema(operation_id="flags_list", parameters=[FlagQuery], responses=FlagListSerializer)
    def get(self, request):
        query = FlagQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        team = Team.objects.get(pk=caller_of(request).team_id)
        environment = None
        if "environment" in query.validated_data:
            env_team, _, slug = query.validated_data["environment"].partition("/")
            # Another team's private environment answers like a missing one.
            environment = (Environment.objects.filter(team__slug=env_team, slug=slug)
                           .filter(Q(visibility=Environment.Visibility.PUBLIC) | Q(team=team)).first())
            if environment is None:
                raise Http404("Environment not found.")
        flags = selectors.flags_for_team(team=team, environment=environment, run=query.validated_data.get("run"),
                                         kind=query.validated_data.get("kind"))
        return Response({"flags": FlagSerializer([flag_data(f, team) for f in flags], many=True).data})
