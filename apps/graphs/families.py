"""Model families as the web side sees them (torch-free): what each file of the fleet is, and
the submit-time check that a graph never mixes families.

The families themselves are workers/models/<id>/ packages (registered in
workers/models/families.py, whose torch-free half this module reads); workers report each file's
`family`, `role` and `families` in their heartbeats (workers/models/catalog.py `scan`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from apps.graphs.registry import descriptor_get
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid
from workers.models.families import REGISTERED, info
from workers.models.family import ROLES, FamilyInfo
from workers.models.upscale import KNOWN as UPSCALE_KNOWN

UPSCALE_FOLDER = "upscale_models"  # files of no family (workers/models/upscale)

# Every id a file's family may take: the registered families, then those still to come.
FAMILY_IDS: tuple[str, ...] = ("zimage", "flux1", "sdxl", "flux2", "qwenimage", "krea2", "wan",
                               "ltx2")
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
# Port kinds whose values belong to one family (a FLUX.1 latent is no SDXL latent).
FAMILY_KINDS = frozenset({"model", "vae", "text-encoder", "conditioning", "latent", "guider", "sigmas"})

__all__ = ["FAMILY_IDS", "REGISTERED", "ROLES", "ModelFile", "activation_for",
           "fleet_files", "graph_families_check"]


@dataclass(frozen=True)
class ModelFile:
    """One model file some live worker holds, as its heartbeat described it."""

    folder: str
    name: str
    family: str | None
    role: str | None
    families: tuple[str, ...]
    bytes: int
    variant: str | None = None  # the family's kind of model (Wan: t2v, i2v, ti2v)

    def to_wire(self) -> dict[str, Any]:
        return {"folder": self.folder, "name": self.name, "family": self.family,
                "role": self.role, "families": list(self.families), "bytes": self.bytes,
                "variant": self.variant}


def fleet_files(workers: Iterable[Any]) -> dict[tuple[str, str], ModelFile]:
    """(folder, name) → the file, over the `model_files` of `workers` (first report wins)."""
    files: dict[tuple[str, str], ModelFile] = {}
    for worker in workers:
        for entry in worker.model_files:
            key = (entry["folder"], entry["name"])
            if key not in files:
                families = tuple(entry.get("families") or ())
                files[key] = ModelFile(key[0], key[1], entry.get("family"), entry.get("role"),
                                       families, int(entry.get("size") or 0),
                                       entry.get("variant"))
    return dict(sorted(files.items()))


def activation_for(families: Iterable[str],
                   variants: Iterable[tuple[str | None, str | None]] = ()) -> tuple[float, float]:
    """(base GB, GB per megapixel) a run of these families needs beyond its weights: the most
    any of them needs (apps/fleet/routing.py's default when none is registered). `variants`:
    (family, variant) of the run's model files; a family's per-megapixel figure is scaled by
    the largest `variant_activation` share among its files' variants (Wan's TI2V-5B: 0.25)."""
    known = [info(f) for f in families if f in REGISTERED]
    if not known:
        return 1.0, 3.0
    kinds = list(variants)

    def per_mpx(family: FamilyInfo) -> float:
        shares = dict(family.variant_activation)
        held = [shares.get(v or "", 1.0) for f, v in kinds if f == family.id and v]
        return family.activation_gb_per_mpx * (max(held) if held else 1.0)

    return max(i.activation_gb for i in known), max(per_mpx(i) for i in known)


class _Carried:
    """The families a node's family-bound values may belong to (None: any), and what said so."""

    def __init__(self, families: frozenset[str] | None, what: str) -> None:
        self.families, self.what = families, what

    def describe(self) -> str:
        return f"{self.what} is {' / '.join(sorted(self.families or ())) or 'of no family'}"


def graph_families_check(graph: GraphDoc, order: list[str],
                         files: dict[tuple[str, str], ModelFile]) -> set[str]:
    """The families the closure `order` uses; GraphInvalid when a node asks a family-bound param
    for another family's file (`model_family`) or joins values of different families
    (`family_mismatch`: a FLUX.1 transformer fed an SDXL VAE's latent), naming the node and
    both families. Files no family recognised constrain nothing (their load says the rest)."""
    carried: dict[str, _Carried] = {}
    fed: set[str] = set()  # nodes whose family-bound outputs feed another node

    def of(node_id: str) -> _Carried:
        if node_id not in carried:
            carried[node_id] = _node(graph, node_id, files, of, fed)
        return carried[node_id]

    for node_id in order:
        of(node_id)
    for node_id in order:
        _encoder_count_check(graph, node_id, files)
    # A value's families narrow downstream (FLUX.1's VAE also serves Z-Image): the run's are
    # those of the last family-bound values, and of the params bound to one family.
    used = {f for n, c in carried.items() if n not in fed for f in c.families or ()}
    return used | {p.family for n in order for p in _bound_params(graph, n)}


