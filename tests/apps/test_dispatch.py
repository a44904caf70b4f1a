"""The dispatcher's policy: priority, then fair share (fewest running first), then age."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from apps.fleet.models import Worker
from apps.graphs.models import Graph
from apps.runs.dispatch import (
    LOCK_QUEUE_DISPATCH,
    capacity_forget,
    queue_dispatch,
    queue_lock_key,
)
from apps.runs.models import Run
from apps.runs.recovery import runs_dispatch
from apps.runs.services import queue_take_next, run_claim, run_finish
from tests.livefarm import database_url

pytestmark = pytest.mark.django_db


@pytest.fixture
def slots():
    """A live worker serving gpu.24g with `n` slots: the dispatcher fills free slots only."""

    def serve(n: int) -> None:
        Worker.objects.update_or_create(name="gpu0@host", defaults={
            "queues": ["gpu.24g"], "slots": n, "last_heartbeat": timezone.now()})
        capacity_forget()

    yield serve
    capacity_forget()


@pytest.fixture
def make_run():
    graphs = iter(range(1, 10_000))
    User = get_user_model()

    def make(owner: str, *, status: str = "queued", priority: int = 0, age: int = 0) -> Run:
        user, _ = User.objects.get_or_create(username=owner)
        graph = Graph.objects.create(sha256=f"{next(graphs):064x}", document={"nodes": {}})
        extra = {"lease_expires_at": timezone.now() + timedelta(minutes=1)} if status == "running" else {}
        run = Run.objects.create(owner=user, graph=graph, target="out", status=status,
                                 priority=priority, queue="gpu.24g", **extra)
        Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=age))
        return run

    return make


def _marked() -> set:
    """The runs marked published."""
    return set(Run.objects.filter(dispatched_at__isnull=False).values_list("pk", flat=True))


def _published(django_capture_on_commit_callbacks) -> set:
    with django_capture_on_commit_callbacks(execute=False):
        runs_dispatch()
    return _marked()


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_user_with_nothing_running_goes_before_a_busy_user(make_run, slots,
                                                              django_capture_on_commit_callbacks):
    slots(2)  # one busy with the running run, one free
    make_run("busy", status="running")
    busy_old = make_run("busy", age=60)
    idle_a = make_run("idle", age=10)
    make_run("idle", age=5)
    published = _published(django_capture_on_commit_callbacks)
    assert published == {idle_a.pk} and busy_old.pk not in published


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_each_pick_counts_as_running_so_free_slots_go_round_the_owners(
    make_run, slots, django_capture_on_commit_callbacks
):
    slots(3)  # one busy, two free: idle gets one, then both have one running and age decides
    make_run("busy", status="running")
    busy_old = make_run("busy", age=60)
    idle_a = make_run("idle", age=10)
    make_run("idle", age=5)
    assert _published(django_capture_on_commit_callbacks) == {idle_a.pk, busy_old.pk}


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_priority_beats_fair_share_and_age(make_run, slots, django_capture_on_commit_callbacks):
    slots(2)
    make_run("busy", status="running")
    urgent = make_run("busy", priority=50)
    make_run("idle", age=600)
    assert _published(django_capture_on_commit_callbacks) == {urgent.pk}


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_the_free_slots_bound_unclaimed_messages_per_queue(make_run, slots,
                                                           django_capture_on_commit_callbacks):
    slots(2)
    for age in range(5):
        make_run("someone", age=age)
    assert len(_published(django_capture_on_commit_callbacks)) == 2
    assert len(_published(django_capture_on_commit_callbacks)) == 2  # still 2 outstanding


@override_settings(INLINE_DISPATCH_WINDOW=1)
def test_the_window_adds_prefetch_beyond_the_free_slots(make_run, slots,
                                                        django_capture_on_commit_callbacks):
    slots(2)
    for age in range(5):
        make_run("someone", age=age)
    assert len(_published(django_capture_on_commit_callbacks)) == 3


def test_a_queue_nobody_serves_gets_no_messages(make_run, django_capture_on_commit_callbacks):
    capacity_forget()
    make_run("someone")
    assert _published(django_capture_on_commit_callbacks) == set()


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_fair_share_holds_across_many_owners_and_a_deep_queue(
    make_run, slots, django_capture_on_commit_callbacks
):
    slots(4)
    make_run("u0", status="running")
    for user in range(6):
        for age in range(5):
            make_run(f"u{user}", age=100 - age)
    published = Run.objects.filter(pk__in=_published(django_capture_on_commit_callbacks))
    owners = sorted(published.values_list("owner__username", flat=True))
    assert owners == ["u1", "u2", "u3"]  # one each, oldest owners' heads; u0 already runs one


@contextmanager
def _open_elsewhere(
    *statements: tuple[str, list[object]], for_seconds: float | None = None
) -> Iterator[None]:
    """Another session runs `statements` in one transaction and holds it open (its locks, its
    uncommitted writes) until the block ends, or `for_seconds` into the block; then it commits."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(database_url(connection.settings_dict)) as conn:  # commits on exit
            for sql, params in statements:
                conn.execute(sql, params)
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        if for_seconds is not None:
            threading.Timer(for_seconds, done.set).start()
        yield
    finally:
        done.set()
        thread.join()


