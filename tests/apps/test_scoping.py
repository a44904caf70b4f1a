"""Every read is scoped by one rule (apps/accounts/selectors.py): the ORM's `visible_owner_ids`
and the hand-written reads' `owner_visible_sql` see the same owners for every persona."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.accounts.models import Team
from apps.accounts.selectors import owner_visible_params, owner_visible_sql, visible_owner_ids

pytestmark = pytest.mark.django_db


def _seen_by_sql(user) -> set[int]:  # type: ignore[no-untyped-def]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT u.id FROM auth_user u WHERE {owner_visible_sql('u.id')}",
                       owner_visible_params(user))
        return {row[0] for row in cursor.fetchall()}


def _seen_by_orm(user) -> set[int]:  # type: ignore[no-untyped-def]
    owners = visible_owner_ids(user)
    users = get_user_model().objects
    return set((users.all() if owners is None else users.filter(pk__in=owners))
               .values_list("pk", flat=True))


def test_the_orm_and_the_sql_scoping_see_the_same_owners() -> None:
    users = get_user_model().objects
    owner, teammate, other_team_mate, outsider = (
        users.create(username=f"scope-{n}") for n in ("owner", "mate", "far", "outsider"))
    staff = users.create(username="scope-staff", is_staff=True)
    Team.objects.create(name="scope-a").members.add(owner, teammate)
    Team.objects.create(name="scope-b").members.add(teammate, other_team_mate)

    assert _seen_by_orm(owner) == _seen_by_sql(owner) == {owner.pk, teammate.pk}
    assert _seen_by_orm(teammate) == _seen_by_sql(teammate) == {
        owner.pk, teammate.pk, other_team_mate.pk}
    assert _seen_by_orm(outsider) == _seen_by_sql(outsider) == {outsider.pk}
    assert _seen_by_orm(staff) == _seen_by_sql(staff) == set(users.values_list("pk", flat=True))
