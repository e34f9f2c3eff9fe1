"""The Celery application: platform tasks (ingest, rollups, reaping) and, with ORS_EXECUTOR=celery,
runner nodes. On the embedded default there is no broker and tasks run eagerly in-process."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")

app = Celery("orsplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
