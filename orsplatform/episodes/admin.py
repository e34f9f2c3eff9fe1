from django.contrib import admin

from orsplatform.episodes.models import Session, ToolCall


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ("sid", "team", "environment", "status", "calls", "total_reward", "finished", "created_at")
    list_filter = ("status", "environment")
    search_fields = ("sid",)


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin):
    list_display = ("task_id", "session", "name", "status", "reward", "finished", "started_at")
    list_filter = ("status", "name")
