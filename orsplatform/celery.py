"""The Celery application: platform tasks (ingest, rollups, reaping) and, with ORS_EXECUTOR=celery,
runner nodes. On the embedded default there is no broker and tasks run eagerly in-process."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")

app = Celery("orsplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def task(name: str):
    """A registered task, by its name. Services queue work this way, so they never import the
    tasks modules, which import them: a task's name is the API between the two."""
    if name not in app.tasks:
        # A web process never starts a worker, which is what imports the apps' tasks modules.
        app.loader.import_default_modules()
    return app.tasks[name]
