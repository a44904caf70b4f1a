"""Helpers of the API edge tests: extra personas with their own limits, raw JSON bodies."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.livefarm import Client, LiveFarm


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is `status` in the API's error shape; returns its `error` object."""
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str), error
    if code is not None:
        assert error["code"] == code, error
    return error


def raw_json(body: Any) -> bytes:
    """JSON text as a hostile client may send it: NaN/Infinity literals, lone surrogates and NUL
    escaped (ASCII-only, so the bytes themselves are valid UTF-8)."""
    return json.dumps(body, ensure_ascii=True, allow_nan=True).encode()


@pytest.fixture
def persona(farm: LiveFarm, db_access: None) -> Iterator[Callable[..., Client]]:
    """`persona("name", max_inflight_runs=3)`: a client for a user with those limits."""
    from apps.accounts.models import UserLimits
    from apps.accounts.services import token_create, user_get_or_create

    clients: list[Client] = []

    def make(username: str, **limits: int) -> Client:
        user = user_get_or_create(username=username)
        if limits:
            UserLimits.objects.update_or_create(user=user, defaults=limits)
        secret = token_create(user=user, name="test")[1]
        client = Client(base_url=farm.url, headers={"Authorization": f"Bearer {secret}"},
                        timeout=30)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@dataclass
class StrictWeb:
    """A second web process on the same database, with production-like settings."""

    live: LiveFarm

    @property
    def url(self) -> str:
        return self.live.url

    def client(self, token: str | None = None, **kwargs: Any) -> Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return Client(base_url=self.url, headers=headers, timeout=30, **kwargs)


STRICT_ENV = {
    "INLINE_MAX_BODY_BYTES": str(1024 * 1024),
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto=https",
}


@pytest.fixture(scope="module")
def strict_web(farm: LiveFarm, django_db_blocker: Any) -> Iterator[StrictWeb]:
    """Web only (the session farm's worker serves it too), with STRICT_ENV over the farm's env."""
    logs = farm.logs / "strict"
    logs.mkdir(exist_ok=True)
    live = LiveFarm(env={**farm.env, **STRICT_ENV}, logs=logs)
    with django_db_blocker.unblock():
        try:
            live.start_web()
            yield StrictWeb(live)
        finally:
            live.stop_all()


@pytest.fixture
def owner_token(personas: dict[str, str]) -> str:
    return personas["owner"]
