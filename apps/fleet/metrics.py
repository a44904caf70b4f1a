"""`GET /metrics`: the farm in Prometheus' text format, read from PostgreSQL at scrape time.

Every number comes from a few aggregate queries, none a walk over the run table in Python:

- runs by status and queue (one GROUP BY on the `status, queue` index), queue depth and oldest
  queued age per queue (the queued runs' partial index);
- live workers, slots and busy slots per pool, batch sizes and GPU memory per worker: from the
  workers' last heartbeats (`Worker.stats`, `Worker.device["gpu"]`), a row per worker;
- dispatch latency (a run's commit → its first claim), run duration and step time: the runs
  seen in the tail of the event log (`RECENT_EVENTS` newest events, at most `RECENT_SECONDS`
  old, bounded by the event id index), as gauge histograms — the distribution of the recent
  past, which `histogram_quantile()` reads like any histogram;
- events written to the run logs (each one is published to its websockets): the log's id
  sequence, a counter.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import connection
from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from apps.fleet.models import Worker
from apps.fleet.selectors import workers_live
from apps.runs.models import Run, RunStatus

RECENT_EVENTS = 50_000
RECENT_SECONDS = 600
GB = 2**30

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


# --- Reads shared with /v1/health?detail=1 ----------------------------------------------------


def queue_overview() -> dict[str, dict[str, Any]]:
    """Per queue: queued runs, the oldest one's age in seconds, running runs, and the live
    workers (not draining) serving it. Every queue a live worker serves is listed."""
    now = timezone.now()
    rows = (Run.objects.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING))
            .values("queue")
            .annotate(queued=Count("pk", filter=Q(status=RunStatus.QUEUED)),
                      running=Count("pk", filter=Q(status=RunStatus.RUNNING)),
                      oldest=Min("created_at", filter=Q(status=RunStatus.QUEUED))))
    queues: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"queued": 0, "oldestQueuedSeconds": 0.0, "running": 0, "workers": 0})
    for row in rows:
        age = (now - row["oldest"]).total_seconds() if row["oldest"] else 0.0
        queues[row["queue"]].update(queued=row["queued"], running=row["running"],
                                    oldestQueuedSeconds=round(max(0.0, age), 3))
    for worker_queues in workers_live().filter(state="online").values_list("queues", flat=True):
        for queue in worker_queues:
            queues[queue]["workers"] += 1
    return dict(sorted(queues.items()))


# --- The collector ----------------------------------------------------------------------------


class FarmCollector(Collector):
    """Reads the farm's state at each `collect()` (one scrape)."""

    def collect(self) -> Iterator[Metric]:
        yield from _runs()
        yield from _queues()
        yield from _workers(list(workers_live().select_related("pool")))
        yield from _recent()
        yield _events()


def metrics_text() -> bytes:
    """The whole exposition (text format 0.0.4)."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FarmCollector())
    return generate_latest(registry)


def _runs() -> Iterator[Metric]:
    runs = GaugeMetricFamily("inline_runs", "Runs by status and queue.", labels=["status", "queue"])
    rows = Run.objects.order_by().values("status", "queue").annotate(n=Count("pk"))
    for row in rows:
        runs.add_metric([row["status"], row["queue"]], row["n"])
    yield runs


def _queues() -> Iterator[Metric]:
    depth = GaugeMetricFamily("inline_queue_depth", "Queued runs per queue.", labels=["queue"])
    oldest = GaugeMetricFamily("inline_queue_oldest_seconds",
                               "Age of the oldest queued run per queue (0: none).", labels=["queue"])
    workers = GaugeMetricFamily("inline_queue_workers", "Live workers serving each queue.",
                                labels=["queue"])
    for queue, row in queue_overview().items():
        depth.add_metric([queue], row["queued"])
        oldest.add_metric([queue], row["oldestQueuedSeconds"])
        workers.add_metric([queue], row["workers"])
    yield from (depth, oldest, workers)


def _workers(live: list[Worker]) -> Iterator[Metric]:
    count = GaugeMetricFamily("inline_workers", "Live workers per pool and state.",
                              labels=["pool", "state"])
    slots = GaugeMetricFamily("inline_worker_slots", "Run slots of the live workers per pool.",
                              labels=["pool"])
    busy = GaugeMetricFamily("inline_worker_busy_slots", "Slots executing a run, per pool.",
                             labels=["pool"])
    per_pool: dict[tuple[str, str], int] = defaultdict(int)
    slots_of: dict[str, int] = defaultdict(int)
    busy_of: dict[str, int] = defaultdict(int)
    for worker in live:
        pool = _pool(worker)
        per_pool[(pool, worker.state)] += 1
        slots_of[pool] += int(worker.stats.get("slots") or worker.slots)
        busy_of[pool] += int(worker.stats.get("busy") or 0)
    for (pool, state), n in sorted(per_pool.items()):
        count.add_metric([pool, state], n)
    for pool in sorted(slots_of):
        slots.add_metric([pool], slots_of[pool])
        busy.add_metric([pool], busy_of[pool])
    yield from (count, slots, busy)
    yield from _batch_sizes(live)
    yield from _gpu_memory(live)


def _batch_sizes(live: list[Worker]) -> Iterator[Metric]:
    """How many runs each denoiser forward served, as each worker counted since it started."""
    family = HistogramMetricFamily(
        "inline_batch_size", "Runs per denoiser forward (a worker's counts since its start).",
        labels=["worker", "pool"])
    for worker in live:
        sizes = {int(k): int(v) for k, v in (worker.stats.get("batchSizes") or {}).items()}
        buckets = [(str(b), sum(n for s, n in sizes.items() if s <= b)) for b in BATCH_BUCKETS]
        buckets.append(("+Inf", sum(sizes.values())))
        family.add_metric([worker.name, _pool(worker)], buckets,
                          sum_value=sum(s * n for s, n in sizes.items()))
    yield family


def _gpu_memory(live: list[Worker]) -> Iterator[Metric]:
    """Each GPU worker's card as its last heartbeat read it (NVML; a simulated card's size)."""
    labels = ["worker", "pool", "gpu"]
    total = GaugeMetricFamily("inline_worker_gpu_memory_total_bytes", "GPU memory of the card.",
                              labels=labels)
    used = GaugeMetricFamily("inline_worker_gpu_memory_used_bytes", "GPU memory in use.",
                             labels=labels)
    for worker in live:
        gpu = (worker.device or {}).get("gpu")
        if not isinstance(gpu, dict):
            continue
        key = [worker.name, _pool(worker), str(gpu.get("name", ""))]
        total.add_metric(key, float(gpu.get("totalGb") or 0) * GB)
        used.add_metric(key, float(gpu.get("usedGb") or 0) * GB)
    yield from (total, used)


def _pool(worker: Worker) -> str:
    return worker.pool.name if worker.pool else ""


# --- The recent past, from the tail of the event log ------------------------------------------

_TAIL = """
    SELECT e.run_id, e.type, e.payload, e.created_at FROM runs_runevent e
    WHERE e.id > (SELECT coalesce(max(id), 0) FROM runs_runevent) - %(events)s
      AND e.created_at >= now() - make_interval(secs => %(seconds)s)
