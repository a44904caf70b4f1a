"""Typed environment readers that fail loudly on a bad value (settings read only through these)."""

from __future__ import annotations

import os
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse


class ImproperlyConfiguredEnv(RuntimeError):
    """An environment variable holds a value the farm cannot use."""


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={value} must be >= {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={value} must be >= {minimum}")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name) or default
    if value not in choices:
        raise ImproperlyConfiguredEnv(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def env_networks(name: str) -> list[IPv4Network | IPv6Network]:
    """A comma-separated list of networks (`10.0.0.0/8, 127.0.0.1`); empty when unset."""
    networks = []
    for part in os.environ.get(name, "").split(","):
        if part.strip():
            try:
                networks.append(ip_network(part.strip(), strict=False))
            except ValueError:
                raise ImproperlyConfiguredEnv(f"{name}: {part.strip()!r} is not a network") from None
    return networks


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default.resolve()


def database_from_url(url: str) -> dict[str, object]:
    """`postgresql://user:pw@host:port/name?host=/socket/dir` → a Django DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfiguredEnv(
            f"DATABASE_URL must be a postgresql:// URL, got scheme {parsed.scheme!r}"
        )
    query = parse_qs(parsed.query)
    name = unquote(parsed.path.lstrip("/"))
    if not name:
        raise ImproperlyConfiguredEnv("DATABASE_URL names no database (…/<name>)")
    host = query.get("host", [unquote(parsed.hostname or "")])[0]
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(parsed.port or ""),
        # Connections come from psycopg's pool (settings.py adds OPTIONS["pool"]): Django
        # returns them to the pool at the end of each request or task instead of closing them.
        "CONN_MAX_AGE": 0,
    }
