from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from orsplatform.api import views

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("v1/environments", views.EnvironmentListView.as_view(), name="api-environments"),
    path("v1/environments/<str:team>/<str:slug>", views.EnvironmentDetailView.as_view(), name="api-environment"),
    path("v1/sessions", views.SessionListView.as_view(), name="api-sessions"),
    path("v1/sessions/<str:sid>", views.SessionDetailView.as_view(), name="api-session"),
]
