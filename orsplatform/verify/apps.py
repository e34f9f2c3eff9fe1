from django.apps import AppConfig


class VerifyConfig(AppConfig):
    name = "orsplatform.verify"
    label = "verify"