def _encoder_count_check(graph: GraphDoc, node_id: str,
                         files: dict[tuple[str, str], ModelFile]) -> None:
    """A text-encoder loader names as many files as its family has encoders (FLUX.1: CLIP-L and
    T5, two files); GraphInvalid(`text_encoders`) naming the node otherwise, at submit rather
    than as a load error on the worker. Files no family recognises constrain nothing."""
    descriptor = descriptor_get(graph.nodes[node_id].type)
    params = [p for p in (descriptor.params if descriptor else ()) if p.type == "model"
              and p.options_from == "text_encoders" and not p.family]
    names = [str(v) for p in params if (v := graph.nodes[node_id].params.get(p.name))]
    held = [files.get(("text_encoders", name)) for name in dict.fromkeys(names)]
    if not names or any(f is None or not f.families for f in held):
        return
    families = set.intersection(*(set(f.families) for f in held if f is not None))
    wants = {f: info(f).text_encoders for f in sorted(families) if f in REGISTERED
             and info(f).text_encoders}
    distinct = len(held) == len(names)
    if not wants or any(len(encoders) == len(names) and distinct for encoders in wants.values()):
        return
    family, encoders = next(iter(wants.items()))
    raise GraphInvalid(
        "text_encoders",
        f"node {node_id!r} loads {len(names)} text encoder file(s) ({', '.join(names)}"
        f"{'' if distinct else ': one file twice'}); {info(family).title} ({family}) needs "
        f"{len(encoders)}: {' and '.join(encoders)}, one file each", node_id)


def unrecognised(held: ModelFile) -> bool:
    """A safetensors file (its header is readable without torch) that no registered family
    recognises: a load of it can only fail. Pickled weights (.ckpt, .pt, .bin) and folders say
    nothing until a family's loader opens them."""
    return held.role is None and held.name.lower().endswith(SAFETENSORS_SUFFIXES)


def _bound_params(graph: GraphDoc, node_id: str) -> list[Any]:
    descriptor = descriptor_get(graph.nodes[node_id].type)
    return [p for p in (descriptor.params if descriptor else ()) if p.family
            and graph.nodes[node_id].params.get(p.name)]


def _node(graph: GraphDoc, node_id: str, files: dict[tuple[str, str], ModelFile],
          upstream: Any, fed: set[str]) -> _Carried:
    spec, descriptor = graph.nodes[node_id], descriptor_get(graph.nodes[node_id].type)
    if descriptor is None:
        return _Carried(None, "")
    sources: list[_Carried] = []
    # A loader that names its family (load/text-encoder: a Qwen3 is Z-Image's or FLUX.2's):
    # its value is that family's; "auto" is the first registered family that reads the file.
    choice = str(spec.params.get("family") or "") if descriptor.param("family") else ""
    for param in descriptor.params:
        value = spec.params.get(param.name)
        if param.type != "model" or not value:
            continue
        held = files.get((param.options_from or "", str(value)))
        where = f"{param.options_from}/{value}"
        if held is not None and held.folder == UPSCALE_FOLDER and unrecognised(held):
            raise GraphInvalid(
                "unsupported_upscaler",
                f"param {param.name!r}: {where} holds weights of no upscale architecture this "
                f"farm runs ({UPSCALE_KNOWN}), or an unreadable file", node_id)
        if held is not None and not held.families and not param.family and unrecognised(held):
            raise GraphInvalid(
                "unsupported_family",
                f"param {param.name!r}: {where} holds weights no model family this farm runs "
                f"({', '.join(REGISTERED)}) recognises (or an unreadable file)", node_id)
        if held is None or not held.families:
            continue
        if param.family and param.family not in held.families:
            raise GraphInvalid(
                "model_family",
                f"param {param.name!r} takes a {param.family} file; {where} is "
                f"{' / '.join(held.families)} ({held.role})", node_id)
        if not param.family:
            families = _chosen(held, choice, param.name, where, node_id)
            sources.append(_Carried(frozenset(families), f"{param.name} ({where})"))
    for port, ref in spec.inputs.items():
        declared = descriptor.input(port)
        if declared is not None and declared.kind in FAMILY_KINDS and ref.node in graph.nodes:
            source = upstream(ref.node)
            fed.add(ref.node)
            if source.families is not None:
                sources.append(_Carried(source.families, f"input {port!r} (from {ref.node!r})"))
    return _join(sources, node_id)


def _chosen(held: ModelFile, choice: str, param: str, where: str, node_id: str) -> tuple[str, ...]:
    """The families a loaded file's value may belong to, given its loader's `family` choice."""
    if choice == "auto":
        return held.families[:1]
    if choice and choice not in held.families:
        raise GraphInvalid(
            "model_family",
            f"param {param!r}: {where} is {' / '.join(held.families)} ({held.role}), not a "
            f"{choice} file (param 'family')", node_id)
    return (choice,) if choice else held.families


def _join(sources: list[_Carried], node_id: str) -> _Carried:
    if not sources:
        return _Carried(None, "")
    families = sources[0].families
    for index, source in enumerate(sources[1:], start=1):
        assert families is not None and source.families is not None
        if not families & source.families:
            first = next(s for s in sources[:index] if s.families and not s.families & source.families)
            raise GraphInvalid(
                "family_mismatch",
                f"node {node_id!r} mixes model families: its {first.describe()}, but its "
                f"{source.describe()}", node_id)
        families = families & source.families
    return _Carried(families, sources[0].what)
