"""Shared fixtures: personas with API tokens, and a live farm (web + worker + beat processes)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from PIL import Image

from tests.livefarm import Client, LiveFarm, database_url

# Short reaper and heartbeat intervals so failover is observable in seconds. A lost worker is
# found by its silent heartbeat (INLINE_WORKER_LOST_SECONDS); the lease is only the last line of
# defence, long enough that a loaded machine's late renewal never requeues a healthy run.
FARM_ENV = {
    "INLINE_LEASE_SECONDS": "30",
    "INLINE_REAPER_INTERVAL": "1",
    "INLINE_WORKER_HEARTBEAT": "1",
    "INLINE_REDISPATCH_SECONDS": "5",
    "INLINE_MAX_ATTEMPTS": "3",
    "INLINE_ASSET_MAX_BYTES": "2000000",
}


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest, django_test_environment: None, django_db_blocker: Any,
    django_db_modify_db_settings: None,
) -> Iterator[None]:
    """Always make the test database.

    pytest-django makes it only when a selected test is marked `django_db`; the live-farm tests
    are not (their processes need committed data), so running them alone would otherwise put
    them on the real database.
    """
    from django.test.utils import setup_databases, teardown_databases

    verbosity = request.config.option.verbose
    with django_db_blocker.unblock():
        # A set, as pytest-django passes; django-stubs says Mapping, Django only tests membership.
        config = setup_databases(verbosity=verbosity, interactive=False,
                                 aliases={"default"})  # type: ignore[arg-type]
    yield
    with django_db_blocker.unblock():
        teardown_databases(config, verbosity=verbosity)


@pytest.fixture(scope="session")
def data_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("farm")
    dirs = {"data": root / "data", "models": root / "models", "logs": root / "logs"}
    for path in dirs.values():
        path.mkdir()
    # The test process reads blobs too: point it at the same data dir as the farm's processes.
    settings.INLINE_DATA_DIR = dirs["data"]
    settings.INLINE_BLOB_DIR = dirs["data"] / "blobs"
    settings.INLINE_MODELS_DIR = dirs["models"]
    settings.INLINE_WORKER_HEARTBEAT = 1.0
    return dirs


@pytest.fixture(scope="session")
def farm(
    django_db_setup: Any, django_db_blocker: Any, data_dirs: dict[str, Path]
) -> Iterator[LiveFarm]:
    from inline_farm.celery import app

    name = str(settings.DATABASES["default"]["NAME"])
    assert name.startswith("test_"), f"the live farm must run on a test database, not {name}"
    env = {
        **os.environ,
        **FARM_ENV,
        "DATABASE_URL": database_url(settings.DATABASES["default"]),
        "INLINE_DATA_DIR": str(data_dirs["data"]),
        "INLINE_MODELS_DIR": str(data_dirs["models"]),
        "INLINE_PROFILE": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    from tests.brokerguard import assert_test_broker

    assert_test_broker(settings.BROKER_URL)  # the purge below must only touch the tests' own
    app.control.purge()  # stale messages from an earlier run would name runs that don't exist
    live = LiveFarm(env=env, logs=data_dirs["logs"])
    with django_db_blocker.unblock():
        try:
            live.start_web()
            live.start_worker()
            live.start_beat()
            yield live
        finally:
            live.stop_all()


@pytest.fixture(scope="session")
def personas(django_db_setup: Any, django_db_blocker: Any) -> dict[str, str]:
    """Tokens of the named personas: owner, teammate (same team), outsider, staff."""
    from apps.accounts.models import Team
    from apps.accounts.services import token_create, user_get_or_create

    with django_db_blocker.unblock():
        tokens = {}
        for name in ("owner", "teammate", "outsider", "staff"):
            user = user_get_or_create(username=name, is_staff=name == "staff")
            tokens[name] = token_create(user=user, name="test")[1]
        team, _ = Team.objects.get_or_create(name="lighting")
        team.members.add(*type(user).objects.filter(username__in=["owner", "teammate"]))
    return tokens


def _client(farm: LiveFarm, token: str | None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(base_url=farm.url, headers=headers, timeout=30)


def smoke_stack_reported(
    farm: LiveFarm, token: str, models_dir: Path, *, name: str | None = None, seed: int = 0
) -> dict[str, str]:
    """Write the tiny random Z-Image stack (as `name`) into a worker's models dir, then wait until
    the worker's heartbeat reports it (runs naming it pass validation only then). Returns the
    file name per zimage/turbo param: {"model", "vae", "text_encoder"}."""
    import time

    from workers.models.zimage.tiny import SMOKE_NAME, write_smoke_stack

    names = write_smoke_stack(models_dir, name=name or SMOKE_NAME, seed=seed)
    with _client(farm, token) as client:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            turbo = client.get("/v1/models/zimage/turbo").json()
            # Every file: a heartbeat's scan during the write reports the model file before
            # the text encoder's folder is there (a flaky 400 "no live worker holds …").
            choices = {p["name"]: p.get("choices") or [] for p in turbo["params"]}
            if all(file in choices.get(param, []) for param, file in names.items()):
                return names
            time.sleep(0.2)
    raise AssertionError(f"no worker reported the {name or SMOKE_NAME} stack")


@pytest.fixture
def owner(farm: LiveFarm, personas: dict[str, str]) -> Iterator[Client]:
    with _client(farm, personas["owner"]) as client:
        yield client


@pytest.fixture
def teammate(farm: LiveFarm, personas: dict[str, str]) -> Iterator[Client]:
    with _client(farm, personas["teammate"]) as client:
        yield client


@pytest.fixture
def outsider(farm: LiveFarm, personas: dict[str, str]) -> Iterator[Client]:
    with _client(farm, personas["outsider"]) as client:
        yield client


@pytest.fixture
def anonymous(farm: LiveFarm) -> Iterator[Client]:
    with _client(farm, None) as client:
        yield client


@pytest.fixture
def db_access(django_db_blocker: Any) -> Iterator[None]:
    """Direct ORM reads of what the live farm committed (no per-test transaction)."""
    with django_db_blocker.unblock():
        yield


def png(width: int = 64, height: int = 48, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


def upload(client: Client, data: bytes, name: str = "in.png", content_type: str = "image/png") -> Any:
    return client.post("/v1/assets", files={"file": (name, data, content_type)})


def resize_graph(asset_id: str, width: int = 32, height: int = 16, **extra: Any) -> dict[str, Any]:
    return {
        "graph": {"nodes": {
            "src": {"type": "image/load", "params": {"asset": asset_id}},
            "big": {"type": "image/resize", "params": {"width": width, "height": height},
                    "inputs": {"image": {"node": "src", "port": "image"}}},
            "out": {"type": "image/save", "inputs": {"image": {"node": "big", "port": "image"}}},
        }},
        "target": "out",
        **extra,
    }


def delay_graph(asset_id: str, seconds: float, **extra: Any) -> dict[str, Any]:
    """load → util/delay(seconds) → save: a run that stays in flight for a while."""
    return {
        "graph": {"nodes": {
            "src": {"type": "image/load", "params": {"asset": asset_id}},
            "wait": {"type": "util/delay", "params": {"seconds": seconds},
                     "inputs": {"image": {"node": "src", "port": "image"}}},
            "out": {"type": "image/save", "inputs": {"image": {"node": "wait", "port": "image"}}},
        }},
        "target": "out",
        **extra,
    }


def wait_status(client: Client, run_id: str, status: str, timeout: float = 30) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(f"/v1/runs/{run_id}").json()
        if run["status"] == status:
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} never reached {status}: {run}")
