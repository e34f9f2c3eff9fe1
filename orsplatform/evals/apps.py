from django.apps import AppConfig


class EvalsConfig(AppConfig):
    name = "orsplatform.evals"
    label = "evals"
    verbose_name = "Evaluations of AAP agents"
