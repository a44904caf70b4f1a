"""Database functions as files: each PL/pgSQL function's whole text is one `<app>/sql/<name>.sql`,
leading `--` comment lines, then the function as pg_get_functiondef prints it.

A migration applies a file's current text (`<app>/functions.py` `function_sql`; a change to a
file needs a new migration that applies it again); tests/apps/test_db_functions.py checks that
the database holds exactly what the files say.
"""

from __future__ import annotations

from itertools import dropwhile
from pathlib import Path


def sql_file(directory: Path, name: str, **values: str) -> str:
    """The text of `directory/<name>.sql`, with `{KEY}` placeholders filled from `values`."""
    text = (directory / f"{name}.sql").read_text()
    return text.format(**values) if values else text


def without_comments(create: str) -> str:
    """A file's CREATE without its leading comment lines: what pg_get_functiondef prints."""
    return "\n".join(dropwhile(lambda line: line.startswith("--"), create.splitlines()))