"""

_DISPATCH = f"""
    WITH tail AS ({_TAIL})
    SELECT r.queue, extract(epoch FROM t.created_at - r.created_at)
    FROM tail t JOIN runs_run r ON r.id = t.run_id
    WHERE t.type = 'status' AND t.payload->>'status' = '{RunStatus.RUNNING}'
      AND coalesce(t.payload->>'attempt', '1') = '1'
"""

_DURATION = f"""
    WITH tail AS ({_TAIL})
    SELECT r.queue, r.status, extract(epoch FROM r.finished_at - r.started_at)
    FROM tail t JOIN runs_run r ON r.id = t.run_id
    WHERE t.type = 'run_done' AND r.started_at IS NOT NULL AND r.finished_at IS NOT NULL
"""

# A node that reported progress steps: its time over its step count (cache hits excluded).
_STEPS = f"""
    WITH tail AS ({_TAIL}),
    steps AS (SELECT run_id, payload->>'nodeId' AS node, max((payload->>'total')::int) AS total
              FROM tail WHERE type = 'progress' GROUP BY 1, 2)
    SELECT t.payload->>'nodeType', (t.payload->>'ms')::float / 1000 / s.total
    FROM tail t JOIN steps s ON s.run_id = t.run_id AND s.node = t.payload->>'nodeId'
    WHERE t.type = 'node_done' AND s.total > 0
      AND coalesce(t.payload->>'cached', 'false') = 'false' AND t.payload ? 'ms'
"""


def _recent() -> Iterator[Metric]:
    window = {"events": RECENT_EVENTS, "seconds": RECENT_SECONDS}
    with connection.cursor() as cursor:
        cursor.execute(_DISPATCH, window)
        dispatch = cursor.fetchall()
        cursor.execute(_DURATION, window)
        duration = cursor.fetchall()
        cursor.execute(_STEPS, window)
        steps = cursor.fetchall()
    yield _gauge_histogram(
        "inline_dispatch_latency_seconds",
        f"Commit → first claim of the runs claimed in the last {RECENT_SECONDS} s.",
        ["queue"], LATENCY_BUCKETS, (((q,), float(v)) for q, v in dispatch))
    yield _gauge_histogram(
        "inline_run_duration_seconds",
        f"Claim → finish of the runs that finished in the last {RECENT_SECONDS} s.",
        ["queue", "status"], DURATION_BUCKETS, (((q, s), float(v)) for q, s, v in duration))
    yield _gauge_histogram(
        "inline_step_seconds",
        f"Time per step of the nodes that reported steps in the last {RECENT_SECONDS} s.",
        ["node_type"], STEP_BUCKETS, (((t,), float(v)) for t, v in steps))


def _gauge_histogram(name: str, doc: str, labels: list[str], bounds: tuple[float, ...],
                     values: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
    grouped: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for key, value in values:
        grouped[key].append(max(0.0, value))
    family = GaugeHistogramMetricFamily(name, doc, labels=labels)
    for key, seen in sorted(grouped.items()):
        buckets = [(str(b), sum(1 for v in seen if v <= b)) for b in bounds]
        family.add_metric(list(key), [*buckets, ("+Inf", len(seen))], gsum_value=sum(seen))
    return family


def _events() -> Metric:
    """The run event log's id sequence: every event appended (ids are never reused)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM runs_runevent")
        (last,) = cursor.fetchone() or (0,)
    family = CounterMetricFamily("inline_run_events",
                                 "Events appended to run logs, each published to its websockets.")
    family.add_metric([], int(last))
    return family
