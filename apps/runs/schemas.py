"""Request bodies of the runs API (responses are built by apps/runs/wire.py)."""

from __future__ import annotations

from ninja import Schema
from pydantic import ConfigDict, Field

from apps.graphs.schema import GraphDoc


class RunIn(Schema):
    """`POST /v1/runs`: a graph, the node to produce, and optional idempotency key / priority."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    graph: GraphDoc
    target: str = Field(min_length=1, max_length=200)
    client_run_id: str | None = Field(default=None, alias="clientRunId", min_length=1,
                                      max_length=200)
    priority: int = Field(default=0, ge=-100, le=100)
