"""What one websocket client of a run receives, in order: a snapshot, the log after `after`, then
live events. No sockets and no ORM here: the consumer hands in how to load and how to send, so
the ordering and backpressure rules are tested on their own (tests/apps/test_run_event_stream.py).

No gap, no duplicate
    The consumer subscribes to the run's live events (fanout.py) *before* the snapshot is read, so
    every event logged after the snapshot also arrives live, unless the channel layer drops it.
    `sent` is the highest seq the client has been given (or that was coalesced away); nothing with
    seq <= `sent` is sent again, and before a live event with seq > sent + 1 goes out, the missing
    seqs are read from the log. That read always finds them: seqs are handed out under the run's
    row lock and published after commit, so when seq N arrives live every seq below N is
    committed. A lost *last* message has no later event to reveal it, so a stream that has heard
    nothing for `idle_seconds` reads the log once more. While the channel layer is down the
    fan-out feeds `put` from the log instead (fanout.py); when it cannot read the log either it
    calls `recheck`, and the stream's own read then either succeeds or ends `run` with its error.

Backpressure
    Live events land in a per-connection `Outbox` (the fan-out never awaits a socket) and
    one task sends from it at the client's pace (the server's send waits while the socket's write
    buffer is full). Past `coalesce_at` pending events, a new progress event replaces the pending
    progress of the same node (keep the latest). Past `limit`, live events are not queued at all:
    the outbox notes the overflow and the stream reads them back from the log once it has drained.
    So node_done / run_done / status are never lost, only delayed, and the worker and the other
    clients never wait for a slow one. Reads from the log go out as they are, page by page at the
    client's pace: one page in memory at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from apps.runs.models import TERMINAL

Event = dict[str, Any]
LoadEvents = Callable[..., Awaitable[list[Event]]]  # (after=, before=, limit=) → wire events
LoadSnapshot = Callable[[], Awaitable[dict[str, Any]]]  # → selectors.run_snapshot's dict
Send = Callable[[Event], Awaitable[None]]


class Outbox:
    """Live events not yet sent to one client: bounded, in seq order, progress coalesced.

    Not thread-safe: `put` and `pop` run on the connection's event loop.
    """

    def __init__(self, *, limit: int, coalesce_at: int) -> None:
        self.limit, self.coalesce_at = limit, coalesce_at
        self.pending: dict[int, Event] = {}
        self.progress_of: dict[Any, int] = {}  # nodeId → seq of its newest pending progress
        self.coalesced: set[int] = set()  # seqs replaced by a newer progress of the same node
        self.overflowed = False  # live events were turned away: read the log once drained
        self.coalesced_total = 0  # counters, for logs and the benchmark
        self.turned_away_total = 0

    def put(self, event: Event, *, sent: int) -> None:
        seq = event["seq"]
        if seq <= sent or seq in self.pending or seq in self.coalesced:
            return
        if event["type"] == "progress" and self._coalesce(event):
            return
        if len(self.pending) >= self.limit:
            self.overflowed = True
            self.turned_away_total += 1
            return
        self.pending[seq] = event
        if event["type"] == "progress":
            node = event.get("nodeId")
            self.progress_of[node] = max(seq, self.progress_of.get(node, 0))

    def _coalesce(self, event: Event) -> bool:
        """Under pressure, keep only the newest progress of a node; True if `event` was handled."""
        node, seq = event.get("nodeId"), event["seq"]
        older = self.progress_of.get(node)
        if older is None or len(self.pending) < self.coalesce_at:
            return False
        if len(self.coalesced) >= self.limit:
            # Bound the bookkeeping too; forgotten seqs are simply read back from the log.
            self.coalesced.clear()
        self.coalesced_total += 1
        if older > seq:  # arrived out of order: the pending one is already newer
            self.coalesced.add(seq)
            return True
        del self.pending[older]
        self.coalesced.add(older)
        self.pending[seq] = event
        self.progress_of[node] = seq
        return True

    def pop(self, *, sent: int) -> Event | None:
        """The pending event with the lowest seq above `sent`, or None; older ones are dropped."""
        while self.pending:
            seq = min(self.pending)
            event = self.pending.pop(seq)
            if event["type"] == "progress" and self.progress_of.get(event.get("nodeId")) == seq:
                del self.progress_of[event.get("nodeId")]
            if seq > sent:
                return event
        return None

    def has_gap(self, *, sent: int, seq: int) -> bool:
        """Whether some seq between `sent` and `seq` was neither sent nor coalesced away."""
        skipped = sum(1 for s in self.coalesced if sent < s < seq)
        return seq - sent - 1 > skipped

    def forget_through(self, sent: int) -> None:
        if self.coalesced:
            self.coalesced = {s for s in self.coalesced if s > sent}


class RunEventStream:
    """Feeds one client: `put` takes live events (never blocks); `run` sends until run_done.

    `run` returns once the run's `run_done` has been sent (or the run had already ended before
    `after`); the caller then closes the socket. Exceptions from `send` propagate.
    """

    def __init__(
        self, *, run_id: str, after: int | None, load_snapshot: LoadSnapshot,
        load_events: LoadEvents, send: Send, idle_seconds: float = 5.0, page: int = 500,
        limit: int = 1000, coalesce_at: int = 64,
    ) -> None:
        self.run_id, self.after = run_id, after
        self.load_snapshot, self.load_events, self.send = load_snapshot, load_events, send
        self.idle_seconds, self.page = idle_seconds, page
        self.outbox = Outbox(limit=limit, coalesce_at=coalesce_at)
        self.sent = 0
        self.finished = False
        self._recheck = False
        self._wake = asyncio.Event()
        # The idle rule: one timer per stream that re-arms itself, not one per wait (a timer
        # scheduled and cancelled per event was ~6% of the web's CPU in bench/events.py).
        self._waiting_since: float | None = None
        self._quiet = False
        self._idle_timer: asyncio.TimerHandle | None = None

    def put(self, event: Event) -> None:
        """A live event from the channel layer (called on the connection's event loop)."""
        self.outbox.put(event, sent=self.sent)
        self._wake.set()

    def recheck(self) -> None:
        """Read the log now (the fan-out could not): if this read fails too, `run` raises."""
        self._recheck = True
        self._wake.set()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self._idle_timer is not None:
                self._idle_timer.cancel()

    async def _run(self) -> None:
        last = await self._open()
        if last is None:
            return
        if self.sent < last:  # replay; past `last`, everything also arrives live
            await self._catch_up()
        while not self.finished:
            if self._recheck:
                self._recheck = False
                await self._catch_up()
                continue
            event = self.outbox.pop(sent=self.sent)
            if event is not None:
                if self.outbox.has_gap(sent=self.sent, seq=event["seq"]):
                    await self._catch_up(before=event["seq"])
                if not self.finished and event["seq"] > self.sent:
                    await self._send_event(event)
            elif self.outbox.overflowed:
                self.outbox.overflowed = False
                await self._catch_up()
            elif not await self._woken():
                await self._catch_up()  # quiet for a while: a lost last message would hide here

    async def _open(self) -> int | None:
        """Send the snapshot and decide where the stream starts: the snapshot's lastSeq, or None
        when nothing will follow (the run ended at or before where the client starts)."""
        snapshot = await self.load_snapshot()
        last, done = snapshot["lastSeq"], snapshot["doneSeq"]
        await self.send({"type": "snapshot", "runId": self.run_id, "seq": last, "lastSeq": last,
                         "run": snapshot["run"]})
        if self.after is not None:
            # No client saw a seq past `last` (seqs go out once committed): a larger `after` is
            # read as `last`, or every later event, run_done included, would be dropped.
            self.sent = min(self.after, int(last))
        else:
            # A finished run still tells a newcomer how it ended: replay its run_done.
            self.sent = done - 1 if done is not None else last
        ended_without_log = done is None and snapshot["run"]["status"] in TERMINAL
        if ended_without_log or (done is not None and self.sent >= done):
            return None
        return int(last)

    async def _catch_up(self, before: int | None = None) -> None:
        """Send what the log holds after `sent` (below `before`), a page at a time."""
        while not self.finished:
            events = await self.load_events(after=self.sent, before=before, limit=self.page)
            for event in events:
                if event["seq"] in self.outbox.coalesced:
                    self.sent = event["seq"]
                    continue
                await self._send_event(event)
                if self.finished:
                    return
            if len(events) < self.page:
                return

    async def _send_event(self, event: Event) -> None:
        await self.send(event)
        self.sent = event["seq"]
        self.outbox.forget_through(self.sent)
        self.finished = event["type"] == "run_done"

    async def _woken(self) -> bool:
        """Wait for a live event; False after `idle_seconds` of silence."""
        self._wake.clear()
        loop = asyncio.get_running_loop()
        self._waiting_since = loop.time()
        if self._idle_timer is None:
            self._idle_timer = loop.call_at(self._waiting_since + self.idle_seconds,
                                            self._idle_check)
        try:
            await self._wake.wait()
        finally:
            self._waiting_since = None
        if self._quiet:
            self._quiet = False
            return False
        return True

    def _idle_check(self) -> None:
        """The stream's timer: end a wait that has lasted `idle_seconds`, else fire again when
        the current (or next) wait would reach it."""
        loop = asyncio.get_running_loop()
        since = self._waiting_since
        if since is not None and loop.time() - since >= self.idle_seconds:
            self._quiet = True
            self._wake.set()
            self._idle_timer = None  # the next wait arms it again
            return
        at = (since if since is not None else loop.time()) + self.idle_seconds
        self._idle_timer = loop.call_at(at, self._idle_check)
