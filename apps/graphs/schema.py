"""The typed graph document (wire format in DESIGN.md) and its canonical hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class InputRef(BaseModel):
    """The one upstream output that feeds an input: `{node, port}`."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=200)
    port: str = Field(min_length=1, max_length=100)


class NodeSpec(BaseModel):
    """One node of a graph: its type, named params and wired inputs.

    Extra keys (a client's layout hints, titles) are accepted and ignored.
    """

    model_config = ConfigDict(extra="ignore")

    type: str = Field(min_length=1, max_length=100)
    params: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, InputRef] = Field(default_factory=dict)


class GraphDoc(BaseModel):
    """A graph: a map of node id → node."""

    model_config = ConfigDict(extra="ignore")

    nodes: dict[str, NodeSpec]

    def canonical_json(self) -> str:
        """Stable JSON of the graph (sorted keys, no whitespace): the input of its hash."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
