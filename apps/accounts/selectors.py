"""Reads on accounts: token lookup and the set of owners a user may see."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.accounts.services import token_hash

_TOUCH_EVERY = timedelta(minutes=1)


def user_for_token(secret: str) -> User | None:
    """The active user holding the unrevoked token `secret`, or None."""
    token = (
        ApiToken.objects.select_related("user", "user__limits")  # submit reads the limits
        .filter(key_sha256=token_hash(secret), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > _TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def visible_owner_ids(user: User) -> list[int] | None:
    """Ids of the owners whose work `user` may read: self and teammates; None means all (staff)."""
    if user.is_staff:
        return None
    User = get_user_model()
    ids = set(User.objects.filter(teams__members=user).values_list("pk", flat=True))
    ids.add(user.pk)
    return sorted(ids)
