"""The executor: runs a claimed run's target closure in topological order.

Cheap nodes run inline; node outputs are cached per worker (workers/nodecache.py) under a Merkle
key, so a repeated sub-graph is not recomputed. Cancellation (and loss of the attempt) is
checked between nodes and, through `ctx.progress`, between steps.

Lazy inputs (a switch's branches, the descriptor's `lazy`) are planned as the run goes: a lazy
node's other inputs run first, its chooser (workers/runners/base.py `CHOOSERS`) names the lazy
inputs it needs, and only their upstream joins the plan. A branch not chosen is never
executed, cached or reported (no `node_done`). Value previews (`util/preview`) run after the
target once every input they read was computed; what they show is the run's `values`.

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

from apps.graphs.descriptors import NodeDescriptor
from apps.graphs.registry import descriptor_get
from apps.graphs.schema import GraphDoc, NodeSpec
from apps.graphs.validation import GraphInvalid, closure_order, param_value_check, preview_nodes
from apps.runs.services import Claim, run_events_flush, run_is_current
from apps.takes.services import ClipFacts, TakeDraft
from workers.faults import WorkerFault, db_retry, is_infrastructure_error
from workers.nodecache import NodeCache
from workers.png import png_encode
from workers.runners import CHOOSERS, RUNNERS, NodeContext, NodeFailed, RunCancelled
from workers.runners.base import TakeRequest
from workers.takeformat import take_encode

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
    values: list[dict[str, Any]] = field(default_factory=list)  # what util/preview nodes showed


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
        state.run_closure(claim.target)
        state.run_previews()
    except RunCancelled:
        return Outcome("cancelled")
    except WorkerFault as exc:
        return Outcome("fault", {"code": "worker_fault", "message": str(exc)})
    except _NodeError as exc:
        error = {"code": exc.code, "message": exc.message, "nodeId": exc.node_id}
        return Outcome("failed", error, state.events, state.takes, state.values)
    return Outcome("succeeded", None, state.events, state.takes, state.values)


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
    values: list[dict[str, Any]] = field(default_factory=list)  # shown by util/preview nodes
    written_at: float = field(default_factory=time.monotonic)  # the last write (at first, the claim)
    # lazy node → the lazy inputs its chooser asked for (absent: not decided yet)
    chosen: dict[str, frozenset[str]] = field(default_factory=dict)

    def run_closure(self, target: str) -> None:
        """Run `target`'s closure, deciding lazy nodes as they are reached: a lazy node whose
        other inputs are done asks its chooser, the plan is redrawn with the chosen inputs'
        upstream, and the walk resumes (nodes already run are skipped)."""
        order = closure_order(self.doc, target, self.chosen)
        index = 0
        while index < len(order):
            node_id = order[index]
            index += 1
            if node_id in self.outputs:
                continue
            descriptor = self._descriptor(node_id)
            if descriptor.lazy and node_id not in self.chosen:
                self.chosen[node_id] = self._choose(node_id, descriptor)
                order, index = closure_order(self.doc, target, self.chosen), 0
                continue
            self.cancel.check()
            self.run_node(node_id)

    def run_previews(self) -> None:
        """Every value preview whose inputs were all computed (on the chosen branches)."""
        for node_id in preview_nodes(self.doc):
            refs = self.doc.nodes[node_id].inputs.values()
            if node_id not in self.outputs and all(ref.node in self.outputs for ref in refs):
                self.cancel.check()
                self.run_node(node_id)

    def _descriptor(self, node_id: str) -> NodeDescriptor:
        descriptor = descriptor_get(self.doc.nodes[node_id].type)
        assert descriptor is not None  # validated at submit
        return descriptor

    def _choose(self, node_id: str, descriptor: NodeDescriptor) -> frozenset[str]:
        spec = self._spec(node_id)  # its non-lazy inputs: computed, as the plan put them first
        inputs = self._inputs(spec)
        return CHOOSERS[spec.type](self._params(node_id, spec, descriptor, inputs), inputs)

    def _spec(self, node_id: str) -> NodeSpec:
        """The node as it runs: a lazy node reads only the lazy inputs it chose (so its cache
        key and lineage are those of the branch that ran)."""
        spec = self.doc.nodes[node_id]
        lazy = self._descriptor(node_id).lazy
        if not lazy:
            return spec
        asked = self.chosen.get(node_id, frozenset())
        inputs = {name: ref for name, ref in spec.inputs.items()
                  if name not in lazy or name in asked}
        return spec.model_copy(update={"inputs": inputs})

    def _inputs(self, spec: NodeSpec) -> dict[str, Any]:
        return {name: self.outputs[ref.node][ref.port] for name, ref in spec.inputs.items()}

    def _params(self, node_id: str, spec: NodeSpec, descriptor: NodeDescriptor,
                inputs: dict[str, Any]) -> dict[str, Any]:
        """The node's params with each wired one replaced by the value that arrived, checked
        against the param's limits as a submitted value is (a 422's checks, as a failed run)."""
        params = dict(spec.params)
        for param in descriptor.params:
            if param.input is None or param.input not in inputs:
                continue
            try:
                params[param.name] = param_value_check(node_id, param, inputs[param.input])
            except GraphInvalid as exc:
                raise _NodeError(exc.code, f"{spec.type}: {exc.message} (from input "
                                 f"{param.input!r})", node_id) from None
        return params

    def run_node(self, node_id: str) -> None:
        spec = self._spec(node_id)
        descriptor = self._descriptor(node_id)
        key = node_key(spec, self.keys, scope=self.claim.owner_id,
                       content=_model_contents(spec, descriptor))
        upstream = _merge(self.lineage[ref.node] for ref in spec.inputs.values())
        cacheable = (not descriptor.produces_takes and not descriptor.shows_value
                     and descriptor.category not in UNCACHED_CATEGORIES)
        hit = self.cache.get(key) if cacheable else None
        started = time.perf_counter()
        slots: list[list[Any]] = []
        shown: list[Any] = []
        if hit is not None:
            outputs, own = hit
        else:
            outputs, own, slots, shown = self._compute(node_id, spec, descriptor, upstream)
            if cacheable:
                self.cache.put(key, outputs, own)
        self.keys[node_id] = key
        self.outputs[node_id] = outputs
        self.lineage[node_id] = {**upstream, **own}
        took = time.perf_counter() - started
        payload = {"nodeId": node_id, "nodeType": spec.type, "cached": hit is not None,
                   "takeSlots": slots, "ms": round(took * 1000, 1)}
        for value in shown:
            shows = value_to_wire(node_id, spec.type, value)
            self.values.append(shows)
            payload["value"] = {k: v for k, v in shows.items() if k not in ("nodeId", "nodeType")}
        self._append("node_done", payload, slow=took >= settings.INLINE_EVENT_FLUSH_SECONDS)

    def _compute(
        self, node_id: str, spec: NodeSpec, descriptor: NodeDescriptor, upstream: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], list[list[Any]], list[Any]]:
        ctx = NodeContext(
            run_id=self.claim.run_id, node_id=node_id, node_type=spec.type,
            graph_sha256=self.claim.graph_sha256, models_dir=Path(settings.INLINE_MODELS_DIR),
            owner_id=self.claim.owner_id, policy=self.policy, check_cancelled=self.cancel.check,
            report_progress=lambda step, total, preview, batch, frames=None: self._progress(
                node_id, step, total, preview, batch, frames),
        )
        inputs = self._inputs(spec)
        params = self._params(node_id, spec, descriptor, inputs)
        try:
            outputs = RUNNERS[spec.type](ctx, params, inputs)
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
        slots = [self._keep(node_id, spec, i, t, {**lineage, **t.metadata})
                 for i, t in enumerate(ctx.takes)]
        return outputs, ctx.lineage, slots, ctx.shown

    def _keep(self, node_id: str, spec: NodeSpec, index: int, take: TakeRequest,
              facts: dict[str, Any]) -> list[Any]:
        self.cancel.check()  # a cancelled run keeps no new takes
        lineage = {"graphSha256": self.claim.graph_sha256, "nodeType": spec.type, **facts}
        seed = lineage.get("seed")
        if take.video is not None:
            self.takes.append(_clip_draft(node_id, index, take, lineage,
                                          seed if isinstance(seed, int) else None))
            return [node_id, index]
        image: Image.Image = take.image
        if take.format == "png":
            data, media_type = png_bytes(image, lineage), "image/png"
        else:
            data, media_type = take_encode(image, take.format, take.quality, _lineage_text(lineage))
        self.takes.append(TakeDraft(
            node_id=node_id, index=index, data=data, media_type=media_type,
            width=image.width, height=image.height, seed=seed if isinstance(seed, int) else None,
            lineage=lineage,
        ))
        return [node_id, index]

    def _progress(self, node_id: str, step: int, total: int, preview: bytes | None,
                  batch: int | None = None, frames: int | None = None) -> None:
        payload: dict[str, Any] = {"nodeId": node_id, "step": step, "total": total}
        if batch is not None:
            payload["batch"] = batch  # how many runs shared the forward that made this step
        if frames is not None:
            payload["frames"] = frames  # a video sampler: the frames of the clip it makes
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
    return png_encode(image, {"inline-farm": _lineage_text(lineage)})


def _clip_draft(node_id: str, index: int, take: TakeRequest, lineage: dict[str, Any],
                seed: int | None) -> TakeDraft:
    """A video take's draft: encoded straight into a staged blob file (workers/video.py)."""
    from apps.takes.storage import blob_stage_file, file_sha256
    from workers.video import clip_encode

    path = blob_stage_file()
    try:
        facts = clip_encode(take.video, path, format=take.format, crf=take.crf,
                            quality=take.quality, lossless=take.lossless,
                            comment=_lineage_text(lineage))
        clip = ClipFacts(sha256=file_sha256(path), size=path.stat().st_size,
                         frame_count=facts.frame_count, fps=facts.fps,
                         duration_seconds=facts.duration_seconds,
                         audio_seconds=facts.audio_seconds)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return TakeDraft(node_id=node_id, index=index, data=b"", media_type=facts.media_type,
                     width=facts.width, height=facts.height, seed=seed, lineage=lineage,
                     file=path, clip=clip)


def _lineage_text(lineage: dict[str, Any]) -> str:
    return json.dumps(lineage, sort_keys=True, default=str)


def value_to_wire(node_id: str, node_type: str, value: Any) -> dict[str, Any]:
    """A shown value as the run's `values` hold it: its kind, the value, and the text ComfyUI's
    PreviewAny would show."""
    kind = ("bool" if isinstance(value, bool) else "int" if isinstance(value, int)
            else "float" if isinstance(value, float) else "text")
    text = value if isinstance(value, str) else str(value)
    return {"nodeId": node_id, "nodeType": node_type, "kind": kind,
            "value": value if kind != "text" else text, "text": text}


def _merge(parts: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged
