"""ComfyUI's shipped MiniMax-H3 templates imported from the UI format with the tiny stack's parts
(the transformer as ComfyUI's single file, the VAEs and the Qwen3-VL as diffusers folders) and
rendered through the real executor into an MP4 with sound: video_minimax_h3_t2v and
video_minimax_h3_i2v (a subgraph: UNETLoader, CLIPLoader type minimax, two VAELoaders,
MiniMaxH3ImageToVideo, SamplerCustomAdvanced over BasicGuider / BasicScheduler / res_multistep,
VAEDecode + VAEDecodeAudio → CreateVideo; its ResolutionSelector cut away for the tiny size),
and video_minimax_h3_r2v (the same, flat, with MiniMaxH3ReferenceToVideo over two LoadImages).
The shipped files themselves are quantized: a clip of them is refused naming the file."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import asset_of, cut_resolution_selector, render

W, H, SECONDS, STEPS = 64, 32, 5, 2  # 5 s → 124 frames (17·7 + 5) at 24 fps


def _template(name: str, files: dict[str, str]) -> dict[str, Any]:
    """The shipped workflow with its subgraph's widgets set to the tiny parts, 2 steps, and
    its ResolutionSelector cut away (the subgraph's own width and height widgets give the
    size)."""
    from apps.importer.comfy_templates import shipped_file

    workflow: dict[str, Any] = json.loads(shipped_file(f"{name}.json") or b"{}")
    [subgraph] = workflow["definitions"]["subgraphs"]
    clip = next(n for n in workflow["nodes"] if n["type"] == subgraph["id"])
    cut_resolution_selector(workflow, clip)
    values = clip["widgets_values"]  # in the subgraph's widget inputs' order
    assert values[9] is False  # the turbo LoRA switched off: its steps are the PrimitiveInt's
    values[1:4] = [W, H, SECONDS]
    values[5:9] = [files["diffusion_model"], files["text_encoder"], files["vae"],
                   files["audio_vae"]]
    steps = next(n for n in subgraph["nodes"] if n["type"] == "PrimitiveInt"
                 and n["widgets_values"][0] == 20)
    steps["widgets_values"][0] = STEPS
    return workflow


def _flat_template(name: str, files: dict[str, str]) -> dict[str, Any]:
    """The shipped flat workflow (video_minimax_h3_r2v) with its loaders set to the tiny parts,
    2 steps, and its ResolutionSelector cut away (the reference node's own width and height
    widgets give the size)."""
    from apps.importer.comfy_templates import shipped_file

    workflow: dict[str, Any] = json.loads(shipped_file(f"{name}.json") or b"{}")
    by_type: dict[str, list[dict[str, Any]]] = {}
    for n in workflow["nodes"]:
        by_type.setdefault(n["type"], []).append(n)
    [selector] = by_type["ResolutionSelector"]
    cut = {link[0] for link in workflow["links"] if link[1] == selector["id"]}
    workflow["links"] = [link for link in workflow["links"] if link[0] not in cut]
    workflow["nodes"].remove(selector)
    [references] = by_type["MiniMaxH3ReferenceToVideo"]
    for port in references["inputs"]:
        port["link"] = None if port.get("link") in cut else port.get("link")
    references["widgets_values"][1:3] = [W, H]
    by_type["UNETLoader"][0]["widgets_values"][0] = files["diffusion_model"]
    by_type["CLIPLoader"][0]["widgets_values"][0] = files["text_encoder"]
    audio_reader = {link[1] for link in workflow["links"]
                    if link[3] == by_type["VAEDecodeAudio"][0]["id"]}
    for loader in by_type["VAELoader"]:
        role = "audio_vae" if loader["id"] in audio_reader else "vae"
        loader["widgets_values"][0] = files[role]
    [steps] = [n for n in by_type["PrimitiveInt"] if n["widgets_values"][0] == 20]
    steps["widgets_values"][0] = STEPS
    return workflow


@pytest.mark.django_db
@pytest.mark.parametrize("template", ["video_minimax_h3_t2v", "video_minimax_h3_i2v",
                                      "video_minimax_h3_r2v"])
def test_comfyuis_shipped_minimax_h3_template_imports_and_renders(settings, tmp_path, template):
    import av

    from apps.takes.storage import blob_read
    from workers.models.minimaxh3.tiny import FILES, write_tiny_files

    models_dir = tmp_path / "models"
    files = write_tiny_files(models_dir)
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    catalog: dict[str, list[str]] = {}
    for folder, name in FILES.values():
        catalog.setdefault(folder, []).append(name)
    held = {(folder, name): ("minimaxh3",) for folder, names in catalog.items() for name in names}
    assets = {name: asset_of(noise_image(96, 64, seed=seed)) for seed, name in enumerate((
        "transparent_rgb_gaming_mouse.png", "red_superboy_on_city_roof.png",
        "mecha_dragon_lightning.png"))}
    flat = template == "video_minimax_h3_r2v"
    workflow = (_flat_template if flat else _template)(template, files)
    result = comfy_import(workflow=workflow, catalog=catalog, files=held,
                          resolve_asset=assets.get)
    assert result.report.unmapped == []
    assert result.report.families == ["minimaxh3"]
    warnings = " ".join(w["message"] for w in result.report.warnings)
    assert "sampler 'res_multistep' is not used" in warnings
    nodes = result.graph.model_dump()["nodes"]
    kinds = [n["type"] for n in nodes.values()]
    assert kinds.count("minimaxh3/sample") == kinds.count("minimaxh3/decode") == 1
    assert kinds.count("minimaxh3/reference-to-video") == int(flat)
    if flat:  # both LoadImages wired, in their order, and the "match" size
        [r2v] = [n for n in nodes.values() if n["type"] == "minimaxh3/reference-to-video"]
        assert {port: r2v["inputs"][port]["node"] for port in ("image1", "image2")} == \
            {"image1": "137", "image2": "139"}
        assert r2v["params"]["mode"] == "match"
    [params] = {json.dumps(n["params"], sort_keys=True) for n in nodes.values()
                if n["type"] == "minimaxh3/load-files"}
    assert json.loads(params) == files
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        stream = mp4.streams.video[0]
        assert (stream.width, stream.height, float(stream.average_rate or 0)) == (W, H, 24.0)
        assert len(list(mp4.decode(stream))) == 124
        assert mp4.streams.audio, "the clip has its sound track"


@pytest.mark.django_db
def test_the_shipped_quantized_files_are_refused_by_name(settings, tmp_path):
    """ComfyUI's int8 "convrot" transformer (its name and layout: scales beside the weights)."""
    import torch
    from safetensors.torch import save_file

    from workers.models.minimaxh3 import keys
    from workers.models.minimaxh3.tiny import FILES, build_tiny_components, write_tiny_files

    models_dir = tmp_path / "models"
    files = write_tiny_files(models_dir)
    state = keys.to_original(build_tiny_components()["transformer"].state_dict())
    state["model.diffusion_model.blocks.0.attn.qkv_proj.weight_scale"] = torch.ones(1)
    name = "minimax_h3_fl2va_pruned_int8_convrot.safetensors"
    save_file(state, models_dir / "diffusion_models" / name)
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    catalog: dict[str, list[str]] = {}
    for folder, held_name in [*FILES.values(), ("diffusion_models", name)]:
        catalog.setdefault(folder, []).append(held_name)
    held = {(folder, n): ("minimaxh3",) for folder, names in catalog.items() for n in names}
    result = comfy_import(workflow=_template("video_minimax_h3_t2v",
                                             {**files, "diffusion_model": name}),
                          catalog=catalog, files=held)
    outcome, _ = render(result.graph.model_dump()["nodes"], result.target)
    assert outcome.status == "failed"
    assert f"{name} holds quantized weights" in str(outcome.error)


