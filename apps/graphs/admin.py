"""Admin for stored graphs (view-only: they are content-addressed and written by submit)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from apps.graphs.models import Graph
from inline_farm.admin_display import ViewOnlyAdmin, pretty_json


@admin.register(Graph)
class GraphAdmin(ViewOnlyAdmin):
    list_display = ("short_sha", "node_count", "run_count", "created_at")
    search_fields = ("sha256",)
    fields = ("sha256", "created_at", "document_pretty")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Graph]:
        return super().get_queryset(request).annotate(n_runs=Count("runs"))

    @admin.display(description="graph", ordering="sha256")
    def short_sha(self, graph: Graph) -> str:
        return graph.sha256[:12]

    @admin.display(description="nodes")
    def node_count(self, graph: Graph) -> int:
        return len(graph.document.get("nodes", {}))

    @admin.display(description="runs", ordering="n_runs")
    def run_count(self, graph: Graph) -> int:
        return int(getattr(graph, "n_runs", 0))

    @admin.display(description="document")
    def document_pretty(self, graph: Graph) -> SafeString:
        return pretty_json(graph.document)
