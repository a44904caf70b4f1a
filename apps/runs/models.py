"""Runs (one execution of a target's upstream closure) and their durable event log."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# The whole state machine, declared once. Every status change is a compare-and-set on these.
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.QUEUED}
    ),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}
IN_FLIGHT = (RunStatus.QUEUED, RunStatus.RUNNING)
TERMINAL = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class Run(models.Model):
    """One execution of `target`'s upstream closure in `graph`, owned by a user."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    graph = models.ForeignKey("graphs.Graph", on_delete=models.PROTECT, related_name="runs")
    target = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    priority = models.IntegerField(default=0, help_text="Higher runs first (-100..100).")
    # NULL (not ""): "no key", so the partial unique constraint below ignores it.
    client_run_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    requirement = models.JSONField(default=dict, help_text="What the run needs of a worker.")
    queue = models.CharField(max_length=64, default="cpu")
    attempts = models.PositiveIntegerField(default=0)
    lease_worker = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(
        null=True, blank=True, help_text="When a message for this run was last published."
    )
    last_seq = models.PositiveIntegerField(default=0, help_text="seq of the newest RunEvent.")
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    error_node = models.CharField(max_length=200, blank=True)
    shown_values = models.JSONField(
        default=list, blank=True,
        help_text="What the run's value previews (util/preview) showed, written with its finish.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    peak_memory_bytes = models.BigIntegerField(
        null=True, blank=True,
        help_text="The worker's peak memory while the run's last attempt ran (workers/memory.py).")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"]),
            models.Index(fields=["status", "queue", "-priority", "created_at"]),
            models.Index(fields=["status", "lease_expires_at"]),
            # The dispatcher's reads (apps/runs/dispatch.py), each bounded by what it selects,
            # not by how many runs wait: per-owner heads of a queue, the published-but-unclaimed
            # count, running counts per queue / owner / worker.
            models.Index(fields=["queue", "owner", "-priority", "created_at"],
                         condition=Q(status="queued"), name="run_queued_heads"),
            models.Index(fields=["queue", "dispatched_at"], condition=Q(status="queued"),
                         name="run_queued_published"),
            models.Index(fields=["queue"], condition=Q(status="running"), name="run_running_queue"),
            models.Index(fields=["owner"], condition=Q(status="running"), name="run_running_owner"),
            models.Index(fields=["lease_worker"], condition=Q(status="running"),
                         name="run_running_worker"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="run_status_known"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100) & Q(priority__lte=100), name="run_priority_range"
            ),
            models.CheckConstraint(
                condition=~Q(status=RunStatus.RUNNING) | Q(lease_expires_at__isnull=False),
                name="run_running_has_lease",
            ),
            models.CheckConstraint(
                condition=~Q(status__in=TERMINAL) | Q(finished_at__isnull=False),
                name="run_finished_has_time",
            ),
            models.UniqueConstraint(
                fields=["owner", "client_run_id"],
                condition=Q(client_run_id__isnull=False),
                name="run_one_client_run_id_per_owner",
            ),
            models.UniqueConstraint(
                fields=["owner", "graph", "target"],
                condition=Q(status__in=IN_FLIGHT),
                name="run_one_inflight_per_owner_graph_target",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"


class RunEvent(models.Model):
    """One entry of a run's durable event log; `seq` counts 1, 2, 3… per run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=32)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="runevent_seq_unique_per_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="runevent_seq_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class ClientRunKey(models.Model):
    """A client's idempotency key: the same `clientRunId` always answers the same run.

    Kept apart from Run because a submit that was coalesced onto another in-flight run must find
    that run again by its own key, also after the run finished.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="client_keys")
    graph_sha256 = models.CharField(max_length=64)
    target = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="client_run_key_once_per_owner"),
        ]

    def __str__(self) -> str:
        return f"{self.key} → {self.run_id}"
