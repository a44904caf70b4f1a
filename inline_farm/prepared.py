"""Hand-written hot statements, planned once per database connection instead of on every call.

Django sends every query with its parameters inlined (psycopg's client-side binding) and never
prepares: PostgreSQL parses and plans each call from scratch. For the farm's hand-written
statements on the hot path that planning was most of their server time. Measured on the
statements themselves (`SELECT` in a loop on one connection, p50):

    the run read that every poll makes (apps/runs/selectors.py)   0.35 ms → 0.11 ms
    the dispatcher's per-owner heads (apps/runs/dispatch.py)       1.19 ms → 0.12 ms

`prepared_cursor()` is Django's cursor (its error translation, its connection bookkeeping,
the current transaction) over a server-side-binding psycopg cursor that prepares what it runs.
A statement is prepared on its first call on a connection and reused by every later call on that
connection; the connection pool keeps connections, so in practice each is planned a few times
per process. PostgreSQL re-plans a prepared statement by itself when a table it reads changes.

And planned once: connections run with `plan_cache_mode = force_generic_plan` (settings.py;
Django's own queries are never prepared, so only these statements see it). Left to choose,
PostgreSQL planned a statement afresh on every call whenever its generic plan looked dearer
than the custom ones, which with 10,000 runs queued on another queue (bench/dispatch.py) was
the case for the submit's statement, the dispatcher's heads and the publish UPDATE: their
planning went from ~0.02–0.09 ms to 0.1–0.8 ms a call (the server's statement log), the
larger part of the deep queue's extra cost per run. A generic plan knows no parameter's value:
- write a statement whose plan depends on *which* value (a queue name, where one queue may hold
  thousands of rows and another none) with that value in its text, as a literal, one statement
  per value, and keep the set of such values small — or better, give every lookup an index whose
  order or predicate fits it whatever the value (apps/runs/dispatch.py's `_HEADS`; its former
  eligibility probe's `EXISTS` with `queue = $1` was a sequential scan as a generic plan).

Rules for the statements sent through it:
- check the generic plan of a new statement (`SET plan_cache_mode = force_generic_plan`,
  `PREPARE`, `EXPLAIN EXECUTE`) with a deep table, not only its plan for one value;
- name their result columns (no `SELECT *`): a migration that adds a column would otherwise make
  a live process's prepared statement fail ("cached plan must not change result type");
- pass values as parameters, never formatted into the text (each text is its own statement),
  but for the few values a plan must know (above);
- give a parameter a cast where PostgreSQL cannot infer its type (`%(ids)s::uuid[]`).
A transaction-pooling proxy (pgbouncer in transaction mode) does not keep prepared statements
per client; the farm connects to PostgreSQL directly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connection
from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]  # not in django-stubs
from django.db.backends.utils import CursorWrapper
from django.db.models import Model

M = TypeVar("M", bound=Model)


class PreparingCursor(ServerBindingCursor):  # type: ignore[misc]  # an untyped base (above)
    """Server-side binding, and every statement it runs is prepared (kept per connection).
    On a psycopg connection of its own (inline_farm/run_door.py) or inside `prepared_cursor`."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)


@contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
    """A cursor for the hot hand-written statements (see the module's rules); use it where
    `connection.cursor()` would be used: same transaction, same errors."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw = PreparingCursor(connection.connection)
    # As `connection.cursor()` does: logged (DEBUG, CaptureQueriesContext) when queries are.
    cursor = (connection.make_debug_cursor(raw) if connection.queries_logged
              else connection.make_cursor(raw))
    try:
        yield cursor
    finally:
        cursor.close()


def model_columns(model: type[Model], alias: str) -> str:
    """`alias.col, alias.col, …` for every concrete column of `model`, in field order (what
    `model_from_row` reads back)."""
    return ", ".join(f"{alias}.{f.column}" for f in model._meta.concrete_fields)


def model_from_row(model: type[M], values: Sequence[Any]) -> M:
    """An instance of `model` from a row of `model_columns`, as the ORM would build it (each
    field's `from_db_value`, e.g. JSON decoding, applied)."""
    fields = model._meta.concrete_fields
    decoded = [f.from_db_value(v, None, connection) if hasattr(f, "from_db_value") else v
               for f, v in zip(fields, values, strict=True)]
    return model.from_db(connection.alias, [f.attname for f in fields], decoded)
