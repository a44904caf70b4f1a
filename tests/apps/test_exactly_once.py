"""Exactly once at the hard points, on the real database, through the worker's own services.

A run's attempt writes through three fenced services: `run_events_flush` (events and takes of a
slow node, while the run is still going), `run_finish` (the outcome, the last events and takes)
and `run_hand_back`. The reaper (`runs_reap`) requeues the runs of lost workers. These tests put
an attempt at each hard point — its take is written but the run is not finished; the finish is
committed but the task never returned; it was reaped and someone else holds the run — and check
what Postgres holds afterwards: one take per slot, one `run_done`, and the `run_done` lists it.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from PIL import Image

from apps.fleet.models import Worker
from apps.graphs.models import Graph
from apps.runs.models import Run, RunEvent
from apps.runs.recovery import runs_reap
from apps.runs.services import Claim, run_claim, run_events_flush, run_finish, run_hand_back
from apps.takes.models import Take
from apps.takes.services import TakeDraft, takes_insert
from apps.takes.storage import blob_lock, blob_path

pytestmark = pytest.mark.django_db

# Lease holders are "name#incarnation"; only B is a live worker (A's process is gone).
WORKER_A = "a@host#gone"
WORKER_B = "b@host#live"


@pytest.fixture(autouse=True)
def _farm(settings: Any, tmp_path: Any) -> None:
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"
    settings.INLINE_MAX_ATTEMPTS = 3
    settings.INLINE_LEASE_SECONDS = 600  # only a lost worker (not an expired lease) is reaped here
    Worker.objects.create(name="b@host", incarnation="live", queues=["cpu"], slots=1,
                          last_heartbeat=timezone.now())


def _run() -> Run:
    owner = get_user_model().objects.create(username=f"eo-{uuid.uuid4().hex[:8]}")
    graph = Graph.objects.create(sha256=uuid.uuid4().hex * 2, document={"nodes": {}})
    return Run.objects.create(owner=owner, graph=graph, target="out", queue="cpu")


def _draft(color: tuple[int, int, int], node: str = "out", index: int = 0) -> TakeDraft:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(out, format="PNG")
    return TakeDraft(node_id=node, index=index, data=out.getvalue(), media_type="image/png",
                     width=8, height=8, seed=None, lineage={"nodeType": "image/save"})


def _node_done(node: str = "out", index: int = 0) -> tuple[str, dict[str, Any]]:
    return ("node_done", {"nodeId": node, "nodeType": "image/save", "cached": False,
                          "takeSlots": [[node, index]], "ms": 1.0})


def _claim(run: Run, worker: str) -> Claim:
    claim = run_claim(run_id=str(run.pk), worker=worker)
    assert claim is not None, f"{worker} could not claim {run.pk}"
    return claim


def _log(run: Run) -> list[tuple[int, str, dict[str, Any]]]:
    return list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type",
                                                                              "payload"))


def _sha(draft: TakeDraft) -> str:
    return hashlib.sha256(draft.data).hexdigest()


def test_a_take_written_before_the_worker_was_lost_is_the_run_s_only_take():
    """Attempt 1 writes its take (a slow node's flush), then its worker dies before the finish.
    The reaper requeues the run; attempt 2 renders the same slot again (other bytes here, so we
    can tell which one was kept) and finishes: the slot keeps attempt 1's take, once."""
    run = _run()
    first = _claim(run, WORKER_A)
    kept = run_events_flush(claim=first, events=[_node_done()], takes=[_draft((255, 0, 0))])
    assert kept is not None and set(kept) == {("out", 0)}
    take = Take.objects.get(run=run)

    runs_reap()  # WORKER_A names no live worker
    run.refresh_from_db()
    assert (run.status, run.attempts) == ("queued", 1)

    second = _claim(run, WORKER_B)
    assert second.attempt == 2
    again = _draft((0, 0, 255))
    assert run_finish(claim=second, status="succeeded", events=[_node_done()], takes=[again])

    run.refresh_from_db()
    assert (run.status, run.attempts) == ("succeeded", 2)
    takes = list(Take.objects.filter(run=run))
    assert [(t.pk, t.sha256) for t in takes] == [(take.pk, take.sha256)]
    assert take.sha256 == _sha(_draft((255, 0, 0))) != _sha(again)
    log = _log(run)
    done = [payload for _, kind, payload in log if kind == "run_done"]
    assert len(done) == 1 and log[-1][1] == "run_done"
    assert [t["id"] for t in done[0]["takes"]] == [str(take.pk)]
    # Both attempts' node_done name the one take; the seqs are 1, 2, 3… with no gap.
    named = [[t["id"] for t in p["takes"]] for _, kind, p in log if kind == "node_done"]
    assert named == [[str(take.pk)], [str(take.pk)]]
    assert [seq for seq, _, _ in log] == list(range(1, len(log) + 1))


def test_a_retried_attempt_s_flush_of_a_filled_slot_answers_the_take_already_kept():
    run = _run()
    first = _claim(run, WORKER_A)
    run_events_flush(claim=first, events=[_node_done()], takes=[_draft((1, 2, 3))])
    runs_reap()
    second = _claim(run, WORKER_B)
    kept = run_events_flush(claim=second, events=[_node_done()], takes=[_draft((4, 5, 6))])
    assert kept is not None
    assert kept[("out", 0)]["id"] == str(Take.objects.get(run=run).pk)
    assert kept[("out", 0)]["sha256"] == _sha(_draft((1, 2, 3)))
    assert Take.objects.filter(run=run).count() == 1


def test_after_the_finish_commits_a_duplicate_delivery_and_the_reaper_change_nothing():
    """The worker committed its finish and died before its task returned (so the broker may
    deliver the run id again, and the lease names a dead worker): nothing is written again."""
    run = _run()
    claim = _claim(run, WORKER_A)
    assert run_finish(claim=claim, status="succeeded", events=[_node_done()],
                      takes=[_draft((9, 9, 9))])
    before = (_log(run), list(Take.objects.filter(run=run).values_list("pk", flat=True)))
    run.refresh_from_db()
    state = (run.status, run.attempts, run.lease_worker, run.finished_at, run.last_seq)

    assert run_claim(run_id=str(run.pk), worker=WORKER_B) is None  # the duplicate delivery
    runs_reap()  # its lease holder is dead, but the run is finished: left alone
    # The dead worker's own retry of the finish (its commit's answer was lost) is refused too.
    assert run_finish(claim=claim, status="succeeded", events=[_node_done()],
                      takes=[_draft((8, 8, 8))]) is False
    assert run_hand_back(run_id=str(run.pk), attempt=claim.attempt, reason="late") is False

    run.refresh_from_db()
    assert (run.status, run.attempts, run.lease_worker, run.finished_at, run.last_seq) == state
    assert (_log(run), list(Take.objects.filter(run=run).values_list("pk", flat=True))) == before
    assert [kind for _, kind, _ in before[0]].count("run_done") == 1


def test_a_stale_attempt_writes_nothing_once_the_run_was_requeued_and_claimed_again():
    run = _run()
    stale = _claim(run, WORKER_A)
    runs_reap()
    current = _claim(run, WORKER_B)
    log = _log(run)

    # The stale attempt wakes up: a slow node's flush (with a take of another slot), its finish
    # and a hand-back are all fenced by its attempt number.
    assert run_events_flush(claim=stale, events=[_node_done("other")],
                            takes=[_draft((7, 7, 7), node="other")]) is None
    assert run_finish(claim=stale, status="succeeded", events=[_node_done()],
                      takes=[_draft((6, 6, 6))]) is False
    assert not blob_path(_sha(_draft((6, 6, 6)))).exists()  # no bytes kept by nothing
    assert not list(blob_path(_sha(_draft((6, 6, 6)))).parent.glob(".tmp-*"))  # none staged
    assert run_finish(claim=stale, status="failed",
                      error={"code": "node_failed", "message": "x", "nodeId": "out"}) is False
    assert run_hand_back(run_id=str(run.pk), attempt=stale.attempt, reason="stale") is False
    run.refresh_from_db()
    assert (run.status, run.attempts, run.lease_worker) == ("running", 2, WORKER_B)
    assert _log(run) == log and not Take.objects.filter(run=run).exists()

    assert run_finish(claim=current, status="succeeded", events=[_node_done()],
                      takes=[_draft((5, 5, 5))])
    take = Take.objects.get(run=run)
    assert take.sha256 == _sha(_draft((5, 5, 5)))
    done = [p for _, kind, p in _log(run) if kind == "run_done"]
    assert len(done) == 1 and [t["id"] for t in done[0]["takes"]] == [str(take.pk)]


def test_progress_flushes_are_fenced_numbered_in_order_and_one_statement_each():
    """A flush without takes (progress, a node without takes) is one statement outside any
    transaction block: the seq bump and the rows go in together, and a stale attempt writes
    nothing."""
    run = _run()
    stale = _claim(run, WORKER_A)
    runs_reap()
    current = _claim(run, WORKER_B)
    before = _log(run)

    progress = [("progress", {"nodeId": "s", "step": i, "total": 3}) for i in (1, 2, 3)]
    assert run_events_flush(claim=stale, events=progress) is None
    assert _log(run) == before

    with CaptureQueriesContext(connection) as queries:
        assert run_events_flush(claim=current, events=progress) == {}
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert run_events_flush(claim=current, events=[
        ("node_done", {"nodeId": "s", "nodeType": "x", "cached": False, "takeSlots": []})]) == {}
    log = _log(run)
    last = before[-1][0]
    assert [(seq, kind) for seq, kind, _ in log[len(before):]] == [
        (last + 1, "progress"), (last + 2, "progress"), (last + 3, "progress"),
        (last + 4, "node_done")]
    assert [p["step"] for _, kind, p in log if kind == "progress"] == [1, 2, 3]
    assert log[-1][2] == {"nodeId": "s", "nodeType": "x", "cached": False, "takes": []}
    run.refresh_from_db()
    assert run.last_seq == last + 4


def test_a_stale_attempt_of_a_run_that_then_failed_for_good_writes_nothing():
    """Past INLINE_MAX_ATTEMPTS the reaper fails the run with its run_done; the last attempt,
    still running somewhere, finds nothing to finish."""
    run = _run()
    claims = []
    for _ in range(3):
        claims.append(_claim(run, WORKER_A))
        runs_reap()
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "worker_lost")
    log = _log(run)
    assert run_finish(claim=claims[-1], status="succeeded", events=[_node_done()],
                      takes=[_draft((4, 4, 4))]) is False
    assert _log(run) == log and not Take.objects.filter(run=run).exists()
    assert [kind for _, kind, _ in log].count("run_done") == 1


