"""The response schemas every app shares: the wire base and the error shape."""

from __future__ import annotations

from ninja import Schema
from pydantic import ConfigDict


class WireOut(Schema):
    """Base of every response schema: fields are named as the wire names them (camelCase, since
    ninja dumps field names), and fields a schema does not declare pass through untouched, so a
    field added to a `*_to_wire` shape reaches clients (DESIGN.md: add fields freely)."""

    model_config = ConfigDict(extra="allow")


class ErrorBody(WireOut):
    """`{code, message, nodeId?}`: `code` is stable for clients, `nodeId` names a graph node."""

    code: str
    message: str
    nodeId: str | None = None


class ErrorOut(WireOut):
    """Every error the API answers: `{"error": {code, message, nodeId?}}`."""

    error: ErrorBody
