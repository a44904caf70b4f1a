"""Websocket fan-out benchmark: many subscribers on one run while many runs publish at once.

    .venv/bin/python bench/events.py [--subscribers 200] [--runs 50] [--rate 20] [--seconds 10]

It uses the farm's configured services (DATABASE_URL, BROKER_URL, CHANNEL_REDIS_URL), migrates
that database, starts its own uvicorn on a free port, and cleans its runs up afterwards.

- `--runs` runs are made `running` by hand (no worker needed); `--publishers` processes append to
  their logs through the worker's path (`--append flush`, the default: buffered like the
  executor and written in one fenced statement per flush, `run_events_append_fenced`, as the
  executor's `run_events_flush` writes progress; or
  `--append single`: one `run_event_append` transaction per event, as before batching), then
  `group_send` after commit, `--rate` events/s per run for `--seconds`: progress events with
  every 10th a `node_done`, then a `run_done`.
- `--subscribers` websockets follow run 0 and one more follows each other run, spread over
  `--client-procs` processes; each reads until the server closes after `run_done`.
- Printed: events published/s, events delivered/s over all sockets, publish→receive latency
  (p50/p99; "publish" = when the event is made, before any buffering and the Postgres commit), and
  whether every socket got every milestone in order (progress may be coalesced for slow readers);
  then that latency split in two: event made → committed (the publishers' buffering and write) and
  commit→receive (the publisher's channel-layer send, Redis, the web process, the socket).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STALL_SECONDS = 60.0  # a subscriber that hears nothing for this long reports an error
sys.path.insert(0, str(REPO))


def django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inline_farm.settings")
    import django

    django.setup()


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# --- setup and teardown (in the main process) -----------------------------------------------

def create_runs(count: int) -> tuple[int, str, list[str]]:
    """A bench user's token and `count` runs in `running` state (held by a fake lease)."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.accounts.services import token_create, user_get_or_create
    from apps.graphs.models import Graph
    from apps.runs.models import Run, RunStatus

    user = user_get_or_create(username="bench-events")
    token, secret = token_create(user=user, name="bench/events.py")
    graph, _ = Graph.objects.get_or_create(sha256="0" * 63 + "b", defaults={"document": {}})
    now, stamp = timezone.now(), uuid.uuid4().hex[:8]
    runs = Run.objects.bulk_create(
        Run(owner=user, graph=graph, target=f"bench-{stamp}-{i}", status=RunStatus.RUNNING,
            attempts=1, lease_worker="bench", lease_expires_at=now + timedelta(hours=1),
            started_at=now)
        for i in range(count)
    )
    return token.pk, secret, [str(r.pk) for r in runs]


def delete_runs(run_ids: list[str], token_id: int) -> None:
    from apps.accounts.services import token_revoke
    from apps.runs.models import Run

    Run.objects.filter(pk__in=run_ids).delete()
    token_revoke(token_id=token_id)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    import httpx

    from inline_farm.cli import uvicorn_argv

    server = subprocess.Popen(
        uvicorn_argv("127.0.0.1", port, "--log-level", "warning"),
        cwd=REPO, start_new_session=True, stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            raise SystemExit(f"uvicorn exited with {server.returncode}")
        time.sleep(0.2)
    raise SystemExit("uvicorn did not come up in 60 s")


# --- subscribers (their own processes; no Django) -------------------------------------------

async def follow(url: str, token: str, ready: asyncio.Event) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    got: dict[str, Any] = {"seqs": [], "milestones": [], "latencies": [], "arrivals": [],
                           "made": [], "code": None}
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                       open_timeout=60, max_size=None) as ws:
        json.loads(await ws.recv())  # the snapshot
        ready.set()
        try:
            while True:
                try:
                    raw = await asyncio.wait_for(ws.recv(), STALL_SECONDS)
                except TimeoutError:
                    got["error"] = f"nothing for {STALL_SECONDS} s after seq {got['seqs'][-1:]}"
                    break
                now = time.time()
                event = json.loads(raw)
                got["seqs"].append(event["seq"])
                got["arrivals"].append(now)
                if event["type"] != "progress":
                    got["milestones"].append(event["seq"])
                if "t" in event:
                    got["latencies"].append(now - event["t"])
                    got["made"].append(event["t"])
        except ConnectionClosed:
            pass
        got["code"] = ws.close_code
    got["last"] = time.time()
    return got