def test_takes_insert_returns_only_the_takes_it_inserted_never_a_filled_slot() -> None:
    run = _run()
    first = takes_insert(run_id=run.pk, owner_id=run.owner_id, drafts=[_draft((1, 2, 3))],
                         fresh=True)
    assert [t.node_id for t in first] == ["out"]
    # The same slot again (as if filled between a caller's look and its insert): kept once.
    again = takes_insert(run_id=run.pk, owner_id=run.owner_id,
                         drafts=[_draft((9, 9, 9)), _draft((4, 5, 6), index=1)], fresh=True)
    assert [(t.node_id, t.index) for t in again] == [("out", 1)]
    kept = Take.objects.get(run=run, node_id="out", index=0)
    assert kept.pk == first[0].pk and kept.sha256 == first[0].sha256


@pytest.mark.django_db(transaction=True)
def test_a_finish_stores_its_bytes_again_when_retention_removed_them_while_it_waited():
    """A finish writes its takes' bytes under their blob locks (apps/runs/services/attempts.py
    `run_finish`, `takes_insert`); bytes already on disk are not written again. Here they are
    on disk, but retention holds their blob's lock (its reference check done) and deletes them
    before the finish gets the lock: the finish, holding it now, stores them again, so its take
    never names missing bytes."""
    old = _draft((3, 1, 4))
    first = _run()
    assert run_finish(claim=_claim(first, WORKER_B), status="succeeded", events=[_node_done()],
                      takes=[old])
    path = blob_path(_sha(old))
    assert path.exists()
    run = _run()
    claim = _claim(run, WORKER_B)
    locked, finished = threading.Event(), []

    def retention() -> None:  # take_remove's steps for these bytes, paused at the lock
        try:
            with transaction.atomic():
                blob_lock(_sha(old), shared=False)
                locked.set()
                _until_someone_waits_for_a_blob_lock()
                time.sleep(0.3)  # the finish has looked at the disk by now: the bytes were there
                path.unlink()
        finally:
            connections.close_all()

    def finish() -> None:
        try:
            finished.append(run_finish(claim=claim, status="succeeded", events=[_node_done()],
                                       takes=[_draft((3, 1, 4))]))
        finally:
            connections.close_all()

    remover = threading.Thread(target=retention)
    remover.start()
    assert locked.wait(10)
    finisher = threading.Thread(target=finish)
    finisher.start()
    remover.join(20)
    finisher.join(20)
    assert finished == [True]
    assert Take.objects.get(run=run).sha256 == _sha(old)
    assert path.read_bytes() == old.data
    assert not list(path.parent.glob(".tmp-*"))


def _until_someone_waits_for_a_blob_lock() -> None:
    from apps.takes.storage import BLOB_LOCK_SPACE

    deadline = time.monotonic() + 10
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                           "AND classid = %s AND NOT granted", [BLOB_LOCK_SPACE])
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the finish never waited for the blob's lock")
