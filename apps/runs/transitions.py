"""The one way a run's status changes: a compare-and-set along a declared edge."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from apps.runs.models import RUN_TRANSITIONS, Run


class UndeclaredTransition(ValueError):
    """A status change that RUN_TRANSITIONS does not allow (a bug, never user input)."""


def run_move(runs: QuerySet[Run], *, source: Iterable[str], to: str, **fields: Any) -> int:
    """Move the runs of `runs` whose status is in `source` to `to`; returns how many moved.

    Compare-and-set: a run whose status changed meanwhile is not touched, and the count says
    who won. Every source → `to` edge must be declared in RUN_TRANSITIONS.
    """
    source = tuple(source)
    edge_check(source, to)
    return runs.filter(status__in=source).update(status=to, **fields)


def edge_check(source: Iterable[str], to: str) -> None:
    """Raise UndeclaredTransition unless every `source` → `to` edge is declared (for the hot
    path's hand-written compare-and-set statements, which must obey the same table)."""
    for status in source:
        if to not in RUN_TRANSITIONS[status]:
            raise UndeclaredTransition(f"a run may not go from {status} to {to}")
