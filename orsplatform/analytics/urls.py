from django.urls import path

from orsplatform.analytics import run_views, views

app_name = "analytics"
urlpatterns = [
    path("", views.index, name="index"),
    path("<slug:team>/", views.overview, name="overview"),
    path("<slug:team>/environments/<slug:env_team>/<slug:env_slug>/", views.environment, name="environment"),
    path("<slug:team>/sessions/", views.sessions, name="sessions"),
    path("<slug:team>/sessions/<str:sid>/", views.session_detail, name="session"),
    path("<slug:team>/runs/", run_views.runs_list, name="runs"),
    path("<slug:team>/runs/view/", run_views.run_page, name="run"),
    path("<slug:team>/runs/episodes/", run_views.run_episodes, name="run_episodes"),
    path("<slug:team>/rollouts/<str:ref>/", run_views.rollout_detail, name="rollout"),
    path("<slug:team>/export.jsonl", views.export_jsonl, name="export_jsonl"),
    path("<slug:team>/export.parquet", views.export_parquet, name="export_parquet"),
]
