"""Admin for runs: a readable list, a run page with its graph, takes and event timeline; cancel.

Runs are submitted (and validated) over /v1, so nobody adds or edits one here. A run can be
deleted only while it has no takes (`Take.run` is PROTECT): takes go through retention.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db.models import CharField, Count, F, Func, OuterRef, QuerySet, Subquery, Value
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.fleet.models import Worker
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.services import RunNotCancellable, run_cancel
from inline_farm.admin_display import badge, duration, pretty_json, short_id, when
from inline_farm.ids import is_uuid

EVENTS_PER_PAGE = 50
# A lease names "<worker>#<incarnation>"; the worker row is named "<worker>".
_worker_name = Func(F("lease_worker"), Value("#"), Value(1), function="split_part",
                    output_field=CharField())
MILESTONES = ("status", "node_done", "run_done")  # the log without its progress ticks


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("run_id", "owner", "status_badge", "target", "queue", "worker",
                    "run_duration", "take_count", "created")
    list_display_links = ("run_id",)
    list_filter = ("status", "queue", ("owner", admin.RelatedOnlyFieldListFilter))
    search_fields = ("id", "client_run_id", "owner__username", "target", "lease_worker")
    date_hierarchy = "created_at"
    list_per_page = 50
    actions = ("cancel_runs",)
    fieldsets = (
        ("Run", {"fields": ("id", "owner", "status_badge", "error", "target", "priority", "queue",
                            "attempts", "worker", "lease_expires_at", "client_run_id",
                            "created_at", "started_at", "finished_at", "run_duration")}),
        ("Takes", {"fields": ("takes_preview",)}),
        ("ComfyUI", {"fields": ("comfy_workflow",)}),
        ("Graph", {"fields": ("graph_readable", "requirement_pretty")}),
    )
    readonly_fields = ("id", "owner", "status_badge", "error", "target", "priority", "queue",
                       "attempts", "worker", "lease_expires_at", "client_run_id", "created_at",
                       "started_at", "finished_at", "run_duration", "takes_preview",
                       "graph_readable", "requirement_pretty", "comfy_workflow")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        worker_pk = Worker.objects.filter(name=OuterRef("worker_name")).values("pk")[:1]
        return (super().get_queryset(request).select_related("owner", "graph")
                .annotate(n_takes=Count("takes"), worker_name=_worker_name)
                .annotate(worker_pk=Subquery(worker_pk)))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are submitted over /v1, where they are validated

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # status changes go through run_move (cancel is the action below)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, ...]:
        """A run with takes cannot be deleted (`Take.run` is PROTECT): name the takes in the way."""
        from apps.takes.models import Take

        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        takes = Take.objects.filter(run__in=[run.pk for run in objs]).order_by("created_at")
        if takes.exists():
            perms_needed = set()  # the takes are kept, not deleted: no delete permission involved
            protected = [format_html(
                '<a href="{}">take {}</a> of run {} — takes go only through the retention action',
                reverse("admin:takes_take_change", args=[t.pk]), short_id(t.pk),
                short_id(t.run_id)) for t in takes[:100]]
        return deleted, counts, perms_needed, protected

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context = {**(extra_context or {}), **_timeline(request, object_id)}
        return super().change_view(request, object_id, form_url, context)

    @admin.display(description="run", ordering="id")
    def run_id(self, run: Run) -> str:
        return short_id(run.pk)

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: Run) -> SafeString:
        return badge(run.status)

    @admin.display(description="worker", ordering="lease_worker")
    def worker(self, run: Run) -> SafeString | str:
        if not run.lease_worker:
            return "—"
        name = run.lease_worker.split("#")[0]  # "<worker name>#<incarnation>"
        worker_pk = getattr(run, "worker_pk", None)
        if worker_pk is None:
            return format_html('<span title="{}">{}</span>', run.lease_worker, name)
        return format_html('<a href="{}" title="{}">{}</a>',
                           reverse("admin:fleet_worker_change", args=[worker_pk]),
                           run.lease_worker, name)

    @admin.display(description="created", ordering="created_at")
    def created(self, run: Run) -> str:
        return when(run.created_at)

    @admin.display(description="duration")
    def run_duration(self, run: Run) -> str:
        return duration(run.started_at, run.finished_at)

    @admin.display(description="takes", ordering="n_takes")
    def take_count(self, run: Run) -> int:
        return int(getattr(run, "n_takes", 0))

    @admin.display(description="error")
    def error(self, run: Run) -> SafeString | str:
        if not run.error_code:
            return "—"
        return format_html('<span class="run-error"><b>{}</b>{}: {}</span>', run.error_code,
                           f" at node {run.error_node}" if run.error_node else "",
                           run.error_message)

    @admin.display(description="graph")
    def graph_readable(self, run: Run) -> SafeString:
        nodes = run.graph.document.get("nodes", {})
        rows = format_html_join(
            "", "<tr><td><b>{}</b></td><td>{}</td><td>{}</td><td class='wrap'>{}</td></tr>",
            ((node_id, spec["type"], _inputs(spec), json.dumps(spec.get("params", {})))
             for node_id, spec in nodes.items()),
        )
        return format_html(
            "<table class='graph'><tr><th>node</th><th>type</th><th>inputs</th><th>params</th>"
            "</tr>{}</table><p>target <b>{}</b> · graph sha256 {}</p>", rows, run.target,
            run.graph.sha256,
        )

    @admin.display(description="workflow")
    def comfy_workflow(self, run: Run) -> SafeString | str:
        """The ComfyUI workflow(s) queued as this run through the /comfy/ door, if any."""
        from apps.importer.admin import comfy_prompt_links

        prompts = list(run.comfy_prompts.all()[:5])
        if not prompts:
            return "not queued through ComfyUI"
        return format_html_join(" | ", "{}", ((comfy_prompt_links(p),) for p in prompts))

    @admin.display(description="requirement")
    def requirement_pretty(self, run: Run) -> SafeString:
        return pretty_json(run.requirement)

    @admin.display(description="takes")
    def takes_preview(self, run: Run) -> SafeString | str:
        from apps.takes.admin import take_thumbnail

        takes = list(run.takes.all())
        if not takes:
            return "none yet"
        return format_html_join(" ", "{}", ((take_thumbnail(t, size=128),) for t in takes))

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


def _timeline(request: HttpRequest, run_id: str) -> dict[str, Any]:
    """One page of the run's event log as timeline rows (`?events=milestones` hides progress)."""
    run = Run.objects.filter(pk=run_id).only("created_at").first() if is_uuid(run_id) else None
    if run is None:
        return {}
    events = RunEvent.objects.filter(run_id=run.pk).order_by("seq")
    milestones = request.GET.get("events") == "milestones"
    if milestones:
        events = events.filter(type__in=MILESTONES)
    page = Paginator(events, EVENTS_PER_PAGE).get_page(request.GET.get("events_page"))
    return {
        "timeline": [_timeline_row(e, run.created_at) for e in page],
        "timeline_page": page,
        "timeline_milestones": milestones,
        "timeline_total": RunEvent.objects.filter(run_id=run.pk).count(),
    }


