from django.urls import path

from orsplatform.console import views

app_name = "console"
urlpatterns = [
    path("", views.team_list, name="teams"),
    path("<slug:slug>/", views.team_detail, name="team"),
    path("<slug:slug>/keys/<str:prefix>/revoke", views.api_key_revoke_view, name="revoke_key"),
]
