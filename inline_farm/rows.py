"""Model instances from hand-written SQL rows, built as the ORM builds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


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
