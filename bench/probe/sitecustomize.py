"""The timeline probe of bench/timeline.py, loaded by the farm's processes through PYTHONPATH.

With INLINE_PROBE_TIMELINE=<prefix> set, every psycopg wait for the server (a round trip) and
every Redis command sent or answered is written to `<prefix>.<pid>` as one line:
`<start> <end> <pid> <thread> <pg|redis>|redis<> <what>` (wall-clock seconds). A round trip is
labelled with the first line of the statement whose execute() made it (a BEGIN's wait is in its
first statement's), a COMMIT's `COMMIT`, a pipeline's closing Sync `SYNC`, any other `cmd`.
Without the variable this file does nothing.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

_PREFIX = os.environ.get("INLINE_PROBE_TIMELINE")


def _install(prefix: str) -> None:
    import psycopg
    import redis.connection

    out = open(f"{prefix}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115 — open for the process
    local = threading.local()

    def log(kind: str, start: float, what: str) -> None:
        name = threading.current_thread().name[:14].replace(" ", "_")
        out.write(f"{start:.6f} {time.time():.6f} {os.getpid()} {name} {kind} {what}\n")

    wait = psycopg.Connection.wait

    def timed_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return wait(self, gen, *args, **kwargs)
        finally:
            log("pg", start, getattr(local, "query", "cmd"))
            local.query = "cmd"

    psycopg.Connection.wait = timed_wait  # type: ignore[method-assign]
    commit, pipeline_exit = psycopg.Connection.commit, psycopg.Pipeline.__exit__

    def labelled_commit(self: Any) -> None:
        local.query = "COMMIT"
        commit(self)

    def labelled_exit(self: Any, *args: Any) -> None:
        local.query = "SYNC"  # a pipeline's end: its Sync, and the wait for every answer
        pipeline_exit(self, *args)

    psycopg.Connection.commit = labelled_commit  # type: ignore[method-assign]
    psycopg.Pipeline.__exit__ = labelled_exit  # type: ignore[method-assign]
    for cls in (psycopg.Cursor, psycopg.ClientCursor):
        def labelled(self: Any, query: Any, *args: Any, _execute: Any = cls.execute,
                     **kwargs: Any) -> Any:
            local.query = " ".join(str(query).split())[:80]
            return _execute(self, query, *args, **kwargs)

        cls.execute = labelled  # type: ignore[method-assign]

    connection = redis.connection.AbstractConnection
    send, read = connection.send_packed_command, connection.read_response

    def timed_send(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.time()
        result = send(self, command, *args, **kwargs)
        first = bytes(command[0] if isinstance(command, list) else command)
        log("redis>", start, " ".join(first[:48].decode("latin-1").split()))  # one line
        return result

    def timed_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.time()
        result = read(self, *args, **kwargs)
        log("redis<", start, "_".join(str(result)[:40].split()))
        return result

    connection.send_packed_command = timed_send  # type: ignore[method-assign]
    connection.read_response = timed_read  # type: ignore[method-assign]


if _PREFIX:
    _install(_PREFIX)
