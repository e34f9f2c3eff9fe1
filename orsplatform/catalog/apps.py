from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "orsplatform.catalog"
    label = "catalog"
