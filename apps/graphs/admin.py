"""Admin for stored graphs (read-only: they are content-addressed)."""

from django.contrib import admin

from apps.graphs.models import Graph


@admin.register(Graph)
class GraphAdmin(admin.ModelAdmin):
    list_display = ("sha256", "created_at")
    search_fields = ("sha256",)
    readonly_fields = ("sha256", "document", "created_at")
