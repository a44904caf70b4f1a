"""Request and response schemas of the runs API (responses are built by apps/runs/wire.py and
declared here, so the OpenAPI schema tells a generated client every shape)."""

from __future__ import annotations

from ninja import Schema
from pydantic import ConfigDict, Field, StrictInt

from apps.graphs.schema import GraphDoc, Text
from apps.runs.models import RunStatus
from apps.takes.schemas import TakeOut
from inline_farm.schemas import ErrorBody, WireOut

MAX_OFFSET = 1_000_000_000  # far past any real listing, far below PostgreSQL's bigint


class RunIn(Schema):
    """`POST /v1/runs`: a graph, the node to produce, and optional idempotency key / priority."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    graph: GraphDoc
    target: Text = Field(min_length=1, max_length=200)
    client_run_id: Text | None = Field(default=None, alias="clientRunId", min_length=1,
                                       max_length=200)
    # Strict: JSON true/false and "5" are the wrong type, not a priority.
    priority: StrictInt = Field(default=0, ge=-100, le=100)


class RunListQuery(Schema):
    """`GET /v1/runs` query: status filter, only the caller's own runs, and the page window."""

    status: RunStatus | None = None
    mine: bool = Field(default=False, description="Only the caller's own runs (not teammates' "
                       "or, for staff, everyone's).")
    limit: int = Field(default=50, ge=1, le=200)
    offset: int = Field(default=0, ge=0, le=MAX_OFFSET)


class RunSubmitOut(WireOut):
    """`POST /v1/runs` → the run (201 new; 200 the same run again: idempotent or coalesced)."""

    runId: str
    status: str = Field(json_schema_extra={"enum": list(RunStatus.values)})
    created: bool


class ValueOut(WireOut):
    """A value a `util/preview` node showed: its kind, the value, and its text as ComfyUI's
    PreviewAny shows it."""

    nodeId: str
    nodeType: str
    kind: str = Field(json_schema_extra={"enum": ["text", "int", "float", "bool"]})
    value: str | int | float | bool
    text: str


class RunOut(WireOut):
    """A run's durable state with its takes (wire shape in DESIGN.md)."""

    id: str
    status: str = Field(json_schema_extra={"enum": list(RunStatus.values)})
    target: str
    clientRunId: str | None
    priority: int
    queue: str
    attempts: int
    graphSha256: str | None
    createdAt: str | None
    startedAt: str | None
    finishedAt: str | None
    lastSeq: int
    error: ErrorBody | None
    takes: list[TakeOut]
    values: list[ValueOut] = Field(
        default_factory=list,
        description="What the run's value previews (util/preview, ComfyUI's PreviewAny) showed: "
        "take-less results, written when the run ends.")
    waiting: str | None = Field(default=None, description="Why a queued run has not started.")
    peakMemoryBytes: int | None = Field(
        default=None, description="The worker's peak memory while the run ran: on a GPU, "
        "torch's allocated peak on the device; on a CPU, the worker process's resident memory.")
    estimatedMemoryGb: float | None = Field(
        default=None, description="The memory the farm estimated the run needs (model files "
        "plus its families' activations at its size), which routing compared with workers'; "
        "null for a run without model files.")


class RunListOut(WireOut):
    """One page of the caller's runs, newest first; `nextOffset` is null on the last page."""

    items: list[RunOut]
    limit: int
    offset: int
    nextOffset: int | None
