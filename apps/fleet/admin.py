"""Admin for ops: pools and workers — see, drain, resume, and what each holds and runs.

A worker row is what its heartbeat reported: nobody adds or edits one here. Drain and resume
(the changelist actions, the buttons on a worker's page, the pool actions) are the only ways to
change a worker's state. Pools are configuration ops own, so they stay editable.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.fleet.families import worker_families
from apps.fleet.models import Worker, WorkerPool
from apps.fleet.services import worker_drain, worker_resume
from inline_farm.admin_display import ViewOnlyAdmin, age, badge, pretty_json, short_id


class WorkerColumns:
    """The worker columns the pool's inline and the worker pages both show."""

    @admin.display(description="state", ordering="state")
    def state_badge(self, worker: Worker) -> SafeString:
        return badge(worker.state)

    @admin.display(description="slots in use")
    def slots_used(self, worker: Worker) -> str:
        return _slots_used(worker)

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(worker.queues) or "—"

    @admin.display(description="heartbeat", ordering="last_heartbeat")
    def heartbeat_age(self, worker: Worker) -> str:
        return age(worker.last_heartbeat)


class WorkerInline(WorkerColumns, admin.TabularInline):
    model = Worker
    fields = ("worker_link", "state_badge", "slots_used", "queue_list", "heartbeat_age")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    @admin.display(description="worker")
    def worker_link(self, worker: Worker) -> SafeString:
        return format_html('<a href="{}">{}</a>',
                           reverse("admin:fleet_worker_change", args=[worker.pk]), worker.name)



@admin.register(WorkerPool)
class WorkerPoolAdmin(admin.ModelAdmin):
    list_display = ("name", "gpu_type", "gpus_per_worker", "vram_gb", "nvlink", "worker_count")
    inlines = (WorkerInline,)
    actions = ("drain_pools", "resume_pools")

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerPool]:
        return super().get_queryset(request).prefetch_related("workers")

    @admin.display(description="workers")
    def worker_count(self, pool: WorkerPool) -> int:
        return len(pool.workers.all())

    @admin.action(description="Drain every worker of the selected pools")
    def drain_pools(self, request: HttpRequest, queryset: QuerySet[WorkerPool]) -> None:
        workers = Worker.objects.filter(pool__in=queryset)
        n = sum(worker_drain(worker=w) for w in workers)
        self.message_user(request, f"draining {n} worker(s)", messages.SUCCESS)

    @admin.action(description="Resume every worker of the selected pools")
    def resume_pools(self, request: HttpRequest, queryset: QuerySet[WorkerPool]) -> None:
        workers = Worker.objects.filter(pool__in=queryset)
        n = sum(worker_resume(worker=w) for w in workers)
        self.message_user(request, f"resumed {n} worker(s)", messages.SUCCESS)


@admin.register(Worker)
class WorkerAdmin(WorkerColumns, ViewOnlyAdmin):
    list_display = ("name", "pool", "state_badge", "slots_used", "queue_list", "model_count",
                    "family_list", "heartbeat_age")
    list_filter = ("state", "pool")
    search_fields = ("name", "hostname")
    actions = ("drain", "resume")
    fieldsets = (
        ("State", {"fields": ("state_badge", "pool", "heartbeat_age", "last_heartbeat",
                              "started_at", "hostname", "pid", "incarnation")}),
        ("Work", {"fields": ("slots_used", "running_runs", "queue_list", "stats_pretty")}),
        ("Holds", {"fields": ("family_list", "models_held", "device_pretty", "node_type_list")}),
    )
    readonly_fields = ("state_badge", "pool", "heartbeat_age", "last_heartbeat", "started_at",
                       "hostname", "pid", "incarnation", "slots_used", "running_runs",
                       "queue_list", "stats_pretty", "family_list", "models_held",
                       "device_pretty", "node_type_list")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        return super().get_queryset(request).select_related("pool")

    def has_drain_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("fleet.change_worker")

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context = {**(extra_context or {}), "can_drain": self.has_drain_permission(request)}
        return super().change_view(request, object_id, form_url, context)

    @admin.display(description="models")
    def model_count(self, worker: Worker) -> int:
        return len(worker.model_files)

    @admin.display(description="families")
    def family_list(self, worker: Worker) -> str:
        return ", ".join(worker_families(worker.model_files)) or "none"


    @admin.display(description="current runs")
    def running_runs(self, worker: Worker) -> SafeString | str:
        run_ids = [str(r) for r in worker.running or []]
        if not run_ids:
            return "idle"
        return format_html_join(
            ", ", '<a href="{}" title="{}">{}</a>',
            ((reverse("admin:runs_run_change", args=[r]), r, short_id(r)) for r in run_ids),
        )

    @admin.display(description="models held")
    def models_held(self, worker: Worker) -> SafeString | str:
        files = [f for f in worker.model_files if isinstance(f, dict)]
        if not files:
            return "none"
        rows = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((f.get("folder", ""), f.get("name", ""), f.get("family") or "—",
              f.get("role") or "—", _size(f.get("size"))) for f in files),
        )
        return format_html("<table><tr><th>folder</th><th>file</th><th>family</th><th>role</th>"
                           "<th>size</th></tr>{}</table>",
                           rows)

    @admin.display(description="device")
    def device_pretty(self, worker: Worker) -> SafeString:
        return pretty_json(worker.device)

    @admin.display(description="stats")
    def stats_pretty(self, worker: Worker) -> SafeString:
        return pretty_json(worker.stats)

    @admin.display(description="node types")
    def node_type_list(self, worker: Worker) -> str:
        return ", ".join(worker.node_types) or "—"

    @admin.action(description="Drain (finish current runs, take no new ones)",
                  permissions=["drain"])
    def drain(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        n = sum(worker_drain(worker=w) for w in queryset)
        self.message_user(request, f"draining {n} worker(s)", messages.SUCCESS)

    @admin.action(description="Resume", permissions=["drain"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        n = sum(worker_resume(worker=w) for w in queryset)
        self.message_user(request, f"resumed {n} worker(s)", messages.SUCCESS)

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        extra = [
            path("<int:worker_id>/drain/", view(self.drain_view), name="fleet_worker_drain"),
            path("<int:worker_id>/resume/", view(self.resume_view), name="fleet_worker_resume"),
        ]
        return extra + super().get_urls()

    def drain_view(self, request: HttpRequest, worker_id: int) -> HttpResponse:
        return self._state_view(request, worker_id, worker_drain, "draining")

    def resume_view(self, request: HttpRequest, worker_id: int) -> HttpResponse:
        return self._state_view(request, worker_id, worker_resume, "resumed")

    def _state_view(self, request: HttpRequest, worker_id: int, service: Any,
                    done: str) -> HttpResponse:
        """The buttons on a worker's page: POST only, the drain permission, one service call."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_drain_permission(request):
            return HttpResponse(status=403)
        worker = get_object_or_404(Worker, pk=worker_id)
        if service(worker=worker):
            self.message_user(request, f"{worker.name}: {done}", messages.SUCCESS)
        else:
            self.message_user(request, f"{worker.name} was {worker.state}: nothing changed",
                              messages.WARNING)
        return HttpResponseRedirect(reverse("admin:fleet_worker_change", args=[worker.pk]))


def _slots_used(worker: Worker) -> str:
    return f"{len(worker.running or [])} / {worker.slots}"


def _size(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"