def subscriber_proc(index: int, base: str, token: str, run_ids: list[str], ready: Any,
                    out: Any) -> None:
    async def main() -> None:
        flags = [asyncio.Event() for _ in run_ids]
        tasks = [asyncio.create_task(follow(f"{base}/v1/runs/{rid}/events?after=0", token, flag))
                 for rid, flag in zip(run_ids, flags, strict=True)]
        await asyncio.gather(*(f.wait() for f in flags))
        ready.release()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        got = [r if isinstance(r, dict) else {"error": repr(r), "seqs": []} for r in results]
        out.put((index, got, time.process_time()))

    asyncio.run(main())


# --- publishers (their own processes, one thread per run) ------------------------------------

def publisher_proc(run_ids: list[str], rate: float, seconds: float, ready: Any, go: Any,
                   start: Any, out: Any, mode: str = "flush") -> None:
    django_setup()
    from inline_farm.effects import _publisher, group_send_after_commit

    counts: list[int] = []
    appends: list[float] = []  # seconds from each event's making to its commit
    committed: dict[tuple[str, int], float] = {}  # (run, seq) → when its append returned
    # Warm up as a worker in the middle of its runs is: every thread holds its database
    # connection (a worker claimed its run on it) and the channel publisher is connected. Cold,
    # 50 threads connecting at once made the first second's p99 ~700 ms and the rest's ~150.
    warm = threading.Barrier(len(run_ids) + 1)
    threads = [threading.Thread(target=publish_run,
                                args=(rid, rate, seconds, (warm, go, start), counts, appends,
                                      committed, mode))
               for rid in run_ids]
    for t in threads:
        t.start()
    group_send_after_commit("bench.warm-up", {"type": "bench.warm_up"})  # a group of no one
    _publisher().flush()
    warm.wait()
    ready.release()
    for t in threads:
        t.join()
    finished = time.time()
    time.sleep(1.0)  # let effects.py's publisher thread send the last run_done before we exit
    out.put((sum(counts), finished, appends, committed))


def publish_run(run_id: str, rate: float, seconds: float, clock: tuple[Any, Any, Any],
                counts: list[int], appends: list[float],
                committed: dict[tuple[str, int], float], mode: str = "flush") -> None:
    """Publish one run's events as a worker would: `flush` buffers them like the executor
    (written when nothing was written for INLINE_EVENT_FLUSH_SECONDS or a node ends, in one
    fenced statement: `run_events_append_fenced`); `single` appends each in its own transaction
    (`run_event_append`, the worker's path before batching)."""
    from django.conf import settings
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.runs.events import run_event_append, run_events_append_fenced
    from apps.runs.models import Run, RunStatus

    buffer: list[tuple[str, dict[str, Any]]] = []
    written_at = [0.0]  # the last write (the run's start, below, as the claim is the executor's)

    def write(events: list[tuple[str, dict[str, Any]]]) -> None:
        seqs: Sequence[int | None]
        if mode == "single":
            rows = [run_event_append(run_id=run_id, type=t, payload=p) for t, p in events]
            seqs = [None if row is None else row.seq for row in rows]
        else:
            seqs = run_events_append_fenced(run_id=run_id, attempt=1, events=events) or []
        done = time.time()
        for (_, payload), seq in zip(events, seqs, strict=False):
            if seq is not None:
                appends.append(done - payload["t"])  # event made → committed
                committed[(run_id, seq)] = done
        events.clear()
        written_at[0] = done

    warm, go, start = clock
    connection.ensure_connection()
    warm.wait()
    go.wait()
    start_at = start.value
    time.sleep(max(0.0, start_at - time.time()))
    written_at[0] = time.time()
    step = 0
    while (now := time.time()) < start_at + seconds:
        step += 1
        node = f"n{int((now - start_at) * 4 / seconds)}"  # four "nodes", one after the other
        if step % 10 == 0:
            body = {"nodeId": node, "nodeType": "bench", "cached": False, "takes": []}
            buffer.append(("node_done", {**body, "t": now}))
            write(buffer)  # a node that took longer than the flush period: written as it ends
        else:
            buffer.append(("progress", {"nodeId": node, "step": step, "t": now}))
            if mode == "single" or now - written_at[0] >= settings.INLINE_EVENT_FLUSH_SECONDS:
                write(buffer)
        if rate:
            time.sleep(max(0.0, start_at + step / rate - time.time()))
    write(buffer)
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(
            status=RunStatus.SUCCEEDED, finished_at=timezone.now(), lease_expires_at=None
        )
        ended: dict[str, Any] = {"status": "succeeded", "takes": [], "error": None,
                                 "t": time.time()}
        run_event_append(run_id=run_id, type="run_done", payload=ended)
    counts.append(step + 1)
    connection.close()


