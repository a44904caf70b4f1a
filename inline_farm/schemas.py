"""The response schemas every app shares: the wire base and the error shape."""

from __future__ import annotations

from typing import Any

from ninja import Schema
from ninja.schema import DjangoGetter
from pydantic import ConfigDict, ModelWrapValidatorHandler, ValidationInfo, model_validator


class WireOut(Schema):
    """Base of every response schema: fields are named as the wire names them (camelCase, since
    ninja dumps field names), and fields a schema does not declare pass through untouched, so a
    field added to a `*_to_wire` shape reaches clients (DESIGN.md: add fields freely)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(
        cls, values: Any, handler: ModelWrapValidatorHandler[Any], info: ValidationInfo
    ) -> Any:
        # ninja wraps every input in a DjangoGetter, which hides a dict's undeclared keys from
        # pydantic: a take's lineage fields (graphSha256, models, seed…) were dropped. A wire
        # dict goes to pydantic as it is; model instances still go through ninja's getter.
        if isinstance(values, dict):
            return handler(values)
        return handler(DjangoGetter(values, cls, info.context))


class ErrorBody(WireOut):
    """`{code, message, nodeId?}`: `code` is stable for clients, `nodeId` names a graph node."""

    code: str
    message: str
    nodeId: str | None = None


class ErrorOut(WireOut):
    """Every error the API answers: `{"error": {code, message, nodeId?}}`."""

    error: ErrorBody
