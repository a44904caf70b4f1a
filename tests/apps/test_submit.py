"""A submit (apps/runs/services/submit.py `run_submit`) under its owner's lock: its one race checked
by hand (another submit commits the same new graph document while this one's insert waits), its
coalescing, its asset check, and a dispatch that fails after its commit."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.graphs.models import Graph
from apps.graphs.schema import GraphDoc
from apps.runs.models import Run
from apps.runs.services import run_submit
from apps.runs.services.submit import _run_create_or_find
from tests.livefarm import database_url

pytestmark = pytest.mark.django_db(transaction=True)

REQUIREMENT = {"nodeTypes": ["image/load"], "models": []}


def _graph() -> GraphDoc:
    return GraphDoc.model_validate({"nodes": {"src": {
        "type": "image/load", "params": {"asset": str(uuid.uuid4())}}}})


def _waiting_on_a_transaction(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "transactionid"


def test_a_graph_another_submit_commits_meanwhile_is_used_not_stored_twice() -> None:
    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    graph = _graph()
    sha = graph.sha256()
    other = psycopg.connect(database_url(connection.settings_dict))
    other.execute("INSERT INTO graphs_graph (sha256, document, created_at) "
                  "VALUES (%s, '{}'::jsonb, now())", [sha])  # not committed yet
    result: dict[str, Any] = {}

    def submit() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                result["pid"] = cursor.fetchone()[0]
            result["run"] = _run_create_or_find(owner, graph, sha, "src", None, 0, REQUIREMENT,
                                                "cpu")
        except Exception as exc:  # noqa: BLE001 — reported by the asserts below
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=submit)
    thread.start()
    deadline = time.monotonic() + 30
    while not ("pid" in result and _waiting_on_a_transaction(result["pid"])):
        assert time.monotonic() < deadline and thread.is_alive(), result
        time.sleep(0.02)
    other.commit()  # the submit's insert did nothing, and its snapshot cannot see this row
    thread.join(30)
    other.close()

    assert "error" not in result, result
    run, created = result["run"]
    stored = Graph.objects.get(sha256=sha)
    assert created and Run.objects.get(pk=run.pk).graph_id == stored.pk == run.graph_id
    assert Graph.objects.filter(sha256=sha).count() == 1


def test_a_submit_coalesces_onto_the_same_graph_in_flight() -> None:
    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    graph = _graph()
    first, created = _run_create_or_find(owner, graph, graph.sha256(), "src", None, 0,
                                         REQUIREMENT, "cpu")
    again, created_again = _run_create_or_find(owner, graph, graph.sha256(), "src", None, 0,
                                               REQUIREMENT, "cpu")
    assert created and not created_again and again.pk == first.pk
    stored = Run.objects.get(pk=first.pk)
    assert (stored.status, stored.queue, stored.requirement, stored.owner_id) == (
        "queued", first.queue, REQUIREMENT, owner.pk)
    assert stored.created_at == first.created_at


def _waiting_on(pid: int, event: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == event


def test_a_submit_that_waited_for_the_owners_lock_sees_what_the_holder_committed() -> None:
    """The read after the owner's lock is a statement of its own, so its snapshot is taken
    after the lock was granted: a submit that waits while another transaction of the owner
    holds the lock and inserts the same graph's run coalesces onto that run once it commits. (A
    lock taken inside the read's own statement reads with the snapshot from before the wait:
    it sees no run and its insert breaks the one-in-flight constraint, as this test found.)"""
    from apps.runs.services.submit import LOCK_OWNER_SUBMIT

    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    template, _ = _run_create_or_find(owner, _graph(), _graph().sha256(), "src", None, 0,
                                      REQUIREMENT, "cpu")
    graph = _graph()
    columns = [f.column for f in Run._meta.concrete_fields]
    copied = ", ".join({"id": "%(id)s", "graph_id": "(SELECT id FROM g)"}.get(c, c)
                       for c in columns)
    theirs = uuid.uuid4()
    other = psycopg.connect(database_url(connection.settings_dict))
    other.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_OWNER_SUBMIT, owner.pk])
    other.execute(f"WITH g AS (INSERT INTO graphs_graph (sha256, document, created_at) "
                  f"VALUES (%(sha)s, '{{}}'::jsonb, now()) RETURNING id) "
                  f"INSERT INTO runs_run ({', '.join(columns)}) SELECT {copied} FROM runs_run "
                  f"WHERE id = %(template)s",
                  {"id": theirs, "sha": graph.sha256(), "template": template.pk})  # uncommitted
    result: dict[str, Any] = {}

    def submit() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                result["pid"] = cursor.fetchone()[0]
            result["run"] = _run_create_or_find(owner, graph, graph.sha256(), "src", None, 0,
                                                REQUIREMENT, "cpu")
        except Exception as exc:  # noqa: BLE001 — reported by the asserts below
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=submit)
    thread.start()
    deadline = time.monotonic() + 30
    while not ("pid" in result and _waiting_on(result["pid"], "advisory")):
        assert time.monotonic() < deadline and thread.is_alive(), result
        time.sleep(0.02)
    other.commit()
    thread.join(30)
    other.close()

    assert "error" not in result, result
    run, created = result["run"]
    assert not created and run.pk == theirs
    assert Run.objects.filter(owner=owner).count() == 2  # the template's and theirs, no third


def _asset(owner: Any) -> str:
    from apps.takes.models import Asset

    return str(Asset.objects.create(owner=owner, sha256="0" * 64, media_type="image/png",
                                    size=1).pk)


def _loads(asset: str) -> dict[str, Any]:
    return {"nodes": {"src0": {"type": "image/load", "params": {"asset": asset}}},
            "target": "src0"}


def test_a_submit_checks_its_assets_and_stores_nothing_on_a_miss() -> None:
    from apps.graphs.validation import GraphInvalid

    users = get_user_model().objects
    owner = users.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    stranger = users.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    staff = users.create(username=f"plain-{uuid.uuid4().hex[:8]}", is_staff=True)
    mine, theirs = _asset(owner), _asset(stranger)

    def submit(user: Any, body: dict[str, Any]) -> Any:
        graph = GraphDoc.model_validate({"nodes": body["nodes"]})
        return run_submit(owner=user, graph=graph, target=body["target"])

    _, created = submit(owner, _loads(mine))
    assert created and Run.objects.filter(owner=owner).count() == 1
    graphs = Graph.objects.count()
    for body, node in ((_loads(theirs), "src0"), (_loads("not-a-uuid"), "src0"),
                       (_loads(str(uuid.uuid4())), "src0")):
        with pytest.raises(GraphInvalid) as refused:
            submit(owner, body)
        assert (refused.value.code, refused.value.node_id) == ("asset_not_found", node)
    assert Run.objects.filter(owner=owner).count() == 1 and Graph.objects.count() == graphs
    _, created = submit(staff, _loads(theirs))  # staff may use anyone's
    assert created
    from apps.accounts.models import Team

    team = Team.objects.create(name=f"plain-{uuid.uuid4().hex[:8]}")
    team.members.add(owner, stranger)
    _, created = submit(owner, _loads(theirs))  # a teammate's, now
    assert created


def test_a_submit_whose_statement_fails_raises_djangos_error_and_writes_nothing() -> None:
    """A failing statement rolls the submit's transaction back; the error is Django's, and the
    connection serves the next submit."""
    from django.db import ProgrammingError

    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    graph = _graph()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE graphs_graph RENAME TO graphs_graph_away")
    try:
        with pytest.raises(ProgrammingError):
            _run_create_or_find(owner, graph, graph.sha256(), "src", None, 0, REQUIREMENT, "cpu")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE graphs_graph_away RENAME TO graphs_graph")
    assert not Run.objects.filter(owner=owner).exists()
    run, created = _run_create_or_find(owner, graph, graph.sha256(), "src", None, 0, REQUIREMENT,
                                       "cpu")
    assert created and Run.objects.get(owner=owner).pk == run.pk


_MARK_ARGS = "(integer, integer, text, timestamptz, integer, uuid[], boolean)"


def test_a_submit_whose_dispatch_fails_after_commit_still_returns_its_run(caplog) -> None:
    """The dispatch runs after the submit's commit. One that fails there — here its function is
    gone for a moment — is logged, not raised: the submit returns its committed run (the API's
    201), which waits unpublished for beat's pass."""
    from django.utils import timezone

    from apps.fleet.models import Worker
    from apps.runs.dispatch import capacity_forget

    Worker.objects.update_or_create(name="cpu0@host", defaults={
        "queues": ["cpu"], "slots": 1, "last_heartbeat": timezone.now()})
    capacity_forget()
    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    body = _loads(_asset(owner))
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER FUNCTION inline_dispatch_mark{_MARK_ARGS} RENAME TO mark_away")
    try:
        run, created = run_submit(owner=owner, graph=GraphDoc.model_validate(
            {"nodes": body["nodes"]}), target=body["target"])
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER FUNCTION mark_away{_MARK_ARGS} RENAME TO inline_dispatch_mark")
        capacity_forget()
    stored = Run.objects.get(pk=run.pk)
    assert created and run.queue == "cpu"
    assert (stored.status, stored.dispatched_at) == ("queued", None)
    assert "inline_dispatch_mark" in caplog.text  # the failed pass, in the log