@pytest.mark.parametrize("template", ["video_fastvideo_fasth3_i2v", "video_fastvideo_fasth3_t2v"])
def test_fastvideos_fasth3_imports_with_its_shifts_and_dense_attention(template):
    """FastH3 (FastVideo's 8-step MiniMax-H3): its MiniMaxH3SigmaShift (10 / 3) becomes
    minimaxh3/sample's shifts; its block-sparse attention and attention-backend nodes fold
    (the farm attends densely, with the worker's kernel)."""
    from apps.importer.comfy_templates import shipped_file

    result = comfy_import(workflow=json.loads(shipped_file(f"{template}.json") or b"{}"),
                          catalog={})
    assert result.report.unmapped == [] and result.report.families == ["minimaxh3"]
    [sample] = [n for n in result.graph.model_dump()["nodes"].values()
                if n["type"] == "minimaxh3/sample"]
    assert (sample["params"]["shift_video"], sample["params"]["shift_audio"]) == (10.0, 3.0)
    dropped = {d["type"]: d["reason"] for d in result.report.dropped}
    assert "attends to every token" in dropped["BlockSparseAttention"]
    assert "INLINE_ATTENTION" in dropped["ModelAttentionBackend"]
    assert "shift_video and shift_audio" in dropped["MiniMaxH3SigmaShift"]


@pytest.mark.django_db
def test_a_reference_video_is_refused_by_name(tmp_path):
    """The r2v template with a LoadImage's frames also wired as ref_videos.ref_video_0."""
    from workers.models.minimaxh3.tiny import FILES

    files = {role: name for role, (_, name) in FILES.items()}
    workflow = _flat_template("video_minimax_h3_r2v", files)
    [references] = [n for n in workflow["nodes"] if n["type"] == "MiniMaxH3ReferenceToVideo"]
    [image] = [n for n in workflow["nodes"] if n["type"] == "LoadImage"
               and n["widgets_values"][0] == "red_superboy_on_city_roof.png"]
    slot = next(i for i, p in enumerate(references["inputs"])
                if p["name"] == "ref_videos.ref_video_0")
    link = max(link[0] for link in workflow["links"]) + 1
    workflow["links"].append([link, image["id"], 0, references["id"], slot, "IMAGE"])
    references["inputs"][slot]["link"] = link
    image["outputs"][0]["links"].append(link)
    catalog: dict[str, list[str]] = {}
    for folder, name in FILES.values():
        catalog.setdefault(folder, []).append(name)
    with pytest.raises(ImportInvalid, match=r"node 136 \(MiniMaxH3ReferenceToVideo\) cannot be "
                       r"imported: its reference videos and sounds \(ref_videos.ref_video_0\)"):
        comfy_import(workflow=workflow, catalog=catalog)
