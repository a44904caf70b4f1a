"""The executor: runs a claimed run's target closure in topological order.

Cheap nodes run inline; node outputs are cached per worker (workers/nodecache.py) under a Merkle
key, so a repeated sub-graph is not recomputed. Cancellation (and loss of the attempt) is
checked between nodes and, through `ctx.progress`, between steps.

Events and takes are buffered and written in as few transactions as a client can tell apart: a
node that takes longer than INLINE_EVENT_FLUSH_SECONDS writes its `node_done` (and takes) as it
ends, progress is written at most every INLINE_EVENT_FLUSH_SECONDS, and a graph that runs in a
few milliseconds writes everything with its finish (`run_finish`: one transaction). Durability
is unchanged: what a client was told is in PostgreSQL, and what was not yet written is redone
by the next attempt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from PIL import Image

from apps.graphs.registry import descriptor_get
from apps.graphs.schema import GraphDoc, NodeSpec
from apps.graphs.validation import closure_order
from apps.runs.services import Claim, run_events_flush, run_is_current
from apps.takes.services import TakeDraft
from workers.faults import WorkerFault, db_retry, is_infrastructure_error
from workers.nodecache import NodeCache
from workers.png import png_encode
from workers.runners import RUNNERS, NodeContext, NodeFailed, RunCancelled

log = logging.getLogger(__name__)

UNCACHED_CATEGORIES = {"loaders"}  # models are cached by file hash in their own loaders


@dataclass
class Outcome:
    """How an attempt ended: `succeeded`, `failed` (with error), `cancelled` (no longer ours)
    or `fault` (the infrastructure failed under it: retry the run). `events` and `takes` are
    what is still to be written with the finish."""

    status: str
    error: dict[str, str] | None = None
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    takes: list[TakeDraft] = field(default_factory=list)


class CancelCheck:
    """`check()` raises RunCancelled once the attempt is no longer ours (cancelled, reaped).

    `lost` is set by the worker's presence thread (a cancel NOTIFY, or a lease renewal that no
    longer finds the attempt), so a check is free and a cancel stops the run at its next step;
    a query confirms ownership at most every FRESH_SECONDS in case a notification was missed.
    A fenced write that just succeeded confirms it too (`confirm()`).
    """

    FRESH_SECONDS = 1.0

    def __init__(self, claim: Claim, lost: threading.Event | None = None) -> None:
        self.claim = claim
        self.lost = lost if lost is not None else threading.Event()
        self._confirmed_at = time.monotonic()  # the claim itself proved ownership

    def confirm(self) -> None:
        self._confirmed_at = time.monotonic()

    def check(self) -> None:
        if self.lost.is_set():
            raise RunCancelled(f"run {self.claim.run_id} is no longer ours")
        if time.monotonic() - self._confirmed_at < self.FRESH_SECONDS:
            return
        if not db_retry(lambda: run_is_current(run_id=self.claim.run_id,
                                               attempt=self.claim.attempt)):
            self.lost.set()
            raise RunCancelled(f"run {self.claim.run_id} is no longer ours")
        self.confirm()


def execute(claim: Claim, *, cache: NodeCache, policy: Any, cancel: CancelCheck) -> Outcome:
    """Run the claim's target closure; never raises for a node's failure (it is the outcome)."""
    doc = GraphDoc.model_validate(claim.document)
    state = _RunState(claim=claim, doc=doc, cache=cache, policy=policy, cancel=cancel)
    try:
        for node_id in closure_order(doc, claim.target):
            cancel.check()
            state.run_node(node_id)
    except RunCancelled:
        return Outcome("cancelled")
    except WorkerFault as exc:
        return Outcome("fault", {"code": "worker_fault", "message": str(exc)})
    except _NodeError as exc:
        error = {"code": exc.code, "message": exc.message, "nodeId": exc.node_id}
        return Outcome("failed", error, state.events, state.takes)
    return Outcome("succeeded", None, state.events, state.takes)


class _NodeError(Exception):
    def __init__(self, code: str, message: str, node_id: str) -> None:
        super().__init__(message)
        self.code, self.message, self.node_id = code, message, node_id


@dataclass
class _RunState:
    claim: Claim
    doc: GraphDoc
    cache: NodeCache
    policy: Any
    cancel: CancelCheck
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    lineage: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # not yet written
    takes: list[TakeDraft] = field(default_factory=list)  # not yet written
    written_at: float = field(default_factory=time.monotonic)  # the last write (at first, the claim)

    def run_node(self, node_id: str) -> None:
        spec = self.doc.nodes[node_id]
        descriptor = descriptor_get(spec.type)
        assert descriptor is not None  # validated at submit
        key = node_key(spec, self.keys, scope=self.claim.owner_id,
                       content=_model_contents(spec, descriptor))
        upstream = _merge(self.lineage[ref.node] for ref in spec.inputs.values())
        cacheable = not descriptor.produces_takes and descriptor.category not in UNCACHED_CATEGORIES
        hit = self.cache.get(key) if cacheable else None
        started = time.perf_counter()
        slots: list[list[Any]] = []
        if hit is not None:
            outputs, own = hit
        else:
            outputs, own, slots = self._compute(node_id, spec, upstream)
            if cacheable:
                self.cache.put(key, outputs, own)
        self.keys[node_id] = key
        self.outputs[node_id] = outputs
        self.lineage[node_id] = {**upstream, **own}
        took = time.perf_counter() - started
        self._append("node_done", {
            "nodeId": node_id, "nodeType": spec.type, "cached": hit is not None,
            "takeSlots": slots, "ms": round(took * 1000, 1),
        }, slow=took >= settings.INLINE_EVENT_FLUSH_SECONDS)

    def _compute(
        self, node_id: str, spec: NodeSpec, upstream: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], list[list[Any]]]:
        ctx = NodeContext(
            run_id=self.claim.run_id, node_id=node_id, node_type=spec.type,
            graph_sha256=self.claim.graph_sha256, models_dir=Path(settings.INLINE_MODELS_DIR),
            owner_id=self.claim.owner_id, policy=self.policy, check_cancelled=self.cancel.check,
            report_progress=lambda step, total, preview, batch: self._progress(
                node_id, step, total, preview, batch),
        )
        inputs = {name: self.outputs[ref.node][ref.port] for name, ref in spec.inputs.items()}
        try:
            outputs = RUNNERS[spec.type](ctx, dict(spec.params), inputs)
        except (RunCancelled, _NodeError, WorkerFault):
            raise
        except NodeFailed as exc:
            raise _NodeError("node_failed", f"{spec.type}: {exc}", node_id) from None
        except Exception as exc:
            if is_infrastructure_error(exc):  # the farm's fault, not the node's: retry the run
                raise WorkerFault(f"{type(exc).__name__} in {node_id}: {exc}") from exc
            log.exception("node %s (%s) of run %s raised", node_id, spec.type, self.claim.run_id)
            raise _NodeError(
                "node_failed", f"{spec.type}: {type(exc).__name__}: {exc}", node_id
            ) from None
        lineage = {**upstream, **ctx.lineage}
        slots = [self._keep(node_id, spec, i, t.image, {**lineage, **t.metadata})
                 for i, t in enumerate(ctx.takes)]
        return outputs, ctx.lineage, slots

    def _keep(self, node_id: str, spec: NodeSpec, index: int, image: Image.Image,
              facts: dict[str, Any]) -> list[Any]:
        self.cancel.check()  # a cancelled run keeps no new takes
        lineage = {"graphSha256": self.claim.graph_sha256, "nodeType": spec.type, **facts}
        seed = lineage.get("seed")
        self.takes.append(TakeDraft(
            node_id=node_id, index=index, data=png_bytes(image, lineage), media_type="image/png",
            width=image.width, height=image.height, seed=seed if isinstance(seed, int) else None,
            lineage=lineage,
        ))
        return [node_id, index]

    def _progress(self, node_id: str, step: int, total: int, preview: bytes | None,
                  batch: int | None = None) -> None:
        payload: dict[str, Any] = {"nodeId": node_id, "step": step, "total": total}
        if batch is not None:
            payload["batch"] = batch  # how many runs shared the forward that made this step
        if preview:
            import base64

            payload["preview"] = "data:image/png;base64," + base64.b64encode(preview).decode()
        self._append("progress", payload)
        self.cancel.check()

    def _append(self, type: str, payload: dict[str, Any], *, slow: bool = False) -> None:
        """Buffer an event; write the buffer when this one ends a slow node, or when nothing was
        written for INLINE_EVENT_FLUSH_SECONDS. So a run writes at most that often, and an event
        after a quiet spell (a slow sampling step's progress) is written at once: the rule was
        the oldest buffered event's age, which held every other slow step's progress (and its
        preview) back until the next step ended."""
        self.events.append((type, payload))
        if slow or time.monotonic() - self.written_at >= settings.INLINE_EVENT_FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write buffered events and takes (fenced); RunCancelled once the run is not ours."""
        events, takes = self.events, self.takes
        try:
            written = db_retry(lambda: run_events_flush(claim=self.claim, events=events,
                                                        takes=takes))
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise WorkerFault(f"writing events failed: {type(exc).__name__}: {exc}") from exc
            raise
        if written is None:
            self.cancel.lost.set()
            raise RunCancelled(f"run {self.claim.run_id} is no longer ours")
        self.events, self.takes = [], []
        self.written_at = time.monotonic()
        self.cancel.confirm()


def node_key(
    spec: NodeSpec, keys: dict[str, str], *, scope: Any = None, content: dict[str, str] | None = None
) -> str:
    """Merkle key of a node: its type, params, the keys + ports of what feeds it, the content
    hashes of the model files it names (other bytes under the same file name are another key),
    and the scope (owner) whose cache it may hit."""
    body = {
        "scope": scope,
        "content": content or {},
        "type": spec.type,
        "params": spec.params,
        "inputs": {name: [keys[ref.node], ref.port] for name, ref in sorted(spec.inputs.items())},
    }
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _model_contents(spec: NodeSpec, descriptor: Any) -> dict[str, str]:
    """sha256 of each model file the node's params name (cached by path, size and mtime, so
    this stats files, it does not re-read them); a missing file is left to the runner's error."""
    from workers.models.catalog import ModelFileMissing, file_sha256, resolve

    hashes = {}
    for param in descriptor.params:
        value = spec.params.get(param.name)
        if param.type != "model" or not param.options_from or not isinstance(value, str):
            continue
        try:
            path = resolve(Path(settings.INLINE_MODELS_DIR), param.options_from, value)
            hashes[f"{param.options_from}/{value}"] = file_sha256(path)
        except (ModelFileMissing, OSError, ValueError):
            continue
    return hashes


def png_bytes(image: Image.Image, lineage: dict[str, Any]) -> bytes:
    """PNG-encode `image` with the generation parameters in an `inline-farm` text chunk."""
    return png_encode(image, {"inline-farm": json.dumps(lineage, sort_keys=True, default=str)})


def _merge(parts: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged
