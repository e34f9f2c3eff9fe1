from django.apps import AppConfig


class EpisodesConfig(AppConfig):
    name = "orsplatform.episodes"
    label = "episodes"
