"""A plain submit (no clientRunId, no team limit) is one statement after the owner's lock
(apps/runs/services.py `_SUBMIT_PLAIN`, pipelined behind the lock); these check its one race by
hand (another submit commits the same new graph document while this one's statement runs) and
the asset check it took over from a statement of its own."""

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
from apps.runs.services import _run_create_plain
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
            result["run"] = _run_create_plain(owner, graph, sha, "src", 0, REQUIREMENT, "cpu", [])
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


def test_a_plain_submit_coalesces_and_counts_what_is_in_flight() -> None:
    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    graph = _graph()
    first, created = _run_create_plain(owner, graph, graph.sha256(), "src", 0, REQUIREMENT, "cpu", [])
    again, created_again = _run_create_plain(owner, graph, graph.sha256(), "src", 0, REQUIREMENT, "cpu", [])
    assert created and not created_again and again.pk == first.pk
    stored = Run.objects.get(pk=first.pk)
    assert (stored.status, stored.queue, stored.requirement, stored.owner_id) == (
        "queued", first.queue, REQUIREMENT, owner.pk)
    assert stored.created_at == first.created_at


def _asset(owner: Any) -> str:
    from apps.takes.models import Asset

    return str(Asset.objects.create(owner=owner, sha256="0" * 64, media_type="image/png",
                                    size=1).pk)


def _loads(asset: str) -> dict[str, Any]:
    return {"nodes": {"src0": {"type": "image/load", "params": {"asset": asset}}},
            "target": "src0"}


def test_the_plain_submit_checks_assets_in_its_statement_and_stores_nothing_on_a_miss() -> None:
    from apps.graphs.validation import GraphInvalid
    from apps.runs.services import run_submit

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


def test_a_plain_submit_whose_statement_fails_raises_djangos_error_and_writes_nothing() -> None:
    """The lock and the statement are one implicit transaction (autocommit + pipeline): a
    statement that fails rolls the transaction back at the Sync, and the error is Django's (as
    any statement's), not psycopg's; the connection serves the next submit."""
    from django.db import ProgrammingError

    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    graph = _graph()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE graphs_graph RENAME TO graphs_graph_away")
    try:
        with pytest.raises(ProgrammingError):
            _run_create_plain(owner, graph, graph.sha256(), "src", 0, REQUIREMENT, "cpu", [])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE graphs_graph_away RENAME TO graphs_graph")
    assert not Run.objects.filter(owner=owner).exists()
    run, created = _run_create_plain(owner, graph, graph.sha256(), "src", 0, REQUIREMENT, "cpu", [])
    assert created and Run.objects.get(owner=owner).pk == run.pk


_MARK_ARGS = "(integer, integer, text, timestamptz, integer, uuid[], boolean)"
_LONE_ARGS = "(integer, integer, text, timestamptz, integer, uuid)"


@pytest.mark.parametrize("gone", ["lone", "pass"])
def test_a_submit_whose_dispatch_fails_after_commit_still_returns_its_run(caplog, gone) -> None:
    """The dispatch runs after the submit's commit (`_dispatch_submitted`: the lone mark, or the
    full pass when another run waits). One that fails there — here its function is gone for a
    moment — is logged, not raised: the submit returns its committed run (the API's 201), which
    waits unpublished for beat's pass."""
    from django.utils import timezone

    from apps.fleet.models import Worker
    from apps.runs.dispatch import capacity_forget
    from apps.runs.services import run_submit

    Worker.objects.update_or_create(name="cpu0@host", defaults={
        "queues": ["cpu"], "slots": 1, "last_heartbeat": timezone.now()})
    capacity_forget()
    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    if gone == "pass":  # another run waits: the lone mark leaves the choice to the full pass
        Run.objects.create(owner=owner, graph=Graph.objects.create(
            sha256=uuid.uuid4().hex * 2, document={"nodes": {}}), target="x", queue="cpu")
    name, args = (("inline_dispatch_lone", _LONE_ARGS) if gone == "lone"
                  else ("inline_dispatch_mark", _MARK_ARGS))
    body = _loads(_asset(owner))
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER FUNCTION {name}{args} RENAME TO {name}_away")
    try:
        run, created = run_submit(owner=owner, graph=GraphDoc.model_validate(
            {"nodes": body["nodes"]}), target=body["target"])
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER FUNCTION {name}_away{args} RENAME TO {name}")
        capacity_forget()
    stored = Run.objects.get(pk=run.pk)
    assert created and run.queue == "cpu"
    assert (stored.status, stored.dispatched_at) == ("queued", None)
    assert name in caplog.text  # the failed pass, in the log


def test_a_plain_submit_alone_in_its_queue_is_marked_in_its_own_transaction() -> None:
    """The owner's lock, the submit's statement and the run's lone mark (migrations/runs/0006)
    go out together and commit together, no statement after the commit: the mark's now() is
    the transaction's that stored the run's new graph document, and the run comes back marked
    (its message published)."""
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from apps.fleet.models import Worker
    from apps.runs.dispatch import capacity_forget
    from apps.runs.services import run_submit

    Worker.objects.update_or_create(name="cpu0@host", defaults={
        "queues": ["cpu"], "slots": 2, "last_heartbeat": timezone.now()})
    capacity_forget()
    owner = get_user_model().objects.create(username=f"plain-{uuid.uuid4().hex[:8]}")
    first = _loads(_asset(owner))
    second: dict[str, Any] = {"nodes": {"src1": first["nodes"]["src0"]}, "target": "src1"}
    # another graph (its node's id); the first reads the fleet's slots (kept a second), the
    # second is captured
    try:
        for body in (first, second):
            with CaptureQueriesContext(connection) as queries:
                run, created = run_submit(owner=owner, graph=GraphDoc.model_validate(
                    {"nodes": body["nodes"]}), target=body["target"])
            stored = Run.objects.select_related("graph").get(pk=run.pk)
            assert created and stored.dispatched_at == stored.graph.created_at
    finally:
        capacity_forget()
    assert len(queries.captured_queries) == 3  # the lock, the statement, the dispatch
