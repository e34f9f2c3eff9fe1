from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from orsplatform.api import analytics, catalog, evals, flags, retention, runs, verification, views

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script from a URL, so the page needs no inline script (CSP).
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("v1/environments", views.EnvironmentListView.as_view(), name="api-environments"),
    path("v1/environments/<str:team>/<str:slug>", views.EnvironmentDetailView.as_view(), name="api-environment"),
    path("v1/sessions", views.SessionListView.as_view(), name="api-sessions"),
    path("v1/sessions/<str:sid>", views.SessionDetailView.as_view(), name="api-session"),
    # Publishing (orsplatform/api/catalog.py)
    path("v1/environments/<str:team>/<str:slug>/versions", catalog.VersionListView.as_view(),
         name="api-versions"),
    path("v1/environments/<str:team>/<str:slug>/versions/<int:number>", catalog.VersionDetailView.as_view(),
         name="api-version"),
    path("v1/environments/<str:team>/<str:slug>/rollback", catalog.RollbackView.as_view(), name="api-rollback"),
    path("v1/environments/<str:team>/<str:slug>/versions/<int:number>/verification",
         verification.VerificationView.as_view(), name="api-verification"),
    path("v1/environments/<str:team>/<str:slug>/versions/<int:number>/confirm",
         verification.VersionConfirmView.as_view(), name="api-version-confirm"),
    path("v1/environments/<str:team>/<str:slug>/verify-settings", verification.VerifySettingsView.as_view(),
         name="api-verify-settings"),
    path("v1/environments/<str:team>/<str:slug>/splits", catalog.SplitListView.as_view(), name="api-splits"),
    path("v1/environments/<str:team>/<str:slug>/splits/<str:split>", catalog.SplitDetailView.as_view(),
         name="api-split"),
    path("v1/environments/<str:team>/<str:slug>/splits/<str:split>/tasks", catalog.SplitTasksView.as_view(),
         name="api-split-tasks"),
    path("v1/ingest-jobs/<int:job_id>", catalog.IngestJobView.as_view(), name="api-ingest-job"),
    # Analytics and export (orsplatform/api/analytics.py)
    path("v1/analytics/overview", analytics.AnalyticsOverviewView.as_view(), name="api-analytics-overview"),
    path("v1/analytics/environments/<str:team>/<str:slug>", analytics.AnalyticsEnvironmentView.as_view(),
         name="api-analytics-environment"),
    path("v1/analytics/sessions", analytics.AnalyticsSessionListView.as_view(), name="api-analytics-sessions"),
    path("v1/analytics/sessions/<str:sid>", analytics.AnalyticsSessionDetailView.as_view(),
         name="api-analytics-session"),
    path("v1/analytics/export.jsonl", analytics.AnalyticsExportJsonlView.as_view(), name="api-analytics-export-jsonl"),
    path("v1/analytics/export.parquet", analytics.AnalyticsExportParquetView.as_view(),
         name="api-analytics-export-parquet"),
    # The team's retention of tool calls (orsplatform/api/retention.py, docs/audit-log.md)
    path("v1/retention", retention.RetentionView.as_view(), name="api-retention"),
    # Evaluations of AAP agents (orsplatform/api/evals.py)
    path("v1/agents", evals.AgentListView.as_view(), name="api-agents"),
    path("v1/agents/<int:agent_id>", evals.AgentDetailView.as_view(), name="api-agent"),
    path("v1/agents/<int:agent_id>/ping", evals.AgentPingView.as_view(), name="api-agent-ping"),
    path("v1/eval-runs", evals.RunListView.as_view(), name="api-eval-runs"),
    path("v1/eval-runs/<int:run_id>", evals.RunDetailView.as_view(), name="api-eval-run"),
    path("v1/eval-runs/<int:run_id>/cancel", evals.RunCancelView.as_view(), name="api-eval-run-cancel"),
    path("v1/eval-runs/<int:run_id>/resume", evals.RunResumeView.as_view(), name="api-eval-run-resume"),
    path("v1/leaderboards/<str:team>/<str:slug>", evals.LeaderboardView.as_view(), name="api-eval-leaderboard"),
    # Training runs (docs/runs.md). A run's name may hold "/": its route is last of the runs/ ones.
    path("v1/flags", flags.FlagListView.as_view(), name="api-flags"),
    path("v1/runs", runs.RunListView.as_view(), name="api-runs"),
    path("v1/runs/<path:name>", runs.RunDetailView.as_view(), name="api-run"),
    path("v1/rollouts/<str:ref>", runs.TrajectoryView.as_view(), name="api-rollout"),
]
