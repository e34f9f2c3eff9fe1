from django.apps import AppConfig


class HubConfig(AppConfig):
    name = "orsplatform.hub"
    label = "hub"
    verbose_name = "Environment hub"
