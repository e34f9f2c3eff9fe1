from django.apps import AppConfig


class RunnersConfig(AppConfig):
    # An installed app for its beat tasks (tasks.py); no models. The label stays "runners" whatever
    # the package is called, so a rename of the package needs no migration and no new names.
    name = "orsplatform.executors"
    label = "runners"
    default_auto_field = "django.db.models.BigAutoField"
