from django.apps import AppConfig


class AuditlogConfig(AppConfig):
    name = "orsplatform.auditlog"
    default_auto_field = "django.db.models.BigAutoField"
