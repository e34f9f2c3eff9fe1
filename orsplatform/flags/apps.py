from django.apps import AppConfig


class FlagsConfig(AppConfig):
    name = "orsplatform.flags"
    label = "flags"