# --- the report --------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def report(args: argparse.Namespace, results: list[dict[str, Any]], hot: list[dict[str, Any]],
           logs: dict[str, list[tuple[int, str]]], run_ids: list[str], published: int,
           started: float, publish_seconds: float) -> None:
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "last" in r]
    delivered = sum(len(r["seqs"]) for r in ok)
    latencies = [x for r in ok for x in r["latencies"]]
    elapsed = max(r["last"] for r in ok) - started
    hot_log = logs[run_ids[0]]
    hot_milestones = [seq for seq, kind in hot_log if kind != "progress"]
    complete = sum(r["milestones"] == hot_milestones for r in hot if "error" not in r)
    ordered = all(r["seqs"] == sorted(set(r["seqs"])) for r in ok)
    coalesced = sum(len(hot_log) - len(r["seqs"]) for r in hot if "error" not in r)
    print(f"subscribers: {args.subscribers} on run 0 + {args.runs - 1} (one per other run); "
          f"runs publishing: {args.runs} at {args.rate or 'max'} events/s for {args.seconds:g} s")
    print(f"published:   {published} events in {publish_seconds:.2f} s = "
          f"{published / publish_seconds:,.0f} events/s")
    print(f"delivered:   {delivered} events to {len(ok)} sockets in {elapsed:.2f} s = "
          f"{delivered / elapsed:,.0f} events/s")
    print(f"latency:     publish→receive p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms  (n={len(latencies)})")
    first = [lat for r in ok for made, lat in zip(r["made"], r["latencies"], strict=True)
             if made < started + 1.0]
    rest = [lat for r in ok for made, lat in zip(r["made"], r["latencies"], strict=True)
            if made >= started + 1.0]
    print(f"             p99 of events made in the first second {percentile(first, 0.99) * 1000:.1f}"
          f" ms, after it {percentile(rest, 0.99) * 1000:.1f} ms")
    print(f"hot run:     {complete}/{len(hot)} sockets got all {len(hot_milestones)} milestones "
          f"(node_done + run_done); progress coalesced for slow readers: {coalesced}")
    print(f"order:       every socket in seq order, no duplicates: {ordered}; close codes: "
          f"{sorted({r['code'] for r in ok})}; errors: {len(errors)} {errors[:3]}")
    if latencies:
        print(f"             mean latency {statistics.fmean(latencies) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rate", type=float, default=20.0,
                        help="events/s per run (0: as fast as each publisher can)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--publishers", type=int, default=5, help="publishing processes")
    parser.add_argument("--append", choices=("flush", "single"), default="flush",
                        help="flush: buffered like the executor, one statement per flush; "
                        "single: one transaction per event (before batching)")
    parser.add_argument("--client-procs", type=int, default=4, help="subscriber processes")
    args = parser.parse_args()

    django_setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    token_id, token, run_ids = create_runs(args.runs)
    connection.close()  # the child processes open their own
    port = free_port()
    server_log = Path(tempfile.mkdtemp(prefix="bench-events-")) / "uvicorn.log"
    say(f"server on port {port}, log {server_log}")
    server = start_server(port, server_log)
    ctx = mp.get_context("spawn")
    try:
        base = f"ws://127.0.0.1:{port}"
        follows = [run_ids[0]] * args.subscribers + run_ids[1:]
        hot_of = [i < args.subscribers for i in range(len(follows))]
        chunks = [list(range(i, len(follows), args.client_procs)) for i in range(args.client_procs)]
        ready, out = ctx.Semaphore(0), ctx.Queue()
        clients = [ctx.Process(target=subscriber_proc,
                               args=(n, base, token, [follows[i] for i in chunk], ready, out))
                   for n, chunk in enumerate(chunks)]
        for proc in clients:
            proc.start()
        for _ in clients:
            if not ready.acquire(timeout=120):
                raise SystemExit("subscribers did not all connect within 120 s")
        say(f"{len(follows)} subscribers connected")

        published_q, go, start = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
        publishers = [ctx.Process(target=publisher_proc, args=(
            run_ids[i::args.publishers], args.rate, args.seconds, ready, go, start, published_q,
            args.append))
            for i in range(args.publishers)]
        for proc in publishers:
            proc.start()
        for _ in publishers:
            if not ready.acquire(timeout=120):
                raise SystemExit("publishers did not start within 120 s")
        start.value = started = time.time() + 0.2  # all publishers start together
        go.set()
        say("publishing")
        counted = [published_q.get(timeout=args.seconds + 300) for _ in publishers]
        published = sum(count for count, *_ in counted)
        publish_seconds = max(finished for _, finished, *_ in counted) - started
        appends = [x for _, _, durations, _ in counted for x in durations]
        commits = {key: t for *_, times in counted for key, t in times.items()}
        say(f"published {published} events; waiting for the subscribers")
        gathered = sorted(out.get(timeout=300) for _ in clients)
        client_cpu = sum(cpu for _, _, cpu in gathered)
        server_cpu = cpu_seconds(server.pid)
        for proc in (*clients, *publishers):
            proc.join(timeout=30)

        results: list[dict[str, Any]] = [{}] * len(follows)
        for chunk, (_, got, _) in zip(chunks, gathered, strict=True):
            for i, r in zip(chunk, got, strict=True):
                results[i] = r
        hot = [r for r, is_hot in zip(results, hot_of, strict=True) if is_hot]
        from apps.runs.models import RunEvent

        logs: dict[str, list[tuple[int, str]]] = {rid: [] for rid in run_ids}
        for rid, seq, kind in RunEvent.objects.filter(run_id__in=run_ids).order_by(
            "run_id", "seq"
        ).values_list("run_id", "seq", "type"):
            logs[str(rid)].append((seq, kind))
        report(args, results, hot, logs, run_ids, published, started, publish_seconds)
        after_commit = [
            arrived - commits[(rid, seq)]
            for rid, r in zip(follows, results, strict=True) if "last" in r
            for seq, arrived in zip(r["seqs"], r["arrivals"], strict=True) if (rid, seq) in commits
        ]
        print(f"fan-out:     commit→receive p50 {percentile(after_commit, 0.5) * 1000:.1f} ms, "
              f"p99 {percentile(after_commit, 0.99) * 1000:.1f} ms (the part after Postgres)")
        how = {"flush": "buffered, one statement per flush",
               "single": "one transaction per event"}[args.append]
        print(f"written:     event made → committed ({args.append}: {how}) "
              f"p50 {percentile(appends, 0.5) * 1000:.1f} ms, "
              f"p99 {percentile(appends, 0.99) * 1000:.1f} ms in {args.publishers} processes × "
              f"{len(run_ids) // args.publishers} threads")
        print(f"cpu:         server (uvicorn) {server_cpu:.1f} s, subscriber processes "
              f"{client_cpu:.1f} s, on {os.cpu_count()} cores")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        delete_runs(run_ids, token_id)


if __name__ == "__main__":
    main()
