"""ComfyUI's API (prompt) format → our typed graph, by the tables in `comfy_nodes`.

A prompt is `{node_id: {"class_type", "inputs"}}`; an input is a value or a link
`[node_id, output_slot]`. Each ComfyUI node keeps its id in our graph. The graph holds the
closures of the outputs (SaveImage, PreviewImage) that can run here; everything else is in the
report with its reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from apps.graphs.registry import descriptor_get
from apps.graphs.schema import GraphDoc
from apps.importer import comfy_minimaxh3
from apps.importer.comfy_families import (
    CLIP_TYPE_LOADERS,
    CLIP_TYPES,
    FLUX_DEFAULT_GUIDANCE,
    SAMPLER_PARAM_NODES,
    Evidence,
    flux_shift,
    loader_evidence,
)
from apps.importer.comfy_ltx2 import Rewrite, is_ltx2, rewrite
from apps.importer.comfy_nodes import (
    CARRIED,
    CUT,
    FOLDED,
    NOTE_TYPES,
    PASSED,
    PASSED_WHEN_UNWIRED,
    RULES,
    UNSUPPORTED,
    VIDEO_DECODE,
    VIDEO_LATENTS,
    Rule,
    qwen_reference_latent,
    qwen_reference_method,
)
from apps.importer.comfy_rules import Link
from apps.importer.comfy_vocab import ECHOES, SWITCH
from apps.importer.report import ImportInvalid, Report, id_order
from workers.models.catalog import WEIGHT_SUFFIXES  # torch-free: the catalog's own file rules
from workers.models.families import REGISTERED, info

CONSTANT_TYPES = frozenset({"input/int", "input/float", "input/text", "input/bool"})

# A LoadImage file name → the id of the asset it names for the caller, or None.
AssetResolver = Callable[[str], str | None]
# (folder, name) → the families that recognise a held model file (from its contents).
FileFamilies = Mapping[tuple[str, str], tuple[str, ...]]


@dataclass
class _Mapped:
    """One ComfyUI node on its way to becoming ours."""

    id: str
    comfy_type: str
    rule: Rule
    params: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, tuple[str, str]] = field(default_factory=dict)  # port → (node, its port)
    blocked_by: list[str] = field(default_factory=list)  # unmapped ComfyUI ids it reads


@dataclass
class _State:
    nodes: dict[str, tuple[str, dict[str, Any]]]  # id → (class_type, inputs with Links)
    catalog: dict[str, list[str]]
    report: Report
    mapped: dict[str, _Mapped] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)  # id → reason
    resolve_asset: AssetResolver | None = None
    files: FileFamilies = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)  # node id → its family evidence
    param_into: dict[str, list[str]] = field(default_factory=dict)  # FluxGuidance… → samplers
    ltx2: Rewrite = field(default_factory=Rewrite)  # an LTX-2 workflow's settled nodes
    settled: dict[str, str] = field(default_factory=dict)  # switch id → why it is left out
    settled_cut: dict[str, str] = field(default_factory=dict)  # cut like CUT's, and why


def prompt_to_graph(
    prompt: dict[str, Any], *, catalog: dict[str, list[str]], report: Report,
    resolve_asset: AssetResolver | None = None, files: FileFamilies | None = None,
) -> tuple[GraphDoc, str]:
    """Our graph and its target for a prompt; raises ImportInvalid when nothing can run, or
    `unsupported_family` when the workflow is for a model family this farm does not run.
    `resolve_asset` turns a LoadImage file name into the caller's asset id (the ComfyUI front
    door's uploads); names it cannot resolve stay as they are, reported under `assets`.
    `files`: the families of the model files the fleet holds (their contents say them)."""
    state = _State(_read_prompt(prompt), catalog, report, resolve_asset=resolve_asset,
                   files=files or {})
    _settle_switches(state)
    _cut_zeroed_references(state)
    state.ltx2 = comfy_minimaxh3.rewrite(state.nodes, rewrite(state.nodes))  # + MiniMax-H3's
    _families_check(state)
    for node_id, new_inputs in state.ltx2.inputs.items():
        state.nodes[node_id] = (state.nodes[node_id][0], new_inputs)
    for node_id, comfy_type, message in state.ltx2.warnings:
        report.warn(node_id, comfy_type, message)
    for node_id in sorted(state.nodes, key=id_order):
        _classify(state, node_id)
    _video_decodes(state)
    _reference_latents(state)
    _inpaint_conditionings(state)
    picked: set[str] = set()
    for node_id in sorted(state.mapped, key=id_order):
        _pick(state, node_id, picked)
    for node in state.mapped.values():
        _map_node(state, node)
        if node.rule.type in ("sample", "sample/advanced"):
            _sampler_family_params(state, node)
        elif node.rule.type == "ltx2/sample":  # CFGGuider's one cfg guides video and sound
            node.params.setdefault("audio_cfg", node.params.get("cfg", 1.0))
        if node.rule.type == "load/text-encoder":
            _encoder_family(state, node)
    kept, target = _outputs(state)
    kept |= _previews(state, kept, target)
    graph = {nid: _spec(state.mapped[nid]) for nid in sorted(kept, key=id_order)}
    for nid in sorted(state.mapped, key=id_order):
        node = state.mapped[nid]
        if nid in kept:
            report.mapped.append({"id": nid, "type": node.comfy_type, "as": node.rule.type})
        elif not _is_output(node) and not _is_preview(node):
            report.drop(nid, node.comfy_type, "not connected to an output that can run here")
    for nid in sorted(state.nodes, key=id_order):
        comfy_type = state.nodes[nid][0]
        if comfy_type in SAMPLER_PARAM_NODES:
            into = [s for s in state.param_into.get(nid, []) if s in kept]
            if into:  # its effect is that sampler's param
                report.mapped.append({"id": nid, "type": comfy_type, "as": "sample",
                                      "into": into, "param": SAMPLER_PARAM_NODES[comfy_type][1]})
            else:
                report.drop(nid, comfy_type, "not connected to an output that can run here")
    return GraphDoc.model_validate({"nodes": graph}), target


# --- reading ----------------------------------------------------------------------------------


def _read_prompt(prompt: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    nodes: dict[str, tuple[str, dict[str, Any]]] = {}
    for node_id, raw in prompt.items():
        if not isinstance(raw, dict) or not isinstance(raw.get("class_type"), str):
            raise ImportInvalid("bad_workflow", f"node {node_id} has no class_type", str(node_id))
        inputs = raw.get("inputs")
        nodes[str(node_id)] = (raw["class_type"], dict(inputs) if isinstance(inputs, dict) else {})
    for node_id, (_, inputs) in nodes.items():
        for name, value in inputs.items():
            if _looks_like_link(value):
                if str(value[0]) not in nodes:
                    raise ImportInvalid(
                        "dangling_link",
                        f"input {name!r} of node {node_id} is linked from node {value[0]}, "
                        "which does not exist", node_id,
                    )
                inputs[name] = Link(str(value[0]), int(value[1]))
    return nodes


def _looks_like_link(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str | int)
            and not isinstance(value[0], bool) and isinstance(value[1], int)
            and not isinstance(value[1], bool))


def _classify(state: _State, node_id: str) -> None:
    comfy_type, inputs = state.nodes[node_id]
    rule = state.ltx2.rules.get(node_id, RULES.get(comfy_type))
    if node_id in state.ltx2.refused:
        state.unmapped[node_id] = state.ltx2.refused[node_id]
    elif node_id in state.ltx2.folded:
        state.report.drop(node_id, comfy_type, state.ltx2.folded[node_id])
    elif node_id in state.settled:
        state.report.drop(node_id, comfy_type, state.settled[node_id])
    elif node_id in state.settled_cut:
        state.report.drop(node_id, comfy_type, state.settled_cut[node_id])
    elif rule is not None and rule.refuse is not None and (why := rule.refuse(inputs)):
        state.unmapped[node_id] = why
    elif rule is not None:
        state.mapped[node_id] = _Mapped(node_id, comfy_type, rule)
    elif comfy_type in SAMPLER_PARAM_NODES:
        pass  # reported once the samplers they feed are known
    elif comfy_type in FOLDED:
        _, reason, check = FOLDED[comfy_type]
        state.report.drop(node_id, comfy_type, reason)
        for message in check(inputs) if check else []:
            state.report.warn(node_id, comfy_type, message)
    elif comfy_type in CUT:
        state.report.drop(node_id, comfy_type, CUT[comfy_type])
    elif comfy_type in NOTE_TYPES:
        state.report.drop(node_id, comfy_type, "a note: UI only")
    else:
        state.unmapped[node_id] = UNSUPPORTED.get(
            comfy_type, f"no node type on this farm does what {comfy_type} does")
    if node_id in state.unmapped:
        state.report.unmap(node_id, comfy_type, state.unmapped[node_id])


# --- switches settled by the workflow ---------------------------------------------------------


def _settle_switches(state: _State) -> None:
    """Switches whose choice the workflow fixes (its `switch` a value, or a PrimitiveBoolean's):
    ComfyUI evaluates only the chosen branch, so the switch's readers read that branch directly
    and the switch is reported left out. So a branch that needs a node this farm lacks (an LLM
    prompt enhancer switched off) costs nothing, a chosen one that cannot run is refused naming
    its node, and a chosen value (steps, cfg, a LoRA'd model on its way to ModelSampling*)
    reaches its reader's params as ComfyUI's would. A switch decided at run time (a math
    expression's bool) stays a switch/<kind>. Readers of an echoing output (PreviewAny's) read
    its input, so a value shown on its way reaches its readers whatever a switch settles to;
    readers of a node that passes an input through when another is unwired
    (PASSED_WHEN_UNWIRED: an ImageStitch whose image2 was bypassed) read that input."""
    for _ in range(len(state.nodes) + 1):
        changed = False
        for node_id in sorted(state.nodes, key=id_order):
            comfy_type, inputs = state.nodes[node_id]
            if comfy_type in ECHOES:
                changed |= _reread(state, node_id, inputs.get(ECHOES[comfy_type]))
            elif comfy_type in PASSED_WHEN_UNWIRED and node_id not in state.settled:
                read, unwired = PASSED_WHEN_UNWIRED[comfy_type]
                if inputs.get(unwired) is None and isinstance(inputs.get(read), Link):
                    state.settled[node_id] = (f"its {unwired} is unwired, so its readers read "
                                              f"its {read} (ComfyUI passes it through)")
                    changed |= _reread(state, node_id, inputs[read])
            elif comfy_type == SWITCH and node_id not in state.settled:
                choice = _fixed_bool(state, inputs.get("switch"))
                chosen, other = ("on_true", "on_false") if choice else ("on_false", "on_true")
                if choice is None or inputs.get(chosen) is None:
                    continue
                lacking = _lacking_upstream(state, inputs.get(other))
                state.settled[node_id] = (
                    f"its switch is {choice} in this workflow, so its readers read its {chosen} "
                    "input (ComfyUI runs only that branch" + (
                        f"; {other} needs {lacking}, which this farm lacks)" if lacking else ")"))
                _reread(state, node_id, inputs[chosen])
                changed = True
        if not changed:
            return


def _cut_zeroed_references(state: _State) -> None:
    """A ReferenceLatent on a ConditioningZeroOut (FLUX.2 Klein's edit templates build their
    negative so) is cut with it: the sampler builds its own negative (unused at cfg 1, as those
    templates run), so its readers get the input unwired too. Chains of them are followed."""
    for _ in range(len(state.nodes) + 1):
        changed = False
        for node_id, (comfy_type, inputs) in state.nodes.items():
            read = inputs.get("conditioning")
            if comfy_type != "ReferenceLatent" or node_id in state.settled_cut \
                    or not isinstance(read, Link):
                continue
            if state.nodes[read.node][0] in CUT or read.node in state.settled_cut:
                state.settled_cut[node_id] = (
                    "a reference on a zeroed-out negative: the sampler builds its own negative "
                    "(unused at cfg 1), so it is left unwired with its ConditioningZeroOut")
                changed = True
        if not changed:
            return


def _reread(state: _State, node_id: str, value: Any) -> bool:
    """Readers of `node_id`'s output 0 read `value` (a link or a constant) instead."""
    changed = False
    for _, inputs in state.nodes.values():
        for name, read in inputs.items():
            if isinstance(read, Link) and read.node == node_id and read.slot == 0 \
                    and value is not None:
                inputs[name] = value
                changed = True
    return changed


def _fixed_bool(state: _State, value: Any) -> bool | None:
    """The switch's value when the workflow fixes it: a boolean, or a PrimitiveBoolean's."""
    if isinstance(value, Link):
        comfy_type, inputs = state.nodes[value.node]
        value = inputs.get("value") if comfy_type == "PrimitiveBoolean" else None
    return value if isinstance(value, bool) else None


def _lacking_upstream(state: _State, value: Any) -> str | None:
    """'<type> (node <id>)' of the first node upstream of `value` this farm has no rule for."""
    if not isinstance(value, Link):
        return None
    seen, queue = {value.node}, deque([value.node])
    while queue:
        node_id = queue.popleft()
        comfy_type, inputs = state.nodes[node_id]
        known = (comfy_type in RULES or comfy_type in FOLDED or comfy_type in CUT
                 or comfy_type in NOTE_TYPES or comfy_type in SAMPLER_PARAM_NODES
                 or comfy_type in PASSED)
        if not known or comfy_type in UNSUPPORTED:
            return f"{comfy_type} (node {node_id})"
        for read in inputs.values():
            if isinstance(read, Link) and read.node not in seen:
                seen.add(read.node)
                queue.append(read.node)
    return None


# --- model families ---------------------------------------------------------------------------


def _families_check(state: _State) -> None:
    """Gather what each node says of the family the workflow needs (comfy_families); refuse
    the workflow (`unsupported_family`, naming the node) when a node that feeds an output needs
    a family this farm does not run: never a graph that fails on a worker."""
    def families_of(folder: str, requested: str) -> tuple[str, ...] | None:
        name, held = model_resolve(requested, state.catalog.get(folder, []))
        return state.files.get((folder, name)) if held else None

    ltx2 = is_ltx2(state.nodes)
    for node_id in sorted(_feeding_outputs(state), key=id_order):
        comfy_type, inputs = state.nodes[node_id]
        evidence = loader_evidence(node_id, comfy_type, inputs, families_of)
        _clip_type_warning(state, node_id, evidence)
        if evidence is None:
            continue
        if evidence.families == ("ltxv",) and (comfy_type.startswith(("LTXV", "EmptyLTXV"))
                                               or (ltx2 and comfy_type in CLIP_TYPE_LOADERS)):
            evidence = (Evidence(node_id, comfy_type, ("ltx2",), f"{comfy_type} is LTX-2's in "
                                 "a workflow with its audio latent") if ltx2 else
                        Evidence(node_id, comfy_type, ("ltxv",), f"{evidence.why}: LTX-Video "
                                 "0.9's, as the workflow has no LTX-2 audio latent nodes"))
        state.evidence[node_id] = evidence
        state.report.families += [f for f in evidence.families
                                  if f in REGISTERED and f not in state.report.families]
        if not any(f in REGISTERED for f in evidence.families):
            needs = (f"the {' / '.join(evidence.families)} model family" if evidence.families
                     else "a model family this farm does not run")
            raise ImportInvalid(
                "unsupported_family",
                f"node {node_id} ({comfy_type}) needs {needs} ({evidence.why}); "
                f"this farm runs {', '.join(REGISTERED)}", node_id)


def _clip_type_warning(state: _State, node_id: str, evidence: Evidence | None) -> None:
    """A text-encoder loader's `type` that decides nothing here: one that names no family, or
    one the file's own contents overrule."""
    comfy_type, inputs = state.nodes[node_id]
    clip_type = inputs.get("type")
    if comfy_type not in CLIP_TYPE_LOADERS or not isinstance(clip_type, str):
        return
    if clip_type not in CLIP_TYPES:
        state.report.warn(node_id, comfy_type, f"type {clip_type!r} names no one model family: "
                          "the files' contents decide which family's encoder loads")
    elif evidence is not None and CLIP_TYPES[clip_type] not in evidence.families:
        state.report.warn(node_id, comfy_type, f"type {clip_type!r} is overruled: "
                          f"{evidence.why}")


def _feeding_outputs(state: _State) -> set[str]:
    """Nodes upstream of the workflow's ends (nodes nothing reads that read something: its
    outputs, whatever their type); a loader nothing reads feeds nothing."""
    read = {v.node for _, inputs in state.nodes.values() for v in inputs.values()
            if isinstance(v, Link)}
    ends = [nid for nid, (_, inputs) in state.nodes.items() if nid not in read
            and any(isinstance(v, Link) for v in inputs.values())]
    seen, queue = set(ends), deque(ends)
    while queue:
        for value in state.nodes[queue.popleft()][1].values():
            if isinstance(value, Link) and value.node not in seen:
                seen.add(value.node)
                queue.append(value.node)
    return seen


def _upstream_family(state: _State, link: Any) -> str | None:
    """The registered family the nearest node with evidence upstream of `link` names."""
    if not isinstance(link, Link):
        return None
    seen, queue = {link.node}, deque([link.node])
    while queue:
        node_id = queue.popleft()
        evidence = state.evidence.get(node_id)
        if evidence is not None:
            return next((f for f in evidence.families if f in REGISTERED), None)
        for value in state.nodes[node_id][1].values():
            if isinstance(value, Link) and value.node not in seen:
                seen.add(value.node)
                queue.append(value.node)
    return None


def _sampler_family(state: _State, node_id: str) -> str | None:
    """The family a sampler samples: its model's (the file's contents), else its prompt's
    encoder's (the loader's `type`), else the workflow's one registered family."""
    _, inputs = state.nodes[node_id]
    for port in ("model", "positive"):
        family = _upstream_family(state, inputs.get(port))
        if family is not None:
            return family
    named = {f for e in state.evidence.values() for f in e.families if f in REGISTERED}
    return named.pop() if len(named) == 1 else None


def _folded_along(state: _State, link: Any) -> list[str]:
    """The folded nodes a link passes through (and through CARRIED outputs), nearest first."""
    found: list[str] = []
    for _ in range(len(state.nodes) + 1):
        if not isinstance(link, Link):
            break
        comfy_type, inputs = state.nodes[link.node]
        carried = CARRIED.get(comfy_type, {}).get(link.slot)
        if carried is not None:
            link = inputs.get(carried)
            continue
        if comfy_type not in FOLDED:
            break
        found.append(link.node)
        link = inputs.get(FOLDED[comfy_type][0])
    return found


def _number(state: _State, value: Any) -> float | None:
    """A widget's number, also when a constant node (PrimitiveInt, …) feeds it."""
    if isinstance(value, Link):
        comfy_type, inputs = state.nodes[value.node]
        rule = RULES.get(comfy_type)
        value = inputs.get("value") if rule is not None and rule.type in CONSTANT_TYPES else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _sampler_family_params(state: _State, node: _Mapped) -> None:
    """What a sampler's family makes of ComfyUI's guidance and sigma shift: a guidance-distilled
    family (FLUX.1) takes FluxGuidance's value as `guidance` (ComfyUI's 3.5 without one) and
    ignores cfg; a CFG family keeps `guidance = cfg − 1` and ignores FluxGuidance. The
    nearest ModelSamplingSD3 / AuraFlow / Flux on the model's path sets `shift`."""
    _, inputs = state.nodes[node.id]
    family = _sampler_family(state, node.id)
    on_prompt = [n for n in _folded_along(state, inputs.get("positive"))
                 if state.nodes[n][0] == "FluxGuidance"]
    on_model = [n for n in _folded_along(state, inputs.get("model"))
                if state.nodes[n][0] in SAMPLER_PARAM_NODES]
    distilled = (info(family).guidance == "distilled") if family in REGISTERED else bool(on_prompt)
    name = info(family).title if family in REGISTERED else "this model"
    if distilled:
        guidance = _number(state, state.nodes[on_prompt[0]][1].get("guidance")) if on_prompt \
            else FLUX_DEFAULT_GUIDANCE
        if guidance is None:
            state.report.warn(on_prompt[0], "FluxGuidance", "its guidance is fed by a node the "
                              f"farm cannot read: {FLUX_DEFAULT_GUIDANCE} is used")
            guidance = FLUX_DEFAULT_GUIDANCE
        node.params["guidance"] = guidance
        cfg = _number(state, inputs.get("cfg"))
        if cfg is not None and cfg != 1.0:
            source = "FluxGuidance" if on_prompt else "ComfyUI's default without FluxGuidance"
            state.report.warn(node.id, node.comfy_type, f"cfg {cfg:g} is ignored: {name} is "
                              "guidance-distilled (one forward per step, no negative prompt); "
                              f"its guidance is {guidance:g} ({source})")
    else:
        cfg = _number(state, inputs.get("cfg"))
        if family in REGISTERED and cfg is not None:  # unknown: Z-Image's (the rule's) c − 1
            node.params["guidance"] = max(0.0, cfg - info(family).cfg_offset)
        for other in on_prompt:
            state.report.warn(other, "FluxGuidance", f"guidance is ignored: {name} is not "
                              "guidance-distilled; the sampler's cfg is its guidance")
    for other in on_prompt[1:] if distilled else []:
        state.report.warn(other, "FluxGuidance", f"overridden by FluxGuidance {on_prompt[0]}")
    for param_node in on_prompt:
        state.param_into.setdefault(param_node, []).append(node.id)
    for index, param_node in enumerate(on_model):
        state.param_into.setdefault(param_node, []).append(node.id)
        if index:
            state.report.warn(param_node, state.nodes[param_node][0],
                              f"overridden by {state.nodes[on_model[0]][0]} {on_model[0]}")
    if on_model:
        shift = _shift_of(state, on_model[0])
        if shift is not None:
            node.params["shift"] = shift


def _shift_of(state: _State, node_id: str) -> float | None:
    """The `shift` α of a ModelSampling* node (ModelSamplingFlux: e^mu of its size)."""
    comfy_type, inputs = state.nodes[node_id]
    names = ("max_shift", "base_shift", "width", "height") if comfy_type == "ModelSamplingFlux" \
        else ("shift",)
    values = [_number(state, inputs.get(n)) for n in names]
    if any(v is None for v in values):
        missing = [n for n, v in zip(names, values, strict=True) if v is None]
        state.report.warn(node_id, comfy_type, f"{', '.join(missing)} is not a number the farm "
                          "can read: the family's default shift is used")
        return None
    if comfy_type == "ModelSamplingFlux":
        max_shift, base_shift, width, height = (float(v or 0) for v in values)
        return flux_shift(max_shift, base_shift, width, height)
    return values[0]


_LATENT_THROUGH = {"sample": "latent_image", "sample/advanced": "latent_image",
                   "sampling/custom": "latent_image", "sampling/custom-advanced": "latent_image"}


def _video_decodes(state: _State) -> None:
    """A VAEDecode whose latent comes (through samplers) from a video latent decodes a clip:
    vae/decode-video (its IMAGE output is the clip's frames, ComfyUI's image batch)."""
    for node in state.mapped.values():
        if node.rule.type == "vae/decode" and _video_latent(state, node.id):
            node.rule = VIDEO_DECODE


def _encoder_family(state: _State, node: _Mapped) -> None:
    """A text-encoder loader whose `type` names a family its held file is not of (a Qwen3-VL
    loaded with type `qwen_image` in a Qwen-Image 2.1 workflow): the file's family the rest of
    the workflow names, else the first that recognises it ("auto")."""
    evidence = state.evidence.get(node.id)
    if evidence is None or node.params.get("family") in (*evidence.families, "auto", None):
        return
    held = [f for f in evidence.families if f in REGISTERED]
    named = {f for nid, e in state.evidence.items() if nid != node.id for f in e.families}
    picks = [f for f in held if f in named]
    node.params["family"] = picks[0] if len(picks) == 1 else "auto"


def _reference_family(state: _State, link: Any) -> str | None:
    """The family a ReferenceLatent's prompt is for: the nearest upstream evidence's families
    (a Qwen3 file is Z-Image's and FLUX.2 Klein's alike), else the workflow's; a family whose
    prompts take reference latents first."""
    families: tuple[str, ...] = ()
    if isinstance(link, Link):
        seen, queue = {link.node}, deque([link.node])
        while queue and not families:
            node_id = queue.popleft()
            evidence = state.evidence.get(node_id)
            if evidence is not None:
                families = tuple(f for f in evidence.families if f in REGISTERED)
                continue
            for value in state.nodes[node_id][1].values():
                if isinstance(value, Link) and value.node not in seen:
                    seen.add(value.node)
                    queue.append(value.node)
    named = set(families) or {f for e in state.evidence.values() for f in e.families
                              if f in REGISTERED}
    for family in ("flux2", "qwenimage", "qwenimage21"):
        if family in named:
            return family
    return named.pop() if len(named) == 1 else None


def _reference_latents(state: _State) -> None:
    """ReferenceLatent appends a latent to its prompt's references, and
    FluxKontextMultiReferenceLatentMethod says how they are read: the node of the prompt's
    family (its encoder's, else the workflow's one family); unmapped, with why, for a family
    (or a method) its prompts take none of here."""
    for node in list(state.mapped.values()):
        if node.comfy_type not in ("ReferenceLatent", "FluxKontextMultiReferenceLatentMethod"):
            continue
        _, inputs = state.nodes[node.id]
        family = _reference_family(state, inputs.get("conditioning"))
        title = info(family).title if family in REGISTERED else str(family)
        if node.comfy_type == "ReferenceLatent":
            rule = qwen_reference_latent(family, title)
        else:
            family = _encoder_family_of(state, inputs.get("conditioning")) or family
            title = info(family).title if family in REGISTERED else str(family)
            rule = qwen_reference_method(family, title, inputs.get("reference_latents_method"))
        if isinstance(rule, str):
            del state.mapped[node.id]
            state.unmapped[node.id] = rule
            state.report.unmap(node.id, node.comfy_type, rule)
        else:
            node.rule = rule


def _inpaint_conditionings(state: _State) -> None:
    """InpaintModelConditioning conditions FLUX.1 Fill's prompts here: on a prompt whose encoder
    is another family's, it is unmapped, with why."""
    for node in list(state.mapped.values()):
        if node.comfy_type != "InpaintModelConditioning":
            continue
        family = _encoder_family_of(state, state.nodes[node.id][1].get("positive"))
        if family in (None, "flux1"):
            continue
        title = info(family).title if family in REGISTERED else str(family)
        why = (f"InpaintModelConditioning on a {title} prompt is not supported: only FLUX.1 "
               "prompts (for FLUX.1 Fill) take an inpaint condition on this farm")
        del state.mapped[node.id]
        state.unmapped[node.id] = why
        state.report.unmap(node.id, node.comfy_type, why)


def _encoder_family_of(state: _State, link: Any) -> str | None:
    """The family of the text encoder a prompt was encoded by: its nearest upstream encoder
    loader's evidence (Qwen-Image's when named), else the loader's `type` as ComfyUI names it
    (`longcat_image`: a model this farm does not run); None without a loader or a type. A
    Qwen-Image-Edit prompt node says nothing here: Krea 2 and LongCat workflows use it too."""
    loader = _first_upstream(state, link, lambda nid: state.nodes[nid][0] in CLIP_TYPE_LOADERS)
    if loader is None:
        return None
    evidence = state.evidence.get(loader)
    families = [f for f in evidence.families if f in REGISTERED] if evidence else []
    if families:
        return "qwenimage" if "qwenimage" in families else families[0]
    clip_type = state.nodes[loader][1].get("type")
    return clip_type if isinstance(clip_type, str) else None


def _first_upstream(state: _State, link: Any, match: Callable[[str], bool]) -> str | None:
    """The nearest node upstream of `link` (itself included, breadth first) that `match`es."""
    if not isinstance(link, Link):
        return None
    seen, queue = {link.node}, deque([link.node])
    while queue:
        node_id = queue.popleft()
        if match(node_id):
            return node_id
        for value in state.nodes[node_id][1].values():
            if isinstance(value, Link) and value.node not in seen:
                seen.add(value.node)
                queue.append(value.node)
    return None


def _video_latent(state: _State, node_id: str) -> bool:
    _, inputs = state.nodes[node_id]
    link = inputs.get("samples")
    for _ in range(len(state.nodes) + 1):
        origin = _resolve(state, link) if isinstance(link, Link) else None
        source = state.mapped.get(origin.node) if origin is not None else None
        if source is None:
            return False
        if source.rule.type in VIDEO_LATENTS:
            return True
        through = _LATENT_THROUGH.get(source.rule.type)
        if through is None:
            return False
        link = state.nodes[source.id][1].get(through)
    return False


def _pick(state: _State, node_id: str, picked: set[str]) -> None:
    """Settle the rule of a node whose rule depends on what feeds it (`Rule.pick`), upstream
    first; a node no rule fits becomes unmapped with the pick's reason."""
    node = state.mapped.get(node_id)
    if node is None or node_id in picked:
        return
    picked.add(node_id)  # before the upstream walk: a loop of links ends here
    if node.rule.pick is None:
        return
    _, inputs = state.nodes[node_id]

    def kind_of(name: str) -> str | None:
        value = inputs.get(name)
        origin = _resolve(state, value) if isinstance(value, Link) else None
        if origin is None:
            return None
        _pick(state, origin.node, picked)
        source = state.mapped.get(origin.node)
        if source is None or origin.slot >= len(source.rule.outputs):
            return None
        port_name = source.rule.outputs[origin.slot]
        descriptor = descriptor_get(source.rule.type)
        port = descriptor.output(port_name) if descriptor and port_name else None
        return port.kind if port is not None else None

    rule = node.rule.pick(inputs, kind_of)
    if isinstance(rule, str):
        del state.mapped[node_id]
        state.unmapped[node_id] = rule
        state.report.unmap(node_id, node.comfy_type, rule)
    else:
        node.rule = rule


# --- mapping one node -------------------------------------------------------------------------


def _resolve(state: _State, link: Link) -> Link | None:
    """Follow folded nodes to the real upstream output; None for a cut one."""
    for _ in range(len(state.nodes) + 1):
        comfy_type, inputs = state.nodes[link.node]
        if comfy_type in CUT or comfy_type in NOTE_TYPES or link.node in state.settled_cut:
            return None
        if link.node in state.ltx2.rules:  # mapped by the LTX-2 rewrite (ltx2/encode-audio)
            return link
        passed = state.ltx2.passed.get(link.node, PASSED.get(comfy_type, {}).get(link.slot))
        if passed is not None:  # an output that is one of the node's inputs, unchanged
            upstream = inputs.get(passed)
            if not isinstance(upstream, Link):
                return None
            link = upstream
            continue
        carried = CARRIED.get(comfy_type, {}).get(link.slot)
        if carried is not None:  # unwired with its carried input when that is cut
            upstream = inputs.get(carried)
            return link if isinstance(upstream, Link) and _resolve(state, upstream) else None
        if comfy_type not in FOLDED:
            return link
        upstream = inputs.get(FOLDED[comfy_type][0])
        if not isinstance(upstream, Link):
            return None
        link = upstream
    raise ImportInvalid("cycle", f"links loop through node {link.node}", link.node)


def _map_node(state: _State, node: _Mapped) -> None:
    _, inputs = state.nodes[node.id]
    # read by consumers, not the node (unless the LTX-2 rewrite maps it: ltx2/encode-audio)
    passed = set() if node.id in state.ltx2.rules else set(PASSED.get(node.comfy_type, {}).values())
    for name, value in inputs.items():
        if isinstance(value, Link) and name not in passed:
            _map_link(state, node, name, value)
        elif name in node.rule.params and value is not None:
            _set_param(state, node, name, value)
    if node.rule.derive is not None:
        node.params.update(node.rule.derive(inputs))
    for check in node.rule.warnings:
        for message in check(inputs):
            state.report.warn(node.id, node.comfy_type, message)


def _map_link(state: _State, node: _Mapped, name: str, link: Link) -> None:
    origin = _resolve(state, link)
    if origin is None:
        return
    if origin.node in state.unmapped:
        node.blocked_by.append(origin.node)
        return
    source = state.mapped.get(origin.node)
    if source is None:
        return
    port = source.rule.outputs[origin.slot] if origin.slot < len(source.rule.outputs) else None
    if port is None:
        raise ImportInvalid(
            "unmapped_output",
            f"input {name!r} of node {node.id} reads output {origin.slot} of node {origin.node} "
            f"({source.comfy_type}), which has no equivalent here", node.id,
        )
    target = node.rule.inputs.get(name) or _param_port(node, name)
    if target is not None:
        node.inputs[target] = (origin.node, port)
        return
    constant = _constant(state, origin.node)
    if name in node.rule.params and constant is not None:
        _set_param(state, node, name, constant)
        return
    state.report.warn(node.id, node.comfy_type, f"input {name!r} is fed by node {origin.node} "
                      f"({source.comfy_type}), which {node.rule.type} cannot take: the default "
                      "is used")


def _param_port(node: _Mapped, name: str) -> str | None:
    """Our input port that feeds the param a ComfyUI widget input maps to (seed, text)."""
    mapping = node.rule.params.get(name)
    descriptor = descriptor_get(node.rule.type)
    param = descriptor.param(mapping.name) if mapping and descriptor else None
    return param.input if param else None


def _constant(state: _State, node_id: str) -> Any:
    """The value of a constant node (PrimitiveInt, …), to inline where no port takes a link."""
    _, inputs = state.nodes[node_id]
    mapped = state.mapped.get(node_id)
    if mapped is None or mapped.rule.type not in CONSTANT_TYPES:
        return None
    return inputs.get("value")


def _set_param(state: _State, node: _Mapped, name: str, value: Any) -> None:
    mapping = node.rule.params[name]
    if mapping.folder is not None:
        value = _model(state, node, mapping.folder, str(value))
    elif node.rule.type in ("image/load", "video/load", "audio/load"):
        value = _asset(state, node, str(value))
    try:
        node.params[mapping.name] = mapping.convert(value)
    except (TypeError, ValueError):
        raise ImportInvalid(
            "bad_value", f"widget {name!r} of node {node.id} holds {value!r}", node.id
        ) from None


def _model(state: _State, node: _Mapped, folder: str, requested: str) -> str:
    name, held = model_resolve(requested, state.catalog.get(folder, []))
    entry = {"id": node.id, "type": node.comfy_type, "folder": folder, "name": name,
             "held": held}
    if name != requested:
        entry["requested"] = requested
    state.report.models.append(entry)
    if not held and node.id in state.ltx2.loaders and folder != "checkpoints":
        state.report.warn(node.id, node.comfy_type, f"no live worker holds {folder}/{name}: put "
                          f"ComfyUI's file at {folder}/{name} with the diffusers configs of "
                          f"what it holds beside it in {folder}/{_stem(name)}.diffusers/ (an "
                          "LTX2Pipeline folder's: transformer/ + scheduler/ for the diffusion "
                          "model, vae/ for the video VAE, audio_vae/ + vocoder/ for the audio "
                          "VAE, text_encoder/ + tokenizer/ + connectors/ for the text encoder)")
    elif not held and node.id in state.ltx2.loaders:
        state.report.warn(node.id, node.comfy_type, f"no live worker holds {folder}/{name}: put "
                          f"ComfyUI's file at {folder}/{name} with its configs, tokenizer and "
                          f"Gemma 3 in {folder}/{_stem(name)}.diffusers/ (an LTX2Pipeline "
                          "folder without the file's weights), or the whole diffusers "
                          "LTX2Pipeline folder (model_index.json, transformer/, vae/, audio_vae/, "
                          "vocoder/, connectors/, text_encoder/, tokenizer/, scheduler/): put it "
                          f"at {folder}/{_stem(name)}/")
    elif not held:
        state.report.warn(node.id, node.comfy_type, f"no live worker holds {folder}/{name}: put "
                          f"the file in the models dir under {folder}/")
    return name


def _asset(state: _State, node: _Mapped, name: str) -> str:
    asset_id = state.resolve_asset(name) if state.resolve_asset is not None else None
    entry = {"id": node.id, "type": node.comfy_type, "file": name}
    if asset_id is not None:
        state.report.assets.append({**entry, "asset": asset_id})
        return asset_id
    state.report.assets.append(entry)
    state.report.warn(node.id, node.comfy_type, f"loads {name!r}: upload it (POST /v1/assets) "
                      "and set this node's param 'asset' to the asset id")
    return name


def model_resolve(requested: str, held: list[str]) -> tuple[str, bool]:
    """A workflow's model name against the names the fleet holds in its folder: exact (with
    `\\` read as `/`), else the same stem (`qwen_3_4b.safetensors` ↔ a `qwen_3_4b/` folder
    model), else a unique entry with that file stem in a sub-folder."""
    name = requested.replace("\\", "/")
    if name in held:
        return name, True
    for candidate in held:
        if _stem(candidate) == _stem(name):
            return candidate, True
    base = _stem(PurePosixPath(name).name)
    matches = [c for c in held if _stem(PurePosixPath(c).name) == base]
    return (matches[0], True) if len(matches) == 1 else (name, False)


def _stem(name: str) -> str:
    for suffix in WEIGHT_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _spec(node: _Mapped) -> dict[str, Any]:
    inputs = {port: {"node": source, "port": out} for port, (source, out) in node.inputs.items()}
    return {"type": node.rule.type, "params": node.params, "inputs": inputs}


# --- outputs, closures, the target ------------------------------------------------------------


def _is_output(node: _Mapped) -> bool:
    descriptor = descriptor_get(node.rule.type)
    return bool(descriptor and descriptor.produces_takes)


def _is_preview(node: _Mapped) -> bool:
    descriptor = descriptor_get(node.rule.type)
    return bool(descriptor and descriptor.shows_value)


def _previews(state: _State, kept: set[str], target: str) -> set[str]:
    """The value previews (PreviewAny) that run with the target: those reading only nodes of
    its closure (a run computes one output's closure; the target itself when it is one)."""
    closure, _ = _closure(state, target)
    shown: set[str] = set()
    for node in sorted(state.mapped.values(), key=lambda n: id_order(n.id)):
        if not _is_preview(node) or node.id in kept:
            continue
        needs, blockers = _closure(state, node.id)
        if not blockers and needs - {node.id} <= closure and node.inputs:
            shown.add(node.id)
        else:
            state.report.drop(node.id, node.comfy_type, "it shows a value the target's run does "
                              "not compute (a run computes one output's closure)")
    return shown


def _closure(state: _State, output: str) -> tuple[set[str], list[str]]:
    """(mapped ids upstream of `output`, unmapped ids it needs) — breadth first."""
    seen, blockers, queue = {output}, [], deque([output])
    while queue:
        node = state.mapped[queue.popleft()]
        blockers += [b for b in node.blocked_by if b not in blockers]
        for source, _ in node.inputs.values():
            if source not in seen:
                seen.add(source)
                queue.append(source)
    return seen, blockers


def _outputs(state: _State) -> tuple[set[str], str]:
    """The nodes to keep (closures of the outputs that can run) and the target: the first
    SaveImage by id, else the first PreviewImage. Outputs that need an unmapped node are
    dropped; when none can run, the import fails naming the first unmapped node needed."""
    outputs = sorted((n for n in state.mapped.values() if _is_output(n)),
                     key=lambda n: (n.comfy_type != "SaveImage", id_order(n.id)))
    if not outputs:  # a workflow that only shows values: its first preview is the target
        outputs = sorted((n for n in state.mapped.values() if _is_preview(n)),
                         key=lambda n: id_order(n.id))[:1]
    kept: set[str] = set()
    usable: list[str] = []
    first_blocker: tuple[str, str] | None = None
    for output in outputs:
        closure, blockers = _closure(state, output.id)
        if blockers:
            first_blocker = first_blocker or (blockers[0], output.id)
            needs = ", ".join(f"{b} ({state.nodes[b][0]})" for b in blockers)
            state.report.drop(output.id, output.comfy_type,
                              f"an output that needs unmapped node(s) {needs}")
            continue
        kept |= closure
        usable.append(output.id)
    if usable:
        return kept, usable[0]
    if first_blocker is not None:
        blocker, output_id = first_blocker
        raise ImportInvalid(
            "unmapped_node",
            f"node {blocker} ({state.nodes[blocker][0]}) cannot be imported: "
            f"{state.unmapped[blocker]}; output {output_id} needs it", blocker,
        )
    raise ImportInvalid("no_output", "the workflow has no active output node (SaveImage or "
                        "PreviewImage) to render")
