"""The runs app's PostgreSQL functions: each one's whole text lives in apps/runs/sql/<name>.sql
(inline_farm/sqlfiles.py: how a migration applies it and a test checks it)."""

from __future__ import annotations

from pathlib import Path

from apps.runs.models import RunStatus
from inline_farm.sqlfiles import sql_file, without_comments

SQL_DIR = Path(__file__).resolve().parent / "sql"
FUNCTIONS = ("inline_dispatch_mark",)


def function_sql(name: str) -> str:
    """The CREATE OR REPLACE of function `name`: apps/runs/sql/<name>.sql with the run statuses
    it names filled in from RunStatus (statuses in SQL come from the Python constants)."""
    return sql_file(SQL_DIR, name, QUEUED=RunStatus.QUEUED, RUNNING=RunStatus.RUNNING)


def function_definition(name: str) -> str:
    """`function_sql(name)` as pg_get_functiondef prints it."""
    return without_comments(function_sql(name))
