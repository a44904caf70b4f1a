"""ComfyUI's Qwen prompt nodes on the farm: TextEncodeQwenImage21 (`qwenimage21/encode`) paints
QwenImage21Pipeline's image mode (also with five images, and at resolution 0: each image at its
own size); a UI-format Qwen-Image 2.1 edit workflow imports and renders
through the real executor; a Qwen-Image-Edit workflow with two references written the ComfyUI
way (ReferenceLatent of a VAEEncode per image) renders what the edit node with its VAE renders;
ComfyUI's shipped 2.1 text-to-image and Qwen-Image-Edit-2511 templates, and its multi-angle app
(CameraAngle's prompt into the 2511 edit), render on the tiny stacks."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from apps.importer.services import comfy_import
from tests.apps.importer.builder import Ui
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import asset_of, render, take_image
from workers.runners import RUNNERS

STEPS, SEED = 2, 3
IMAGES = [noise_image(64, 96, seed=1), noise_image(64, 96, seed=2)]  # one aspect: the pipeline
# sizes its latent from the last image, ComfyUI's node from the first


@pytest.fixture(scope="module")
def q21(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, str]]:
    from workers.models.qwenimage21.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("qwen21-import-models")
    return models_dir, write_tiny_stack(models_dir)


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any]) -> Any:
    return RUNNERS[node_type](ctx, params, inputs)


def held_by_fleet(held: dict[str, str], family: str, encoder: tuple[str, ...] | None = None
                  ) -> tuple[dict[str, list[str]], dict[tuple[str, str], tuple[str, ...]]]:
    """(catalog, files) of a fleet holding the stack's model, encoder and VAE, each file
    recognised as `family`'s (the encoder as `encoder`'s families when given)."""
    catalog = {"diffusion_models": [held["model"]], "text_encoders": [held["text_encoder"]],
               "vae": [held["vae"]]}
    files = {("diffusion_models", held["model"]): (family,),
             ("text_encoders", held["text_encoder"]): encoder or (family,),
             ("vae", held["vae"]): (family,)}
    return catalog, files


def sample_and_decode(ctx: Any, model: Any, vae: Any, out: dict[str, Any]) -> Any:
    """The encode node's prompt and latent sampled without CFG, then decoded: the image."""
    latent = run(ctx, "sample", {"seed": SEED, "steps": STEPS, "guidance": 0.0, "denoise": 1.0},
                 {"model": model, "positive": out["positive"], "latent": out["latent"]})["latent"]
    return run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def test_the_2_1_prompt_node_paints_the_pipeline_s_image_mode(q21, make_ctx):
    from workers.models.qwenimage21.tiny import smoke_pipeline

    models_dir, names = q21
    ctx = make_ctx(models_dir=models_dir)
    model = run(ctx, "load/diffusion-model", {"file": names["model"]}, {})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]}, {})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "family": "qwenimage21"}, {})["encoder"]
    out = run(ctx, "qwenimage21/encode",
              {"text": "make it blue", "negative_text": "", "resolution": 96},
              {"encoder": encoder, "vae": vae, "image_1": IMAGES[0], "image_2": IMAGES[1]})
    assert out["latent"].empty and out["latent"].pixel_size == (64, 128)
    assert len(out["negative"].embeds.references) == 2
    ours = sample_and_decode(ctx, model, vae, out)
    theirs = smoke_pipeline()("make it blue", image=IMAGES, output_resolution=96,
                              num_inference_steps=STEPS, use_kv_cache=False,
                              generator=torch.Generator("cpu").manual_seed(SEED)).images[0]
    assert ours.size == theirs.size == (64, 128)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs.convert("RGB")))


