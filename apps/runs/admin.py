"""Admin for runs: filter by status/owner, read the graph, cancel."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.services import RunNotCancellable, run_cancel


class RunEventInline(admin.TabularInline):
    model = RunEvent
    fields = ("seq", "type", "payload", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("-seq",)
    max_num = 0


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "status", "target", "queue", "priority", "attempts",
                    "created_at", "finished_at", "take_count")
    list_filter = ("status", "queue", ("owner", admin.RelatedOnlyFieldListFilter))
    search_fields = ("id", "client_run_id", "owner__username", "target")
    date_hierarchy = "created_at"
    actions = ("cancel_runs",)
    inlines = (RunEventInline,)
    readonly_fields = [f.name for f in Run._meta.fields] + ["graph_readable", "takes_preview"]
    fields = ("id", "owner", "status", "target", "priority", "queue", "attempts", "lease_worker",
              "lease_expires_at", "client_run_id", "error_code", "error_message", "error_node",
              "created_at", "started_at", "finished_at", "takes_preview", "graph_readable")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        return super().get_queryset(request).select_related("owner", "graph").prefetch_related(
            "takes"
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are submitted over /v1, where they are validated

    @admin.display(description="takes")
    def take_count(self, run: Run) -> int:
        return len(run.takes.all())

    @admin.display(description="graph")
    def graph_readable(self, run: Run) -> str:
        nodes = run.graph.document.get("nodes", {})
        rows = format_html_join(
            "", "<tr><td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((node_id, spec["type"], _inputs(spec), json.dumps(spec.get("params", {})))
             for node_id, spec in nodes.items()),
        )
        return format_html(
            "<table><tr><th>node</th><th>type</th><th>inputs</th><th>params</th></tr>{}</table>"
            "<p>sha256 {}</p>", rows, run.graph.sha256,
        )

    @admin.display(description="takes")
    def takes_preview(self, run: Run) -> str:
        from apps.takes.admin import take_thumbnail

        return format_html_join("", "{} ", ((take_thumbnail(t),) for t in run.takes.all()))

    @admin.action(description="Cancel selected runs")
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        cancelled = 0
        for run in queryset.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING)):
            try:
                run_cancel(run=run)
                cancelled += 1
            except RunNotCancellable:
                pass
        self.message_user(request, f"cancelled {cancelled} run(s)", messages.SUCCESS)


def _inputs(spec: dict[str, Any]) -> str:
    return ", ".join(f"{k} ← {v['node']}.{v['port']}" for k, v in spec.get("inputs", {}).items())
