from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "orsplatform.teams"
    label = "teams"
