"""Reads on runs, always scoped to what the user may see."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from apps.accounts.selectors import visible_owner_ids
from apps.runs.models import Run, RunEvent


def _runs_for(user: AbstractBaseUser) -> QuerySet[Run]:
    owners = visible_owner_ids(user)
    qs = Run.objects.select_related("graph").prefetch_related("takes")
    return qs if owners is None else qs.filter(owner_id__in=owners)


def run_get_for_user(*, user: AbstractBaseUser, run_id: Any) -> Run | None:
    return _runs_for(user).filter(pk=run_id).first()


def run_list_for_user(*, user: AbstractBaseUser, status: str | None = None) -> QuerySet[Run]:
    qs = _runs_for(user).order_by("-created_at", "-pk")
    return qs.filter(status=status) if status else qs


def run_events_after(*, run_id: Any, after: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq"))
