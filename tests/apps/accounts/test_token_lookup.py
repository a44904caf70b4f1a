"""The token lookup (one hand-written statement, apps/accounts/selectors.py) answers exactly what
the ORM's `select_related("user", "user__limits")` query answers, without a query for the
limits afterwards; revoked tokens and inactive users find nobody."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import ApiToken, UserLimits
from apps.accounts.selectors import user_for_token
from apps.accounts.services import token_create, token_hash, token_revoke, user_get_or_create

pytestmark = pytest.mark.django_db


def through_the_orm(secret: str) -> ApiToken | None:
    return (ApiToken.objects.select_related("user", "user__limits")
            .filter(key_sha256=token_hash(secret), revoked_at__isnull=True,
                    user__is_active=True).first())


@pytest.mark.parametrize("with_limits", [True, False])
def test_the_lookup_answers_as_the_orm_does_limits_included(with_limits):
    user = user_get_or_create(username=f"lookup-{with_limits}", is_staff=with_limits)
    if with_limits:
        UserLimits.objects.create(user=user, max_inflight_runs=7, max_priority=3)
    _, secret = token_create(user=user)
    orm = through_the_orm(secret)
    assert orm is not None
    with CaptureQueriesContext(connection) as queries:
        found = user_for_token(secret)
        assert found is not None
        fields = [f.attname for f in type(found)._meta.concrete_fields]
        assert [getattr(found, f) for f in fields] == [getattr(orm.user, f) for f in fields]
        if with_limits:
            assert (found.limits.max_inflight_runs, found.limits.max_priority) == (7, 3)
        else:
            with pytest.raises(UserLimits.DoesNotExist):
                found.limits  # noqa: B018 — the access itself is what is tested
    # the lookup, and the first use's last_used_at touch; none for the limits
    assert len(queries) == 2


def test_a_revoked_token_or_an_inactive_user_finds_nobody():
    user = user_get_or_create(username="lookup-revoked")
    token, secret = token_create(user=user)
    _, other = token_create(user=user)
    token_revoke(token_id=token.pk)
    assert user_for_token(secret) is None and through_the_orm(secret) is None
    assert user_for_token(other) is not None
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    assert user_for_token(other) is None and through_the_orm(other) is None
