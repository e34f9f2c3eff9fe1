from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "orsplatform.runs"
    label = "runs"
