"""Admin for ops: pools and workers — see, drain, resume, and what each holds and runs."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.fleet.models import Worker, WorkerPool
from apps.fleet.services import worker_drain, worker_resume


class WorkerInline(admin.TabularInline):
    model = Worker
    fields = ("name", "state", "queues", "current_run", "last_heartbeat")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(WorkerPool)
class WorkerPoolAdmin(admin.ModelAdmin):
    list_display = ("name", "gpu_type", "gpus_per_worker", "vram_gb", "nvlink")
    inlines = (WorkerInline,)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("name", "pool", "state", "queues", "current_run", "last_heartbeat")
    list_filter = ("state", "pool")
    readonly_fields = ("name", "hostname", "pid", "queues", "node_types", "model_files", "device",
                       "current_run", "started_at", "last_heartbeat")
    actions = ("drain", "resume")

    @admin.action(description="Drain (finish current run, take no new ones)")
    def drain(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        n = sum(worker_drain(worker=w) for w in queryset)
        self.message_user(request, f"draining {n} worker(s)", messages.SUCCESS)

    @admin.action(description="Resume")
    def resume(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        n = sum(worker_resume(worker=w) for w in queryset)
        self.message_user(request, f"resumed {n} worker(s)", messages.SUCCESS)
