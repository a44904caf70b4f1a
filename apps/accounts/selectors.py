"""Reads on accounts: token lookup and the set of owners a user may see."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from apps.accounts.models import ApiToken, UserLimits
from apps.accounts.services import token_hash
from inline_farm.rows import model_columns, model_from_row

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


def session_digest(user_id: int, session_key: str) -> str:
    """What a socket opened with a logged-in browser session is watched by (watch.py)."""
    return f"{user_id}:{session_key}"


def session_digests_valid(digests: set[str]) -> set[str]:
    """Which of the session digests (`session_digest`) still log their user in, as Django's
    `get_user` would judge the cookie: the session exists and has not expired (no logout), it
    names that user, the user is active, and its auth hash still verifies (no password change
    since). Two queries, for the sockets that hold them (apps/accounts/watch.py)."""
    wanted = {d: d.partition(":")[::2] for d in digests}
    rows = dict(Session.objects.filter(session_key__in={key for _, key in wanted.values()},
                                       expire_date__gt=timezone.now())
                .values_list("session_key", "session_data"))
    users = {str(u.pk): u for u in User.objects.filter(
        pk__in=[int(uid) for uid, key in wanted.values() if key in rows and uid.isdigit()],
        is_active=True)}
    store = SessionStore()
    valid = set()
    for digest, (uid, key) in wanted.items():
        user = users.get(uid)
        if key not in rows or user is None:
            continue
        data = store.decode(rows[key])
        known = data.get(HASH_SESSION_KEY) or ""
        if str(data.get(SESSION_KEY)) == uid and known and any(
                constant_time_compare(known, h) for h in
                [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]):
            valid.add(digest)
    return valid


# Every request runs this lookup (nothing is cached: see `user_for_token`), so it is written
# out once rather than built by the ORM each time: the ORM's
# `ApiToken.objects.select_related("user", "user__limits").filter(…).first()` spent half the
# web's CPU of a poll building its SQL (py-spy; tests/apps/accounts/test_token_lookup.py
# checks both answer alike). With server-side binding it is prepared once per connection.
_TOKEN_USER = f"""
SELECT t.id, t.last_used_at, {model_columns(User, "u")}, l.id IS NOT NULL,
       {model_columns(UserLimits, "l")}
FROM accounts_apitoken t JOIN auth_user u ON u.id = t.user_id
LEFT JOIN accounts_userlimits l ON l.user_id = u.id
WHERE t.key_sha256 = %s AND t.revoked_at IS NULL AND u.is_active
"""
_USER_AT, _LIMITS_AT = 2, 3 + len(User._meta.concrete_fields)


def _user_for_token_digest(digest: str) -> User | None:
    with connection.cursor() as cursor:
        cursor.execute(_TOKEN_USER, [digest])
        row = cursor.fetchone()
    if row is None:
        return None
    token_id, last_used_at = row[0], row[1]
    user = model_from_row(User, row[_USER_AT:_LIMITS_AT - 1])
    # As select_related("user__limits") leaves it (the same cache call): `user.limits` answers
    # without a query, raising DoesNotExist when the user has no limits row.
    limits = model_from_row(UserLimits, row[_LIMITS_AT:]) if row[_LIMITS_AT - 1] else None
    User.limits.related.set_cached_value(user, limits)
    now = timezone.now()
    if last_used_at is None or now - last_used_at > _TOUCH_EVERY:
        ApiToken.objects.filter(pk=token_id).update(last_used_at=now)
    return user


# Every read is scoped: a user reads their own work and their teammates'; staff read all. The
# rule, written once: the teammates of user `{me}` (a parameter placeholder), as SQL that both
# the ORM's `visible_owner_ids` and the hand-written reads (`owner_visible_sql`) embed.
_TEAMMATES = ("SELECT mate.user_id FROM accounts_team_members mine JOIN accounts_team_members "
              "mate ON mate.team_id = mine.team_id WHERE mine.user_id = {me}")


def visible_owner_ids(user: User) -> QuerySet[User, Any] | None:
    """The owners whose work `user` may read (self and teammates) as a lazy query of user ids —
    `filter(owner_id__in=…)` makes it a subquery, so scoping costs no round trip of its own;
    None means all (staff)."""
    if user.is_staff:
        return None
    mates = RawSQL(_TEAMMATES.format(me="%s"), [user.pk])
    return User.objects.filter(Q(pk=user.pk) | Q(pk__in=mates)).values("pk")


def owner_visible_sql(column: str) -> str:
    """`visible_owner_ids` as an SQL condition on the owner id `column`, for hand-written reads:
    true where user `%(me)s` may read it, always when `%(all)s` (`owner_visible_params`)."""
    mates = _TEAMMATES.format(me="%(me)s")
    return f"(%(all)s OR {column} = %(me)s OR {column} IN ({mates}))"


def owner_visible_params(user: User) -> dict[str, Any]:
    """The parameters of an `owner_visible_sql` condition for reads by `user`."""
    return {"all": user.is_staff, "me": user.pk}
