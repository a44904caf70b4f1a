"""Writes on accounts: users, API tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import ApiToken

TOKEN_PREFIX = "inf_"


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def user_get_or_create(*, username: str, is_staff: bool = False) -> User:
    """The user named `username`, created (without a usable password) if absent."""
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username, defaults={"is_staff": is_staff})
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


@transaction.atomic
def token_create(*, user: User, name: str = "") -> tuple[ApiToken, str]:
    """A new token for `user`; returns the row and the secret (shown once, never stored)."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=secret[:10], key_sha256=token_hash(secret)
    )
    return token, secret


def token_revoke(*, token_id: int) -> bool:
    """Revoke a token (compare-and-set: False when it was already revoked)."""
    return bool(
        ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    )
