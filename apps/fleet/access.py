"""Who may read the ops views (`/metrics`, `/v1/health?detail=1`): staff tokens, and for
`/metrics` the networks listed in INLINE_METRICS_ALLOW (a Prometheus server needs no token)."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest

from apps.accounts.selectors import user_for_token


class NotStaff(Exception):
    """The caller may not read an ops view: `status` 401 (no valid token) or 403 (not staff)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def staff_caller(request: HttpRequest) -> User:
    """The staff user of the request's `Authorization: Bearer` token; NotStaff otherwise."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    user = user_for_token(secret.strip()) if scheme.lower() == "bearer" and secret.strip() else None
    if user is None:
        raise NotStaff(401, "a staff API token is required (Authorization: Bearer <token>)")
    if not user.is_staff:
        raise NotStaff(403, "only staff may read this")
    return user


def metrics_allowed(request: HttpRequest) -> None:
    """Pass for an address in INLINE_METRICS_ALLOW or a staff token; NotStaff otherwise."""
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        address = None
    if address is not None and any(address in net for net in settings.INLINE_METRICS_ALLOW):
        return
    staff_caller(request)
