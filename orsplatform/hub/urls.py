from django.urls import path

from orsplatform.hub import views

app_name = "hub"
urlpatterns = [
    path("", views.catalog, name="catalog"),
    path("<slug:team>/<slug:env>/", views.environment, name="environment"),
    path("<slug:team>/<slug:env>/tasks/", views.tasks, name="tasks"),
    path("<slug:team>/<slug:env>/tasks/<str:split>/<int:index>/", views.task, name="task"),
    path("<slug:team>/<slug:env>/tasks/<str:split>/<int:index>/prompt", views.task_prompt, name="task_prompt"),
    path("<slug:team>/<slug:env>/versions/", views.versions, name="versions"),
    path("<slug:team>/<slug:env>/files/", views.files, name="files"),
    path("<slug:team>/<slug:env>/versions/<int:number>/files/", views.files, name="version_files"),
    path("<slug:team>/<slug:env>/versions/<int:number>/files/<path:path>", views.version_file, name="version_file"),
    path("<slug:team>/<slug:env>/diff/", views.diff, name="diff"),
]
