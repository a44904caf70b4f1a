"""Reads on accounts: token lookup and the set of owners a user may see."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.accounts.services import token_hash

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


def _user_for_token_digest(digest: str) -> User | None:
    # Every request runs this: with server-side binding (settings: DATABASES OPTIONS) psycopg
    # prepares it once per connection.
    token = (
        ApiToken.objects.select_related("user", "user__limits")  # submit reads the limits
        .filter(key_sha256=digest, revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > _TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


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
