from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from orsplatform import views

urlpatterns = [
    path("", views.home, name="home"),
    path("ready", views.ready, name="ready"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/dev-login/<str:uidb64>/<str:token>/", views.dev_login, name="dev_login"),
    path("environments/", include("orsplatform.hub.urls")),
    path("console/", include("orsplatform.console.urls")),
    path("analytics/", include("orsplatform.analytics.urls")),
    path("aap/", include("orsplatform.evals.urls")),
    path("api/", include("orsplatform.api.urls")),
    path("v1/", include("orsplatform.runs.urls")),  # the openreward client's Rollout API
    path("admin/", admin.site.urls),
]
