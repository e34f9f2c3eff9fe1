from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    name = "orsplatform.analytics"
    label = "analytics"
    verbose_name = "Usage and reward analytics"
