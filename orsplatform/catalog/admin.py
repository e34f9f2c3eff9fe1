from django.contrib import admin

from orsplatform.catalog.models import Environment, EnvironmentVersion, IngestJob, Split


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("slug", "team", "visibility", "current_version", "created_at")
    list_filter = ("visibility", "team")


@admin.register(EnvironmentVersion)
class EnvironmentVersionAdmin(admin.ModelAdmin):
    list_display = ("environment", "number", "status", "content_hash", "created_at")
    readonly_fields = ("content_hash", "tools", "splits", "manifest")


@admin.register(Split)
class SplitAdmin(admin.ModelAdmin):
    list_display = ("environment", "name", "type", "num_tasks")


@admin.register(IngestJob)
class IngestJobAdmin(admin.ModelAdmin):
    list_display = ("id", "environment", "split_name", "mode", "status", "rows_done", "created_at")
    list_filter = ("status", "mode")
