from __future__ import annotations

from rest_framework import serializers


class SplitSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.CharField()
    num_tasks = serializers.IntegerField()


class EnvironmentSerializer(serializers.Serializer):
    name = serializers.CharField(source="full_name")
    description = serializers.CharField()
    visibility = serializers.CharField()
    current_version = serializers.IntegerField(source="current_version.number", allow_null=True)


class EnvironmentDetailSerializer(EnvironmentSerializer):
    # While the first version builds, or after it failed, nothing is current: no tools are served.
    tools = serializers.SerializerMethodField(help_text="The current version's tools; [] while no version "
                                                        "is current (the first one building, or failed).")
    splits = SplitSerializer(many=True, source="task_splits.all")
    versions = serializers.SerializerMethodField()

    def get_tools(self, env) -> list[dict]:
        return env.current_version.tools if env.current_version is not None else []

    def get_versions(self, env) -> list[dict]:
        return [{"number": v.number, "status": v.status, "content_hash": v.content_hash, "created_at": v.created_at}
                for v in env.versions.order_by("-number")]


class SessionSerializer(serializers.Serializer):
    sid = serializers.CharField()
    environment = serializers.CharField(source="environment.full_name")
    version = serializers.IntegerField(source="version.number")
    status = serializers.CharField()
    protocol = serializers.CharField()
    split = serializers.CharField()
    task_index = serializers.IntegerField(allow_null=True)
    sealed = serializers.BooleanField(help_text="Run on a sealed split (docs/hidden-tasks.md).")
    created_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)
    calls = serializers.IntegerField()
    total_reward = serializers.FloatField(allow_null=True)
    finished = serializers.BooleanField()


class ToolCallSerializer(serializers.Serializer):
    task_id = serializers.CharField()
    name = serializers.CharField()
    input = serializers.JSONField()
    status = serializers.CharField()
    output = serializers.JSONField()
    reward = serializers.FloatField(allow_null=True)
    finished = serializers.BooleanField()
    error = serializers.CharField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class SessionDetailSerializer(SessionSerializer):
    task_spec = serializers.JSONField()
    error = serializers.CharField()
