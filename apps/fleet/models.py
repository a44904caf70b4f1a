"""The fleet as ops see it: pools of like GPUs and the workers in them."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class WorkerState(models.TextChoices):
    ONLINE = "online"
    DRAINING = "draining"
    OFFLINE = "offline"


class WorkerPool(models.Model):
    """A set of workers on one GPU type serving the same capability queues."""

    name = models.CharField(max_length=100, unique=True)
    gpu_type = models.CharField(max_length=100, blank=True, help_text="e.g. H200, RTX 4090, cpu")
    gpus_per_worker = models.PositiveIntegerField(default=1)
    vram_gb = models.FloatField(default=0)
    nvlink = models.BooleanField(default=False)
    queues = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True)

    def __str__(self) -> str:
        return self.name


class Worker(models.Model):
    """One Celery worker process (one GPU or GPU group), as last reported by its heartbeat."""

    name = models.CharField(max_length=200, unique=True, help_text="The Celery node name.")
    pool = models.ForeignKey(WorkerPool, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="workers")
    hostname = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=WorkerState.choices,
                             default=WorkerState.ONLINE)
    queues = models.JSONField(default=list, blank=True)
    node_types = models.JSONField(default=list, blank=True)
    model_files = models.JSONField(default=list, blank=True, help_text="Model files it holds.")
    device = models.JSONField(default=dict, blank=True, help_text="Profile, GPU, VRAM.")
    current_run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    incarnation = models.CharField(
        max_length=32, blank=True,
        help_text="Random per process start: a restarted worker with the same name is a new one.",
    )
    slots = models.PositiveIntegerField(default=1, help_text="Runs it executes at once.")
    running = models.JSONField(default=list, blank=True, help_text="Ids of the runs it holds.")
    stats = models.JSONField(default=dict, blank=True,
                             help_text="Counters it reports: forwards, batch sizes, runs done.")
    started_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=WorkerState.values),
                                   name="worker_state_known"),
        ]

    def __str__(self) -> str:
        return self.name
