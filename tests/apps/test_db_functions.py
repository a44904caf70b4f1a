"""The database functions are the files in apps/*/sql/ (each app's functions.py), word for word,
and none of the dispatcher's earlier ones is left behind."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from apps.runs import functions as runs_functions
from apps.runs.functions import FUNCTIONS, SQL_DIR
from apps.runs.models import RunStatus
from apps.takes import functions as takes_functions

pytestmark = pytest.mark.django_db


def _normalised(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("app", "name"), [
    (app, name) for app in (runs_functions, takes_functions) for name in app.FUNCTIONS
])
def test_the_database_holds_the_function_its_file_says(app: Any, name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef(p.oid) FROM pg_proc p "
                       "WHERE p.proname = %s", [name])
        [(definition,)] = cursor.fetchall()
    assert _normalised(definition) == _normalised(app.function_definition(name))


def test_the_files_name_statuses_only_through_the_constants() -> None:
    for name in FUNCTIONS:
        written = (SQL_DIR / f"{name}.sql").read_text()
        assert not [status for status in RunStatus if f"'{status}'" in written]


def test_no_other_dispatch_function_is_left_in_the_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute(r"SELECT proname FROM pg_proc WHERE proname LIKE 'inline\_dispatch\_%'")
        assert {row[0] for row in cursor.fetchall()} == set(FUNCTIONS)
