"""Reads on takes and assets, always scoped to what the user may see."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet

from apps.accounts.selectors import visible_owner_ids
from apps.takes.models import Asset, Take


def _scoped(qs: QuerySet[Any], user: User) -> QuerySet[Any]:
    owners = visible_owner_ids(user)
    return qs if owners is None else qs.filter(owner_id__in=owners)


def take_get_for_user(*, user: User, take_id: Any) -> Take | None:
    return _scoped(Take.objects.all(), user).filter(pk=take_id).first()


def asset_get_for_user(*, user: User, asset_id: Any) -> Asset | None:
    return _scoped(Asset.objects.all(), user).filter(pk=asset_id).first()


def assets_visible_to_owner(
    *, owner_id: int, asset_ids: list[str], owner: User | None = None
) -> set[str]:
    """The subset of `asset_ids` that the run owner may use (pass `owner` when you have it)."""
    if owner is None:
        owner = User.objects.get(pk=owner_id)
    found = _scoped(Asset.objects.filter(pk__in=asset_ids), owner).values_list("pk", flat=True)
    return {str(pk) for pk in found}
