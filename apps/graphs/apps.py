from django.apps import AppConfig


class GraphsConfig(AppConfig):
    name = "apps.graphs"
    label = "graphs"
