"""Reads on accounts: token lookup and the set of owners a user may see."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.accounts.models import ApiToken, Team, UserLimits
from apps.accounts.services import token_hash
from inline_farm.prepared import model_columns, model_from_row, prepared_cursor

_TOUCH_EVERY = timedelta(minutes=1)


def user_for_token(secret: str) -> User | None:
    """The active user holding the unrevoked token `secret`, or None.

    Asked of the database on every call, never remembered: a revoked token or a deactivated
    user is refused on the very next request, in every process (a per-process cache of a few
    seconds kept them working that long; bench/hotpath.py measured the query it saved).
    """
    return _user_for_token_digest(token_hash(secret))


def token_digests_valid(digests: set[str]) -> set[str]:
    """Which of the token digests still authenticate (unrevoked, active user): one query, for
    the sockets that hold them (apps/accounts/watch.py)."""
    return set(ApiToken.objects.filter(key_sha256__in=digests, revoked_at__isnull=True,
                                       user__is_active=True)
               .values_list("key_sha256", flat=True))


# Every request runs this lookup (nothing is cached: see `user_for_token`), so it is one
# prepared statement (inline_farm/prepared.py) rather than the ORM's
# `ApiToken.objects.select_related("user", "user__limits").filter(…).first()`, which it
# answers exactly (tests/apps/accounts/test_token_lookup.py compares the two).
_TOKEN_USER = f"""
SELECT t.id, t.last_used_at, {model_columns(User, "u")}, l.id IS NOT NULL,
       {model_columns(UserLimits, "l")}
FROM accounts_apitoken t JOIN auth_user u ON u.id = t.user_id
LEFT JOIN accounts_userlimits l ON l.user_id = u.id
WHERE t.key_sha256 = %(digest)s AND t.revoked_at IS NULL AND u.is_active
"""
_USER_AT, _LIMITS_AT = 2, 3 + len(User._meta.concrete_fields)


def _user_for_token_digest(digest: str) -> User | None:
    with prepared_cursor() as cursor:
        cursor.execute(_TOKEN_USER, {"digest": digest})
        row = cursor.fetchone()
    if row is None:
        return None
    token_id, last_used_at = row[0], row[1]
    user = model_from_row(User, row[_USER_AT:_LIMITS_AT - 1])
    # As select_related("user__limits") leaves it: `user.limits` answers without a query
    # (submit reads the limits), raising DoesNotExist when the user has none.
    limits = model_from_row(UserLimits, row[_LIMITS_AT:]) if row[_LIMITS_AT - 1] else None
    User.limits.related.set_cached_value(user, limits)
    now = timezone.now()
    if last_used_at is None or now - last_used_at > _TOUCH_EVERY:
        ApiToken.objects.filter(pk=token_id).update(last_used_at=now)
    return user


def visible_owner_ids(user: User) -> QuerySet[User, Any] | None:
    """The owners whose work `user` may read (self and teammates) as a lazy query of user ids —
    `filter(owner_id__in=…)` makes it a subquery, so scoping costs no round trip of its own;
    None means all (staff)."""
    if user.is_staff:
        return None
    teams = Team.objects.filter(members=user).values("pk")
    return User.objects.filter(Q(pk=user.pk) | Q(teams__in=teams)).values("pk")