def _dispatch_lock_held_elsewhere(
    queue: str, *, publishing: object = None, for_seconds: float | None = None
) -> AbstractContextManager[None]:
    """Another session holds `queue`'s dispatch lock in its transaction, as a pass mid-commit
    would, having marked run `publishing` published in it (`_open_elsewhere`)."""
    statements: list[tuple[str, list[object]]] = [
        ("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_QUEUE_DISPATCH, queue_lock_key(queue)])]
    if publishing is not None:
        statements.append(("UPDATE runs_run SET dispatched_at = now() WHERE id = %s",
                           [publishing]))
    return _open_elsewhere(*statements, for_seconds=for_seconds)


@pytest.mark.django_db(transaction=True)
@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_pass_that_waited_for_the_lock_counts_what_the_holder_published(make_run, slots):
    """The pass's order comes from a read without the lock; the marking function counts the
    busy slots again once it holds the lock (migrations/runs/0003), so a pass that committed
    meanwhile is seen and the window is never overfilled."""
    slots(2)  # one taken by a running run, one free
    make_run("c", status="running")
    older, newer = make_run("a", age=20), make_run("b", age=10)
    # another pass, holding the lock, publishes the older run and commits half a second later
    with _dispatch_lock_held_elsewhere("gpu.24g", publishing=older.pk, for_seconds=0.5):
        assert queue_dispatch("gpu.24g") == 0  # it waited, then saw the free slot taken
    newer.refresh_from_db()
    assert newer.dispatched_at is None


@pytest.mark.django_db(transaction=True)
@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_pass_does_not_publish_a_run_a_finishing_slot_took_meanwhile(make_run, slots):
    """A pass reads its candidates without locks; a slot's finish may claim the first of them
    before the pass marks it. The marking function's UPDATE waits for that row and, once the
    finish commits, finds it running: no mark, no message (migrations/runs/0004)."""
    slots(2)  # one slot held by `mine`, one free
    mine = make_run("c", status="running")
    older = make_run("a", age=20)
    make_run("b", age=10)
    # what run_finish(next_run=…) commits, by hand, committed half a second into the pass
    with _open_elsewhere(
        ("UPDATE runs_run SET status = 'succeeded', finished_at = now(), "
         "lease_expires_at = NULL WHERE id = %s", [mine.pk]),
        ("UPDATE runs_run SET status = 'running', attempts = 1, "
         "lease_expires_at = now() + interval '1 minute' WHERE id = %s", [older.pk]),
        for_seconds=0.5,
    ):
        assert queue_dispatch("gpu.24g") == 0  # its one free slot's pick was taken meanwhile
    older.refresh_from_db()
    assert (older.status, older.dispatched_at) == ("running", None)


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_with_every_slot_taken_a_dispatch_takes_no_lock(
    make_run, slots, django_capture_on_commit_callbacks
):
    """A pass after a commit answers a full queue from its unlocked count: with the queue's lock
    held elsewhere (lock_timeout 2 s) it answers 0 at once."""
    slots(1)
    make_run("busy", status="running")
    make_run("someone")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '2s'")
    with _dispatch_lock_held_elsewhere("gpu.24g"), django_capture_on_commit_callbacks(
        execute=False
    ):
        assert queue_dispatch("gpu.24g") == 0
    assert _marked() == set()


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_queue_name_needing_quotes_is_dispatched(make_run, django_capture_on_commit_callbacks):
    """A queue name with a quote and a percent sign (INLINE_WORKER_QUEUES takes any) goes through
    the dispatcher's statements and its marking function as it is."""
    odd = "odd'queue%s"
    Worker.objects.update_or_create(name="odd@host", defaults={
        "queues": [odd], "slots": 1, "last_heartbeat": timezone.now()})
    capacity_forget()
    runs = [make_run("someone", age=age) for age in (2, 1)]
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(queue=odd)
    with django_capture_on_commit_callbacks(execute=False):
        assert queue_dispatch(odd) == 1  # one slot: the older run
    assert _marked() == {runs[0].pk}
    with django_capture_on_commit_callbacks(execute=False):
        assert queue_dispatch(odd) == 0  # its slot is taken by the published run
    capacity_forget()





def _finish_taking_next(run: Run, *, worker: str = "gpu0@host#1", name: str = "gpu0@host"):
    """Claim `run` for `worker`, then finish it as a worker's slot does (workers/attempt.py):
    the finish's transaction may claim the queue's next run for the slot. Returns that claim."""
    claim = run_claim(run_id=str(run.pk), worker=worker)
    assert claim is not None
    taken: list = []

    def next_run(queue: str) -> bool:
        taken.append(queue_take_next(queue, worker=worker, name=name))
        return taken[-1] is not None

    assert run_finish(claim=claim, status="succeeded", next_run=next_run)
    return taken[-1] if taken else None


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_slot_that_finishes_takes_the_next_run_in_the_same_commit(
    make_run, slots, django_capture_on_commit_callbacks
):
    """One run ends and the policy's next starts in one transaction: the slot is never free, so
    no message is published and the other waiting run stays unpublished."""
    slots(1)
    mine = make_run("c", age=30)
    older, newer = make_run("a", age=20), make_run("b", age=10)
    with django_capture_on_commit_callbacks(execute=True):
        kept = _finish_taking_next(mine)
    assert kept is not None and kept.run_id == str(older.pk) and kept.attempt == 1
    for run in (mine, older, newer):
        run.refresh_from_db()
    assert mine.status == "succeeded" and mine.events.filter(type="run_done").count() == 1
    assert (older.status, older.lease_worker, older.dispatched_at) == ("running", "gpu0@host#1", None)
    assert older.events.filter(type="status").count() == 1  # its `running` event, as a claim logs
    assert (newer.status, newer.dispatched_at) == ("queued", None)  # no slot free: no message


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_slot_taking_its_next_run_dispatches_the_other_free_slots_after_commit(
    make_run, slots, django_capture_on_commit_callbacks
):
    slots(3)
    mine = make_run("d", age=40)
    first, second, third = (make_run(owner, age=age) for owner, age in (("a", 30), ("b", 20),
                                                                       ("c", 10)))
    with django_capture_on_commit_callbacks(execute=True):
        kept = _finish_taking_next(mine)
    assert kept is not None and kept.run_id == str(first.pk)
    assert _marked() == {second.pk, third.pk}  # the two slots nobody held


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_draining_worker_takes_no_next_run_and_its_finish_publishes_it(
    make_run, django_capture_on_commit_callbacks
):
    """Drained, a worker's slot takes no new run, even one its own finish would have taken:
    the finish dispatches the queue after commit, for the workers still online."""
    Worker.objects.update_or_create(name="gpu0@host", defaults={
        "queues": ["gpu.24g"], "slots": 1, "last_heartbeat": timezone.now(), "state": "draining"})
    Worker.objects.update_or_create(name="gpu1@host", defaults={
        "queues": ["gpu.24g"], "slots": 1, "last_heartbeat": timezone.now()})
    capacity_forget()
    mine, waiting = make_run("me", age=10), make_run("someone")
    with django_capture_on_commit_callbacks(execute=True):
        assert _finish_taking_next(mine) is None
    waiting.refresh_from_db()
    assert waiting.status == "queued" and waiting.dispatched_at is not None
    capacity_forget()


@pytest.mark.django_db(transaction=True)
@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_next_run_another_transaction_holds_is_skipped_not_waited_for(make_run, slots):
    """The candidate another slot or pass is taking (its row locked in an open transaction) is
    passed over for the next one in the policy's order."""
    slots(1)
    mine = make_run("c", age=30)
    older, newer = make_run("a", age=20), make_run("b", age=10)
    try:
        with _open_elsewhere(("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [older.pk])):
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '2s'")
            kept = _finish_taking_next(mine)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert kept is not None and kept.run_id == str(newer.pk)
    older.refresh_from_db()
    assert older.status == "queued"