def test_resolution_0_keeps_each_image_s_own_size_rounded_to_sides_of_32(q21, make_ctx):
    models_dir, names = q21
    ctx = make_ctx(models_dir=models_dir)
    vae = run(ctx, "load/vae", {"file": names["vae"]}, {})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "family": "qwenimage21"}, {})["encoder"]
    sizes = [(100, 70), (50, 40), (20, 20), (64, 96), (130, 33)]  # ComfyUI: → 96×64, 64×32,
    # 32×32 (at least 32), 64×96 (as is), 128×32
    images = {f"image_{i}": noise_image(w, h, seed=i) for i, (w, h) in enumerate(sizes, 1)}
    out = run(ctx, "qwenimage21/encode", {"text": "make it blue", "negative_text": "",
                                          "resolution": 0}, {"encoder": encoder, "vae": vae,
                                                             **images})
    references = out["positive"].embeds.references
    assert [tuple(r.shape[-2:]) for r in references] == [(4, 6), (2, 4), (2, 2), (6, 4), (2, 8)]
    assert out["latent"].pixel_size == (96, 64)  # the first image's
    bare = run(ctx, "qwenimage21/encode", {"text": "a fox", "negative_text": "", "resolution": 0},
               {"encoder": encoder})
    assert bare["latent"].pixel_size == (1024, 1024)  # no image: ComfyUI's default


def test_five_images_at_resolution_0_paint_the_pipeline_s_image_mode(q21, make_ctx):
    """More than four condition images, each at its own size: the pipeline's image mode at the
    output_resolution whose ~area gives that size (78² px at 100×70 is 96×64 too)."""
    from workers.models.qwenimage21.tiny import smoke_pipeline

    models_dir, names = q21
    images = [noise_image(100, 70, seed=seed) for seed in range(5)]
    ctx = make_ctx(models_dir=models_dir)
    model = run(ctx, "load/diffusion-model", {"file": names["model"]}, {})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]}, {})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "family": "qwenimage21"}, {})["encoder"]
    out = run(ctx, "qwenimage21/encode",
              {"text": "make it blue", "negative_text": "", "resolution": 0},
              {"encoder": encoder, "vae": vae,
               **{f"image_{i}": image for i, image in enumerate(images, 1)}})
    assert len(out["positive"].embeds.references) == 5
    ours = sample_and_decode(ctx, model, vae, out)
    theirs = smoke_pipeline()("make it blue", image=images, output_resolution=78,
                              num_inference_steps=STEPS, use_kv_cache=False,
                              generator=torch.Generator("cpu").manual_seed(SEED)).images[0]
    assert ours.size == theirs.size == (96, 64)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs.convert("RGB")))


