"""The takes app's PostgreSQL functions: each one's whole text lives in apps/takes/sql/<name>.sql
(inline_farm/sqlfiles.py: how a migration applies it and a test checks it)."""

from __future__ import annotations

from pathlib import Path

from inline_farm.sqlfiles import sql_file, without_comments

SQL_DIR = Path(__file__).resolve().parent / "sql"
FUNCTIONS = ("inline_forbid_update",)


def function_sql(name: str) -> str:
    """The CREATE OR REPLACE of function `name`: apps/takes/sql/<name>.sql as it is."""
    return sql_file(SQL_DIR, name)


def function_definition(name: str) -> str:
    """`function_sql(name)` as pg_get_functiondef prints it."""
    return without_comments(function_sql(name))
