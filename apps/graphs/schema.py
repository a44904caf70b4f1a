"""The typed graph document (wire format in DESIGN.md) and its canonical hash."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored (PostgreSQL text and JSONB hold neither), or None."""
    if "\x00" in value:
        return "contains a NUL character (\\u0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def storable_text(value: str) -> str:
    """A pydantic validator: refuse text PostgreSQL cannot store, as a 422 `invalid_text`."""
    problem = text_problem(value)
    if problem is not None:
        raise PydanticCustomError("invalid_text", "text {problem}", {"problem": problem})
    return value


Text = Annotated[str, AfterValidator(storable_text)]
Name = Annotated[Text, Field(min_length=1, max_length=100)]  # a param or port name


def _storable_tree(value: Any, path: str) -> None:
    """Every string in a JSON value (keys included) must be storable; `path` names the culprit.

    Iterative, so a deeply nested value cannot exhaust Python's recursion limit.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                raise PydanticCustomError("invalid_text", "{path}: text {problem}",
                                          {"path": where, "problem": problem})
        elif isinstance(item, dict):
            stack.extend((key, where) for key in item)
            stack.extend((v, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))


class InputRef(BaseModel):
    """The one upstream output that feeds an input: `{node, port}`."""

    model_config = ConfigDict(extra="forbid")

    node: Text = Field(min_length=1, max_length=200)
    port: Text = Field(min_length=1, max_length=100)


class NodeSpec(BaseModel):
    """One node of a graph: its type, named params and wired inputs.

    Extra keys (a client's layout hints, titles) are accepted and ignored.
    """

    model_config = ConfigDict(extra="ignore")

    type: Text = Field(min_length=1, max_length=100)
    params: dict[Name, Any] = Field(default_factory=dict)
    inputs: dict[Name, InputRef] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _params_storable(cls, params: dict[str, Any]) -> dict[str, Any]:
        for name, value in params.items():
            _storable_tree(value, name)
        return params


class GraphDoc(BaseModel):
    """A graph: a map of node id → node."""

    model_config = ConfigDict(extra="ignore")

    nodes: dict[Annotated[Text, Field(min_length=1, max_length=200)], NodeSpec]

    def canonical_json(self) -> str:
        """Stable JSON of the graph (sorted keys, no whitespace): the input of its hash."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
