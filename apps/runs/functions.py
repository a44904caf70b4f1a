"""The runs app's PostgreSQL functions: each one's whole text lives in apps/runs/sql/<name>.sql.

A migration applies a file's current text (`function_sql`); tests/apps/test_db_functions.py
checks that the database holds exactly what the files say.
"""

from __future__ import annotations

from itertools import dropwhile
from pathlib import Path

from apps.runs.models import RunStatus

SQL_DIR = Path(__file__).resolve().parent / "sql"
FUNCTIONS = ("inline_dispatch_mark",)


def function_sql(name: str) -> str:
    """The CREATE OR REPLACE of function `name`: apps/runs/sql/<name>.sql with the run statuses
    it names filled in from RunStatus (statuses in SQL come from the Python constants)."""
    text = (SQL_DIR / f"{name}.sql").read_text()
    return text.format(QUEUED=RunStatus.QUEUED, RUNNING=RunStatus.RUNNING)


def function_definition(name: str) -> str:
    """`function_sql(name)` without its leading comment lines: what pg_get_functiondef prints."""
    lines = function_sql(name).splitlines()
    return "\n".join(dropwhile(lambda line: line.startswith("--"), lines))
