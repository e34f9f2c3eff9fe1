from django.urls import path

from orsplatform.evals import views

# Mounted at /aap/ (a first segment the ORS surface already reserves for the AAP face).
app_name = "evals"
urlpatterns = [
    path("", views.index, name="index"),
    path("<slug:team>/", views.runs, name="runs"),
    path("<slug:team>/agents/", views.agents, name="agents"),
    path("<slug:team>/agents/<int:agent_id>/ping", views.agent_ping_view, name="agent_ping"),
    path("<slug:team>/agents/<int:agent_id>/remove", views.agent_remove_view, name="agent_remove"),
    path("<slug:team>/runs/<int:run_id>/", views.run, name="run"),
    path("<slug:team>/runs/<int:run_id>/progress.json", views.run_progress, name="run_progress"),
    path("<slug:team>/runs/<int:run_id>/cancel", views.run_cancel, name="run_cancel"),
    path("<slug:team>/runs/<int:run_id>/resume", views.run_resume, name="run_resume"),
    path("<slug:team>/leaderboard/<slug:env_team>/<slug:env_slug>/", views.leaderboard, name="leaderboard"),
]
