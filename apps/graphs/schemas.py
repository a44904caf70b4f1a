"""Response schemas of /v1/models (the shapes NodeDescriptor.to_wire builds)."""

from __future__ import annotations

from typing import Any

from inline_farm.schemas import WireOut


class InputPortOut(WireOut):
    name: str
    kind: str
    required: bool
    accepts: list[str] | None = None  # other kinds this input also takes
    lazy: bool | None = None  # computed only when the node chooses it (a switch's branches)


class OutputPortOut(WireOut):
    name: str
    kind: str


class ParamOut(WireOut):
    """A node param; `choices` of a `model` param are the files live workers hold."""

    name: str
    type: str
    default: Any = None
    required: bool
    min: int | float | None
    max: int | float | None
    choices: list[str] | None
    optionsFrom: str | None
    multipleOf: int | None
    input: str | None
    maxLength: int | None = None
    description: str
    family: str | None = None  # a model param bound to one family: its choices are that family's
    media: str | None = None  # an asset param: the media of its assets ("image", "video", "audio")


class DescriptorOut(WireOut):
    """A node type as clients see it: ports, params, pickers."""

    type: str
    title: str
    category: str
    description: str
    hidden: bool
    runnable: bool
    producesTakes: bool
    showsValue: bool = False  # shows a value on its run (`values`), keeps no take
    inputs: list[InputPortOut]
    outputs: list[OutputPortOut]
    params: list[ParamOut]


class RegistryOut(WireOut):
    """Every node type and the registry's version (also the ETag)."""

    registryVersion: str
    nodes: list[DescriptorOut]


class ModelFileOut(WireOut):
    """A model file live workers hold: what it is, from its own contents (its `family` is the
    first registered family that recognises it, `families` every one; null when none does)."""

    folder: str
    name: str
    family: str | None
    role: str | None
    families: list[str]
    bytes: int
    variant: str | None = None  # the family's kind of model where it has several (Wan: t2v, i2v)


class ModelFilesOut(WireOut):
    """The model files of the live fleet."""

    files: list[ModelFileOut]
