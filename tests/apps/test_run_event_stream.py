"""The websocket stream's ordering and backpressure rules (apps/runs/stream.py), on a fake log."""

from __future__ import annotations

import asyncio
from typing import Any

from apps.runs.stream import Outbox, RunEventStream


def event(seq: int, type: str = "progress", node: str = "n") -> dict[str, Any]:
    return {"type": type, "runId": "r", "seq": seq, "nodeId": node}


class FakeRun:
    """A run's log plus one client's socket; `gate` cleared = a client that stopped reading."""

    def __init__(self, *, status: str = "running") -> None:
        self.log: list[dict[str, Any]] = []
        self.status = status
        self.received: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    def append(self, type: str = "progress", node: str = "n") -> dict[str, Any]:
        self.log.append(event(len(self.log) + 1, type, node))
        return self.log[-1]

    async def load_snapshot(self) -> dict[str, Any]:
        done = next((e["seq"] for e in self.log if e["type"] == "run_done"), None)
        return {"run": {"status": self.status}, "lastSeq": len(self.log), "doneSeq": done}

    async def load_events(self, *, after: int, before: int | None, limit: int) -> list[dict]:
        return [e for e in self.log if e["seq"] > after and (before is None or e["seq"] < before)][
            :limit
        ]

    async def send(self, message: dict[str, Any]) -> None:
        await self.gate.wait()
        self.received.append(message)

    def stream(self, after: int | None = None, **limits: Any) -> RunEventStream:
        return RunEventStream(run_id="r", after=after, load_snapshot=self.load_snapshot,
                              load_events=self.load_events, send=self.send, **limits)

    def seqs(self) -> list[int]:
        return [m["seq"] for m in self.received[1:]]


def test_progress_is_coalesced_only_under_pressure():
    box = Outbox(limit=100, coalesce_at=3)
    for seq in (1, 2):
        box.put(event(seq), sent=0)
    assert sorted(box.pending) == [1, 2]  # below the threshold nothing is merged
    box.put(event(3, "node_done"), sent=0)
    box.put(event(4), sent=0)  # now 3 pending: the newest progress of `n` replaces the older
    assert sorted(box.pending) == [1, 3, 4] and box.coalesced == {2}
    assert not box.has_gap(sent=1, seq=3) and box.has_gap(sent=0, seq=3)


def test_a_full_outbox_turns_live_events_away_but_remembers_it():
    box = Outbox(limit=2, coalesce_at=10)
    for seq in (1, 2, 3):
        box.put(event(seq, "node_done", node=str(seq)), sent=0)
    assert sorted(box.pending) == [1, 2] and box.overflowed


def test_replay_then_live_events_arrive_once_each_without_gaps():
    async def scenario() -> list[int]:
        run = FakeRun()
        for _ in range(10):
            run.append()
        stream = run.stream(after=3, idle_seconds=5)
        task = asyncio.create_task(stream.run())
        for e in run.log[4:7]:  # duplicates of what the replay sends
            stream.put(e)
        await asyncio.sleep(0.01)
        run.append("node_done")  # 11: lost by the channel layer
        stream.put(run.append())  # 12 arrives live and reveals the gap
        stream.put(run.log[9])  # a late duplicate
        stream.put(run.append("run_done"))
        await asyncio.wait_for(task, 2)
        return run.seqs()

    assert asyncio.run(scenario()) == list(range(4, 14))


def test_a_lost_last_message_is_read_from_the_log_when_things_go_quiet():
    async def scenario() -> list[dict]:
        run = FakeRun()
        stream = run.stream(idle_seconds=0.05)
        task = asyncio.create_task(stream.run())
        await asyncio.sleep(0.01)
        stream.put(run.append("node_done"))
        run.append("run_done")  # never delivered live
        await asyncio.wait_for(task, 2)
        return run.received

    received = asyncio.run(scenario())
    assert [m["type"] for m in received] == ["snapshot", "node_done", "run_done"]


def test_a_slow_client_gets_every_milestone_and_the_latest_progress_in_order():
    async def scenario() -> tuple[FakeRun, RunEventStream]:
        run = FakeRun()
        stream = run.stream(idle_seconds=5, limit=8, coalesce_at=4)
        task = asyncio.create_task(stream.run())
        await asyncio.sleep(0.01)
        run.gate.clear()  # the client stops reading
        for node in "abcdefghijkl":  # more milestones than the outbox holds
            for _ in range(20):
                stream.put(run.append("progress", node))
            stream.put(run.append("node_done", node))
            await asyncio.sleep(0)
        stream.put(run.append("run_done"))
        assert len(stream.outbox.pending) <= 8
        run.gate.set()
        await asyncio.wait_for(task, 2)
        return run, stream

    run, stream = asyncio.run(scenario())
    seqs = run.seqs()
    assert seqs == sorted(set(seqs))  # in order, never twice
    milestones = [e["seq"] for e in run.log if e["type"] != "progress"]
    assert set(milestones) <= set(seqs) and seqs[-1] == run.log[-1]["seq"]
    assert len(seqs) < len(run.log) and stream.outbox.coalesced_total > 0
    assert stream.outbox.turned_away_total > 0  # … and those came back from the log


def test_a_finished_run_replays_only_its_run_done_to_a_newcomer():
    async def scenario(after: int | None) -> list[str]:
        run = FakeRun(status="succeeded")
        for type in ("status", "node_done", "run_done"):
            run.append(type)
        await asyncio.wait_for(run.stream(after=after).run(), 2)
        return [m["type"] for m in run.received]

    assert asyncio.run(scenario(None)) == ["snapshot", "run_done"]
    assert asyncio.run(scenario(1)) == ["snapshot", "node_done", "run_done"]
    assert asyncio.run(scenario(3)) == ["snapshot"]


def test_the_publisher_folds_consecutive_run_events_in_order():
    from inline_farm.effects import merge_run_events

    def event(seq):
        return {"type": "run.event", "event": {"seq": seq}}

    other = {"type": "other", "x": 1}
    merged = merge_run_events([event(1), event(2), other, event(3)])
    assert merged == [
        {"type": "run.events", "events": [{"seq": 1}, {"seq": 2}]}, other, event(3),
    ]


def test_an_after_beyond_the_log_s_end_resumes_from_the_end_and_still_ends_with_run_done():
    """No client can have seen a seq past the snapshot's lastSeq (seqs are sent only once
    committed), so `after` > lastSeq is read as lastSeq: the client gets every later event and
    the stream still ends at run_done (it used to drop them all and never end)."""

    async def scenario() -> tuple[list[int], int]:
        run = FakeRun()
        for _ in range(3):
            run.append()
        stream = run.stream(after=50, idle_seconds=0.05)
        task = asyncio.create_task(stream.run())
        await asyncio.sleep(0.01)
        stream.put(run.append("node_done"))  # 4
        stream.put(run.append("run_done"))  # 5
        await asyncio.wait_for(task, timeout=10)
        return run.seqs(), run.received[0]["lastSeq"]

    seqs, last = asyncio.run(scenario())
    assert (last, seqs) == (3, [4, 5])


def test_an_after_beyond_a_finished_run_s_end_gets_the_snapshot_only():
    async def scenario() -> list[dict[str, Any]]:
        run = FakeRun(status="succeeded")
        run.append()
        run.append("run_done")
        await asyncio.wait_for(run.stream(after=99).run(), timeout=30)
        return run.received

    received = asyncio.run(scenario())
    assert [m["type"] for m in received] == ["snapshot"]
    assert received[0]["run"]["status"] == "succeeded" and received[0]["lastSeq"] == 2
