"""Reads on accounts: token lookup and the set of owners a user may see."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.accounts.services import token_hash

_TOUCH_EVERY = timedelta(minutes=1)
# A token's user is remembered this long per process: every /v1 request authenticates, and the
# lookup was one of the few round trips a request makes. A revoked token (or a deactivated
# user) stops working within TOKEN_CACHE_SECONDS.
TOKEN_CACHE_SECONDS = 5.0
_tokens: dict[str, tuple[float, User]] = {}
_tokens_lock = threading.Lock()


def user_for_token(secret: str) -> User | None:
    """The active user holding the unrevoked token `secret`, or None."""
    digest = token_hash(secret)
    now = time.monotonic()
    with _tokens_lock:
        hit = _tokens.get(digest)
    if hit is not None and now - hit[0] < TOKEN_CACHE_SECONDS:
        return hit[1]
    user = _user_for_token_digest(digest)
    with _tokens_lock:
        if len(_tokens) > 10_000:
            _tokens.clear()
        if user is None:
            _tokens.pop(digest, None)
        else:
            _tokens[digest] = (now, user)
    return user


def user_for_token_remembered(secret: str) -> User | None:
    """`user_for_token` when this process remembers the answer; None when it would have to ask
    the database (the caller then takes the path that does)."""
    digest = token_hash(secret)
    with _tokens_lock:
        hit = _tokens.get(digest)
    if hit is not None and time.monotonic() - hit[0] < TOKEN_CACHE_SECONDS:
        return hit[1]
    return None


def _user_for_token_digest(digest: str) -> User | None:
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