def _timeline_row(event: RunEvent, start: Any) -> dict[str, Any]:
    """What a lead reads in one event: when, what, where, how far, how long, and any error."""
    p = event.payload if isinstance(event.payload, dict) else {}
    preview = p.get("preview")
    error = p.get("error") if isinstance(p.get("error"), dict) else None
    status = p.get("status")
    return {
        "seq": event.seq,
        "at": f"+{(event.created_at - start).total_seconds():.2f} s",
        "type": event.type,
        "node": p.get("nodeId") or (error or {}).get("nodeId") or "",
        "node_type": p.get("nodeType", ""),
        "step": f"{p['step']}/{p['total']}" if "step" in p and "total" in p else "",
        "ms": p.get("ms", ""),
        # Only image data URLs: the payload comes from a worker, not from us.
        "preview": preview if isinstance(preview, str) and preview.startswith("data:image/")
        else "",
        "detail": _event_detail(p, status),
        "takes": [(short_id(t["id"]), reverse("admin:takes_take_change", args=[t["id"]]))
                  for t in p.get("takes", []) if isinstance(t, dict) and t.get("id")]
        if event.type == "node_done" else [],
        "error": error,
        "failed": bool(error) or status == RunStatus.FAILED,
    }


def _event_detail(p: dict[str, Any], status: Any) -> str:
    parts = []
    if status:
        parts.append(str(status))
    if p.get("attempt"):
        parts.append(f"attempt {p['attempt']}")
    if p.get("worker"):
        parts.append(f"on {p['worker']}")
    if p.get("cached"):
        parts.append("cached")
    if p.get("reason"):
        parts.append(str(p["reason"]))
    return " · ".join(parts)