def qwen21_ui(names: dict[str, str], *, resolution: int = 96, images: int = 2) -> dict[str, Any]:
    """ComfyUI's 2.1 edit graph: loaders, `images` LoadImage (a.png, b.png, a.png, …) →
    TextEncodeQwenImage21 (its positive, negative and latent) → KSampler → VAEDecode →
    SaveImage."""
    ui = Ui()
    ui.add(1, "UNETLoader", [names["model"], "default"], outputs=["MODEL"])
    ui.add(2, "CLIPLoader", [names["text_encoder"], "qwen_image", "default"], outputs=["CLIP"])
    ui.add(3, "VAELoader", [names["vae"]], outputs=["VAE"])
    ports = [f"images.image_{i}" for i in range(1, images + 1)]
    ui.add(6, "TextEncodeQwenImage21", ["make it blue", "", resolution],
           inputs=[("clip", "CLIP"), ("vae", "VAE"), *((port, "IMAGE") for port in ports)],
           outputs=["CONDITIONING", "CONDITIONING", "LATENT"])
    for index, port in enumerate(ports):
        node = 10 + index
        ui.add(node, "LoadImage", ["ab"[index % 2] + ".png", "image"], outputs=["IMAGE", "MASK"])
        ui.link(node, 0, 6, port)
    ui.add(7, "KSampler", [SEED, "fixed", STEPS, 1, "euler", "simple", 1],
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                   ("latent_image", "LATENT")], outputs=["LATENT"])
    ui.add(8, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(9, "SaveImage", ["q21"], inputs=[("images", "IMAGE")])
    (ui.link(1, 0, 7, "model").link(2, 0, 6, "clip").link(3, 0, 6, "vae")
       .link(6, 0, 7, "positive").link(6, 1, 7, "negative").link(6, 2, 7, "latent_image")
       .link(7, 0, 8, "samples").link(3, 0, 8, "vae").link(8, 0, 9, "images"))
    return ui.doc()


def _assets() -> dict[str, str]:
    return {"a.png": asset_of(IMAGES[0]), "b.png": asset_of(IMAGES[1])}


@pytest.mark.django_db
def test_a_comfyui_2_1_edit_workflow_imports_and_renders(q21, settings, tmp_path):
    models_dir, held = q21
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    assets = _assets()
    catalog, files = held_by_fleet(held, "qwenimage21", encoder=("krea2", "qwenimage21"))
    result = comfy_import(workflow=qwen21_ui(held), catalog=catalog, files=files,
                          resolve_asset=assets.get)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["6"]["type"] == "qwenimage21/encode"
    assert nodes["6"]["params"] == {"text": "make it blue", "negative_text": "", "resolution": 96}
    assert set(nodes["6"]["inputs"]) == {"encoder", "vae", "image_1", "image_2"}
    assert nodes["2"]["params"]["family"] == "qwenimage21"
    outcome, done = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert take_image(done).size == (64, 128)  # the first image's size at resolution 96


@pytest.mark.django_db
def test_a_2_1_workflow_with_five_images_at_resolution_0_imports_and_renders(q21, settings,
                                                                              tmp_path):
    models_dir, held = q21
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    assets = _assets()
    catalog, files = held_by_fleet(held, "qwenimage21")
    result = comfy_import(workflow=qwen21_ui(held, resolution=0, images=5), catalog=catalog,
                          files=files, resolve_asset=assets.get)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["6"]["params"]["resolution"] == 0
    assert set(nodes["6"]["inputs"]) == {"encoder", "vae", *(f"image_{i}" for i in range(1, 6))}
    outcome, done = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert take_image(done).size == (64, 96)  # a.png's own 64×96: already sides of 32


def edit_ui(names: dict[str, str]) -> dict[str, Any]:
    """Qwen-Image-Edit 2509 the ComfyUI way with two references: TextEncodeQwenImageEditPlus
    without a VAE (the images for the VL), a ReferenceLatent of each image's VAEEncode chained
    on the prompt, ConditioningZeroOut as the negative, an empty latent."""
    ui = Ui()
    ui.add(1, "UNETLoader", [names["model"], "default"], outputs=["MODEL"])
    ui.add(2, "CLIPLoader", [names["text_encoder"], "qwen_image", "default"], outputs=["CLIP"])
    ui.add(3, "VAELoader", [names["vae"]], outputs=["VAE"])
    ui.add(4, "LoadImage", ["a.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(5, "LoadImage", ["b.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(6, "TextEncodeQwenImageEditPlus", ["make it blue"],
           inputs=[("clip", "CLIP"), ("vae", "VAE"), ("image1", "IMAGE"), ("image2", "IMAGE"),
                   ("image3", "IMAGE")], outputs=["CONDITIONING"])
    for node, image in ((7, 4), (8, 5)):
        ui.add(node, "VAEEncode", [], inputs=[("pixels", "IMAGE"), ("vae", "VAE")],
               outputs=["LATENT"])
        ui.link(image, 0, node, "pixels").link(3, 0, node, "vae")
    for node in (9, 10):
        ui.add(node, "ReferenceLatent", [], inputs=[("conditioning", "CONDITIONING"),
                                                    ("latent", "LATENT")],
               outputs=["CONDITIONING"])
    ui.add(11, "ConditioningZeroOut", [], inputs=[("conditioning", "CONDITIONING")],
           outputs=["CONDITIONING"])
    ui.add(12, "EmptySD3LatentImage", [32, 32, 1], outputs=["LATENT"])
    ui.add(13, "KSampler", [SEED, "fixed", STEPS, 1, "euler", "simple", 1],
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                   ("latent_image", "LATENT")], outputs=["LATENT"])
    ui.add(14, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(15, "SaveImage", ["edit"], inputs=[("images", "IMAGE")])
    (ui.link(1, 0, 13, "model").link(2, 0, 6, "clip").link(4, 0, 6, "image1")
       .link(5, 0, 6, "image2").link(6, 0, 9, "conditioning").link(7, 0, 9, "latent")
       .link(9, 0, 10, "conditioning").link(8, 0, 10, "latent").link(10, 0, 13, "positive")
       .link(6, 0, 11, "conditioning").link(11, 0, 13, "negative")
       .link(12, 0, 13, "latent_image").link(13, 0, 14, "samples").link(3, 0, 14, "vae")
       .link(14, 0, 15, "images"))
    return ui.doc()


@pytest.mark.django_db
def test_a_qwen_image_edit_workflow_with_reference_latents_renders_the_edit_node_s_image(
        settings, tmp_path):
    from workers.models.qwenimage.tiny import write_smoke_stack

    models_dir = tmp_path / "models"
    held = write_smoke_stack(models_dir)
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    global IMAGES
    saved, IMAGES = IMAGES, [noise_image(64, 64, seed=1), noise_image(64, 64, seed=2)]
    try:
        assets = _assets()
    finally:
        IMAGES = saved
    catalog, files = held_by_fleet(held, "qwenimage")
    result = comfy_import(workflow=edit_ui(held), catalog=catalog, files=files,
                          resolve_asset=assets.get)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert [nodes[n]["type"] for n in ("9", "10")] == ["qwenimage/reference-latent"] * 2
    assert "vae" not in nodes["6"]["inputs"]
    outcome, done = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    # The same prompt with the edit node encoding the references itself (its VAE wired, at the
    # images' own 64² area): the same reference latents, so the same image.
    nodes["6"]["inputs"]["vae"] = {"node": "3", "port": "vae"}
    nodes["6"]["params"]["megapixels"] = 64 * 64 / (1024 * 1024)
    nodes["13"]["inputs"]["positive"] = {"node": "6", "port": "conditioning"}
    for n in ("7", "8", "9", "10"):
        del nodes[n]
    outcome, direct = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert np.array_equal(np.asarray(take_image(done)), np.asarray(take_image(direct)))


@pytest.mark.django_db
def test_comfyuis_shipped_2_1_text_to_image_template_renders(q21, settings, tmp_path):
    """The workflow ComfyUI ships (image_qwen_image_2_1_t2i: a subgraph, its prompt enhancer
    switched off, a value preview on the prompt's way, QwenImage21Cache) with the tiny stack's
    files, 2 steps and a small size: it imports and renders."""
    from apps.importer.comfy_templates import shipped_file

    models_dir, held = q21
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow = json.loads(shipped_file("image_qwen_image_2_1_t2i.json") or b"{}")
    ids = {s["id"] for s in workflow["definitions"]["subgraphs"]}
    model = next(n for n in workflow["nodes"] if n["type"] in ids)
    values = model["widgets_values"]  # in the definition's input order
    values[6], values[12], values[13], values[14] = (
        STEPS, held["model"], held["text_encoder"], held["vae"])
    size = next(n for n in workflow["nodes"] if n["type"] == "ResolutionSelector")
    size["widgets_values"][1] = 0.1  # megapixels: its least (a 1:1 of 0.1 MP)
    catalog, files = held_by_fleet(held, "qwenimage21", encoder=("krea2", "qwenimage21"))
    result = comfy_import(workflow=workflow, catalog=catalog, files=files)
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["459:453"]["params"]["family"] == "qwenimage21"
    assert nodes["459:458"]["params"]["steps"] == STEPS
    outcome, done = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    width, height = take_image(done).size
    assert width == height and abs(width * height - 100_000) < 20_000


def shipped_2511_on_tiny_stack(name: str, asset: str, settings: Any, tmp_path: Any
                                ) -> tuple[dict[str, Any], str]:
    """ComfyUI's shipped Qwen-Image-Edit-2511 workflow `name` imported with the tiny stack's
    files in its loaders (each LoRA: the tiny one) and its LoadImage `asset` bound to a 96×80
    upload, made quick for the CPU: 2 steps at cfg 3, the image (and latent) ~96² px and the
    reference latents ~64² px. (its nodes, its target)."""
    from apps.importer.comfy_templates import shipped_file
    from workers.models.qwenimage.plugin import write_tiny_stack

    models_dir = tmp_path / "models"
    held = write_tiny_stack(models_dir)
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow = json.loads(shipped_file(f"{name}.json") or b"{}")
    files = {"UNETLoader": held["model"], "CLIPLoader": held["text_encoder"],
             "VAELoader": held["vae"], "LoraLoaderModelOnly": held["lora"]}
    every = [*workflow["nodes"], *(n for sub in workflow["definitions"]["subgraphs"]
                                  for n in sub["nodes"])]
    ours = {n["widgets_values"][0]: files[n["type"]] for n in every if n["type"] in files}
    for node in every:  # the loaders' own widgets and their promoted copies on the instance
        values = node.get("widgets_values")
        if isinstance(values, list):
            node["widgets_values"] = [ours.get(v, v) if isinstance(v, str) else v
                                      for v in values]
    catalog = {"diffusion_models": [held["model"]], "text_encoders": [held["text_encoder"]],
               "vae": [held["vae"]], "loras": [held["lora"]]}
    kinds = {("diffusion_models", held["model"]): ("qwenimage",),
             ("text_encoders", held["text_encoder"]): ("qwenimage",),
             ("vae", held["vae"]): ("qwenimage",)}
    assets = {asset: asset_of(noise_image(96, 80, seed=4))}
    result = comfy_import(workflow=workflow, catalog=catalog, files=kinds,
                          resolve_asset=assets.get)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert [n["params"]["asset"] for n in nodes.values() if n["type"] == "image/load"] == \
        [assets[asset]]
    for node in nodes.values():
        if node["type"] == "sample":
            node["params"] |= {"steps": STEPS, "guidance": 3.0}
        elif node["type"] == "image/scale-to-kontext":  # ~1 MP: CPU time, so ~96² px
            node |= {"type": "image/scale-to-pixels",
                     "params": {"megapixels": 0.01, "resolution_steps": 16, "method": "lanczos"}}
        elif node["type"] == "qwenimage/edit":
            node["params"]["megapixels"] = 0.004
    return nodes, result.target


@pytest.mark.django_db
def test_comfyuis_shipped_2511_edit_template_renders_its_references_at_timestep_zero(
        settings, tmp_path):
    """The workflow ComfyUI ships for Qwen-Image-Edit-2511 (image_qwen_image_edit_2511_int8: a
    subgraph, its Lightning switch off, FluxKontextMultiReferenceLatentMethod
    "index_timestep_zero" on both prompts) on the tiny stack: it imports and renders; the same
    graph with the 2509 reading ("index") renders another image (the method reaches the
    sampler)."""
    nodes, target = shipped_2511_on_tiny_stack("image_qwen_image_edit_2511_int8",
                                               "lily_girl_blue.png", settings, tmp_path)
    assert [nodes[n]["params"]["method"] for n in ("170:147", "170:148")] == \
        ["index_timestep_zero"] * 2
    outcome, done = render(nodes, target)
    assert outcome.status == "succeeded", outcome.error
    image = np.asarray(take_image(done))
    assert image.shape[:2] == (96, 112)  # 96×80 scaled to ~0.01 MP in steps of 16
    for n in ("170:147", "170:148"):
        nodes[n]["params"]["method"] = "index"
    outcome, as_2509 = render(nodes, target)
    assert outcome.status == "succeeded", outcome.error
    assert not np.array_equal(image, np.asarray(take_image(as_2509)))


@pytest.mark.django_db
def test_comfyuis_multi_angle_app_renders_the_camera_angle_s_prompt(settings, tmp_path):
    """ComfyUI's Qwen multi-angle app (template_qwen_multiangle.app: CameraAngle's prompt into
    the 2511 edit with the multiple-angles LoRA and Lightning's) on the tiny stack: it imports
    and renders; another angle is another prompt, so another image."""
    nodes, target = shipped_2511_on_tiny_stack("template_qwen_multiangle.app",
                                               "cyber_genesis.png", settings, tmp_path)
    assert nodes["219:151"]["inputs"]["text"] == {"node": "221", "port": "prompt"}
    outcome, done = render(nodes, target)
    assert outcome.status == "succeeded", outcome.error
    image = np.asarray(take_image(done))
    assert image.shape[:2] == (96, 112)
    nodes["221"]["params"] |= {"horizontal_angle": 180, "vertical_angle": -30}
    outcome, back = render(nodes, target)
    assert outcome.status == "succeeded", outcome.error
    assert not np.array_equal(image, np.asarray(take_image(back)))
