from django.contrib import admin
from django.urls import path

from orsplatform import views

urlpatterns = [
    path("", views.home, name="home"),
    path("ready", views.ready, name="ready"),
    path("admin/", admin.site.urls),
]
