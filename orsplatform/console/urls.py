from django.urls import path

from orsplatform.console import builds, environments, views

app_name = "console"
urlpatterns = [
    path("", views.team_list, name="teams"),
    # Operators' storage page; no trailing slash, so no team slug can take it.
    path("storage", views.storage, name="storage"),
    path("<slug:slug>/", views.team_detail, name="team"),
    path("<slug:slug>/keys/<str:prefix>/revoke", views.api_key_revoke_view, name="revoke_key"),
    # Publishing (orsplatform/console/environments.py). No trailing slash on "environments": with one it
    # would be taken for a team called "environments".
    path("environments", environments.environments_home, name="environments_home"),
    path("<slug:slug>/environments/", environments.environments, name="environments"),
    path("<slug:slug>/environments/publish", environments.package_upload, name="publish"),
    path("<slug:slug>/environments/tasks", environments.tasks_upload, name="upload_tasks"),
    path("<slug:slug>/environments/<slug:env>/delete", environments.environment_delete_view,
         name="environment_delete"),
    path("<slug:slug>/environments/<slug:env>/rollback", environments.version_rollback, name="rollback"),
    path("<slug:slug>/environments/<slug:env>/splits/<str:split>/protection", environments.split_protection,
         name="split_protection"),
    path("<slug:slug>/environments/<slug:env>/versions/<int:number>/build", builds.version_build,
         name="version_build"),
    path("<slug:slug>/environments/<slug:env>/versions/<int:number>/build.json", builds.version_build_json,
         name="version_build_json"),
    path("<slug:slug>/environments/<slug:env>/versions/<int:number>/", builds.version_build, name="version"),
    path("<slug:slug>/environments/<slug:env>/versions/<int:number>/confirm", builds.version_confirm,
         name="version_confirm"),
    path("<slug:slug>/environments/<slug:env>/verify-settings", builds.verify_settings, name="verify_settings"),
    path("<slug:slug>/ingest/<int:job_id>/", environments.ingest_job, name="ingest_job"),
    path("<slug:slug>/ingest/<int:job_id>.json", environments.ingest_job_json, name="ingest_job_json"),
]
