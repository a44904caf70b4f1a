"""Hand-written reads build their model instances as the ORM does (inline_farm/rows.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.graphs.models import Graph
from apps.runs.models import Run
from apps.runs.selectors import run_get_for_user
from inline_farm.rows import model_columns, model_from_row

pytestmark = pytest.mark.django_db


def test_a_run_read_through_it_equals_the_orm_read() -> None:
    owner = get_user_model().objects.create(username="prep-owner")
    graph = Graph.objects.create(sha256="ab" * 32, document={"nodes": {}})
    run = Run.objects.create(owner=owner, graph=graph, target="out",
                             requirement={"nodeTypes": ["image/save"], "models": []})
    read = run_get_for_user(user=owner, run_id=str(run.pk))
    assert read is not None
    orm = Run.objects.get(pk=run.pk)
    for field in Run._meta.concrete_fields:
        assert getattr(read, field.attname) == getattr(orm, field.attname), field.name
    assert read.requirement == {"nodeTypes": ["image/save"], "models": []}  # decoded JSON
    assert read.graph.sha256 == "ab" * 32 and list(read.takes.all()) == []
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {model_columns(Graph, 'g')} FROM graphs_graph g "
                       "WHERE g.id = %(id)s", {"id": graph.pk})
        assert model_from_row(Graph, cursor.fetchone()).document == {"nodes": {}}


def test_a_take_read_through_it_equals_the_orm_read_and_keeps_the_scoping() -> None:
    from apps.accounts.models import Team
    from apps.takes.models import Take
    from apps.takes.selectors import take_get_for_user

    users = get_user_model().objects
    owner, mate, stranger = (users.create(username=f"take-{n}") for n in ("owner", "mate", "x"))
    staff = users.create(username="take-staff", is_staff=True)
    Team.objects.create(name="take-team").members.add(owner, mate)
    graph = Graph.objects.create(sha256="ef" * 32, document={"nodes": {}})
    run = Run.objects.create(owner=owner, graph=graph, target="out",
                             requirement={"nodeTypes": ["image/save"], "models": []})
    take = Take.objects.create(run=run, owner=owner, node_id="out", sha256="12" * 32,
                               media_type="image/png", size=3, width=4, height=2, seed=9,
                               lineage={"seed": 9, "models": {"vae/a.safetensors": "00"}})
    orm = Take.objects.get(pk=take.pk)
    for user in (owner, mate, staff):
        read = take_get_for_user(user=user, take_id=str(take.pk))
        assert read is not None, user.username
        for field in Take._meta.concrete_fields:
            assert getattr(read, field.attname) == getattr(orm, field.attname), field.name
    assert take_get_for_user(user=stranger, take_id=str(take.pk)) is None
    assert take_get_for_user(user=owner, take_id="00000000-0000-0000-0000-000000000000") is None


def test_a_statement_a_connection_runs_often_is_prepared_there() -> None:
    """settings' `server_side_binding` + `prepare_threshold` (Django's documented options):
    psycopg prepares what a connection keeps running, so PostgreSQL plans it once there."""
    from django.conf import settings

    threshold = settings.INLINE_DB_PREPARE_THRESHOLD
    with connection.cursor() as cursor:
        for n in range(threshold + 1):
            cursor.execute("SELECT 41 + %(n)s AS prepared_probe", {"n": n})
            assert cursor.fetchone() == (41 + n,)
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        kept = [row[0] for row in cursor.fetchall() if "prepared_probe" in row[0]]
    assert kept == (["SELECT 41 + $1 AS prepared_probe"] if threshold else [])
