from django.contrib import admin

from orsplatform.teams.models import ApiKey, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "max_open_sessions", "max_tool_calls_per_second", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "team", "scopes", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_filter = ("team",)
    # The hash is not a secret, but there is nothing useful to edit in it either.
    readonly_fields = ("prefix", "secret_hash", "last_used_at", "created_at")
