"""Node descriptors: what a node type looks like from outside (ports, params). Pure data, no torch.

Runners (the code that executes a type) live in `workers/runners/`; a test proves that every
runnable descriptor has exactly one runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ParamType = Literal["string", "int", "float", "bool", "enum", "asset", "model"]

# The longest value of a string-typed param that declares no `max_length` of its own: every text
# a client sends is bounded, since it is stored, copied into takes and listings, and run.
DEFAULT_MAX_LENGTH = 1000
STRING_TYPES = frozenset({"string", "enum", "asset", "model"})

# Port kinds. An output feeds an input only when the kinds are equal.
PORT_KINDS = frozenset(
    {"image", "mask", "model", "vae", "text-encoder", "conditioning", "latent", "text", "int",
     "float", "bool", "noise", "sampler", "sigmas", "guider", "upscale-model",
     "latent-upscale-model",
     "frames", "audio", "video"}
)
# The kinds of plain values (computed at run time, shown by `util/preview`, switchable).
VALUE_KINDS = ("text", "int", "float", "bool")


@dataclass(frozen=True)
class Port:
    """One input or output of a node type. An input also `accepts` outputs of those other kinds
    (a math input takes an int or a bool as well as a float). An output that `passes` an
    optional input on (load/lora's text encoder) exists only when that input is wired."""

    name: str
    kind: str
    required: bool = True
    accepts: tuple[str, ...] = ()
    passes: str | None = None

    def __post_init__(self) -> None:
        for kind in (self.kind, *self.accepts):
            if kind not in PORT_KINDS:
                raise ValueError(f"unknown port kind {kind!r} on port {self.name!r}")

    def takes(self, kind: str) -> bool:
        return kind == self.kind or kind in self.accepts


@dataclass(frozen=True)
class Param:
    """One named parameter of a node type, with its type, default and limits.

    `options_from` names a models-dir folder (e.g. "diffusion_models") whose files are the
    choices of a `model` param; `multiple_of` constrains ints (image sides for latent models).
    `input` names an optional input port that, when wired, supplies this value instead.
    `max_length` bounds a string-typed value in characters (DEFAULT_MAX_LENGTH when unset).
    `family` binds a `model` param to one model family (apps/graphs/families.py): its choices
    are that family's files, and a file of another family is a 422 at submit.
    `media`: an `asset` param takes assets of that media, "image" or "video" (422 otherwise).
    """

    name: str
    type: ParamType
    default: Any = None
    required: bool = False
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    options_from: str | None = None
    multiple_of: int | None = None
    input: str | None = None
    description: str = ""
    max_length: int | None = None
    family: str | None = None
    media: str = "image"  # an `asset` param: the media (type's first part) of its assets

    @property
    def length_limit(self) -> int | None:
        """The bound on a string-typed value's length; None for numbers and booleans."""
        if self.type not in STRING_TYPES:
            return None
        return self.max_length or DEFAULT_MAX_LENGTH


@dataclass(frozen=True)
class NodeDescriptor:
    """A node type: identity, ports and params. `runnable` means a runner exists for it."""

    type: str
    title: str
    category: str
    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()
    params: tuple[Param, ...] = ()
    hidden: bool = False
    runnable: bool = True
    produces_takes: bool = False
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Inputs computed only when the node asks for them (a switch's branches): the executor runs
    # the rest of its inputs first, then only the upstream of the lazy inputs it chose.
    lazy: tuple[str, ...] = ()
    # A node that shows a value on its run (`values` of the run) and keeps no take; it runs
    # with any target once every input it reads was computed.
    shows_value: bool = False

    def input(self, name: str) -> Port | None:
        return next((p for p in self.inputs if p.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((p for p in self.outputs if p.name == name), None)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def to_wire(self) -> dict[str, Any]:
        """The descriptor as `/v1/models` serves it (camelCase keys, wire shape in DESIGN.md)."""
        return {
            "type": self.type,
            "title": self.title,
            "category": self.category,
            "description": self.description,
            "hidden": self.hidden,
            "runnable": self.runnable,
            "producesTakes": self.produces_takes,
            "showsValue": self.shows_value,
            "inputs": [_port_to_wire(p, lazy=p.name in self.lazy) for p in self.inputs],
            "outputs": [{"name": p.name, "kind": p.kind} for p in self.outputs],
            "params": [_param_to_wire(p) for p in self.params],
        }


def _port_to_wire(p: Port, *, lazy: bool) -> dict[str, Any]:
    wire: dict[str, Any] = {"name": p.name, "kind": p.kind, "required": p.required}
    if p.accepts:
        wire["accepts"] = list(p.accepts)
    if lazy:
        wire["lazy"] = True
    return wire


def _param_to_wire(p: Param) -> dict[str, Any]:
    return {
        "name": p.name,
        "type": p.type,
        "default": p.default,
        "required": p.required,
        "min": p.min,
        "max": p.max,
        "choices": list(p.choices) if p.choices else None,
        "optionsFrom": p.options_from,
        "multipleOf": p.multiple_of,
        "maxLength": p.length_limit,
        "input": p.input,
        "description": p.description,
        "family": p.family,
        **({"media": p.media} if p.type == "asset" else {}),
    }
