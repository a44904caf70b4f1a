"""FLUX.1 Kontext on the farm: the `flux1/reference` node paints what diffusers'
FluxKontextPipeline paints on the tiny FLUX.1 stack (the reference sized to its preferred
Kontext resolution); jobs with other references run apart and each matches its solo run; bad
references fail naming the problem; ComfyUI's shipped flux_kontext_dev_basic imports from the
UI format and renders on the tiny stack."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.helpers import noise_image, png_bytes
from tests.workers.vocab_helpers import asset_of, render, take_image
from workers.runners import RUNNERS
from workers.runners.base import NodeFailed

W, H, STEPS, GUIDANCE = 64, 48, 3, 2.5
PROMPT = "make the lighthouse red"
REFERENCE = noise_image(80, 64, seed=5)  # aspect 1.25: the pipeline sizes it to 1104×944


@pytest.fixture(scope="module")
def flux_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.flux1.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("kontext-models")
    return models_dir, write_smoke_stack(models_dir)


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None):
    return RUNNERS[node_type](ctx, params, inputs or {})


def loaded(ctx: Any, names: dict[str, str]) -> tuple[Any, Any, Any]:
    """(model, vae, the prompt's conditioning) of the tiny stack."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "file_2": names["text_encoder_2"]})["encoder"]
    return model, vae, run(ctx, "encode/text", {"text": PROMPT}, {"encoder": encoder})[
        "conditioning"]


def sample(ctx: Any, model: Any, vae: Any, positive: Any, seed: int = 7) -> tuple[Any, Any]:
    """(latent, image) of `positive` sampled at W×H."""
    empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": GUIDANCE, "denoise": 1.0}
    latent = run(ctx, "sample", params, {"model": model, "positive": positive,
                                         "latent": empty})["latent"]
    return latent, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def with_latents(ctx: Any, vae: Any, positive: Any, images: tuple[Any, ...]) -> Any:
    """`positive` with each image's `vae/encode` chained as a reference latent."""
    for image in images:
        latent = run(ctx, "vae/encode", {}, {"vae": vae, "image": image})["latent"]
        positive = run(ctx, "flux1/reference-latent", {}, {"conditioning": positive,
                                                           "latent": latent})["conditioning"]
    return positive


def test_the_reference_node_paints_what_flux_kontext_pipeline_paints(flux_stack, make_ctx):
    from workers.models.flux1.tiny import smoke_pipeline

    models_dir, names = flux_stack
    ctx = make_ctx(models_dir=models_dir)
    model, vae, positive = loaded(ctx, names)
    edited = run(ctx, "flux1/reference", {}, {"conditioning": positive, "vae": vae,
                                              "image": REFERENCE})["conditioning"]
    (reference,) = edited.embeds.references
    assert reference.shape == (1, 16, 944 // 8, 1104 // 8)  # the Kontext resolution nearest 5:4
    latent, image = sample(ctx, model, vae, edited)
    theirs = smoke_pipeline(kontext=True)(
        image=REFERENCE, prompt=PROMPT, height=H, width=W, max_area=W * H,
        num_inference_steps=STEPS, guidance_scale=GUIDANCE,
        generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert png_bytes(image) == png_bytes(theirs)
    plain, _ = sample(ctx, model, vae, positive)
    assert (latent.samples - plain.samples).abs().max() > 1e-3  # the reference reaches the model


def test_runs_with_different_references_batch_by_layout_and_each_matches_its_solo_run(
        flux_stack, make_ctx):
    """Jobs share a forward when their latents and references have the same sizes; others run
    apart in the same iteration (engine.layout). Each result is its solo run's; two references
    sit side by side (ComfyUI's offset method), in their order."""
    models_dir, names = flux_stack
    a, b, c = noise_image(32, 32, seed=1), noise_image(32, 32, seed=2), noise_image(48, 32, seed=3)
    cases = {0: (), 1: (a,), 2: (b,), 3: (c,), 4: (a, c), 5: (c, a), 6: ()}

    def chain(ctx: Any, seed: int) -> Any:
        model, vae, positive = loaded(ctx, names)
        return sample(ctx, model, vae, with_latents(ctx, vae, positive, cases[seed]), seed=0)[0]

    solo = {s: chain(make_ctx(models_dir=models_dir), s).samples for s in cases}
    results: dict[int, Any] = {}
    batches: dict[int, list[int]] = {seed: [] for seed in cases}

    def one(seed: int) -> None:
        results[seed] = chain(make_ctx(Recorder(batches=batches[seed]), models_dir=models_dir), seed).samples

    threads = [threading.Thread(target=one, args=(s,)) for s in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(max(b) for b in batches.values()) > 1
    for seed in (3, 4, 5):  # a layout of its own: each step's `batch` says it ran apart
        assert set(batches[seed]) == {1}, (seed, batches[seed])
    for seed in cases:
        assert torch.allclose(results[seed], solo[seed], atol=1e-4), seed
    assert not torch.allclose(solo[1], solo[2], atol=1e-3)  # the reference's content matters
    assert not torch.allclose(solo[4], solo[5], atol=1e-3)  # and the references' order


def test_references_sit_at_index_1_each_beside_or_below_those_before():
    """One reference at index 1 from the origin (the pipeline's); each further one below the
    canvas so far, or beside it when that keeps the canvas squarer (ComfyUI's offset method;
    ids count 2×2 patches, the shapes latent pixels)."""
    from workers.models.flux1.engine import reference_ids

    refs = (torch.zeros(1, 16, 4, 6), torch.zeros(1, 16, 4, 2), torch.zeros(1, 16, 2, 2))
    first, second, third = reference_ids(refs, torch.float32, "cpu")
    assert first[:, 0].eq(1).all() and first[0].tolist() == [1, 0, 0]
    assert first[-1].tolist() == [1, 1, 2]
    assert second[0].tolist() == [1, 2, 0]  # below: 4 + 4 rows is not taller than 2 + 6 wide
    assert third[0].tolist() == [1, 0, 3]  # beside: 2 + 8 rows would be taller than 2 + 6 wide


def test_a_reference_must_be_flux1_s(flux_stack, smoke_stack, make_ctx):
    """A Z-Image prompt, a FLUX.1 latent of odd sides or another family's latent: each refused
    naming the input."""
    from workers.models.values import Latent

    models_dir, names = flux_stack
    ctx = make_ctx(models_dir=models_dir)
    _, vae, positive = loaded(ctx, names)
    zimage = make_ctx()
    encoder = run(zimage, "load/text-encoder", {"file": smoke_stack.names["text_encoder"]})[
        "encoder"]
    other = run(zimage, "encode/text", {"text": PROMPT}, {"encoder": encoder})["conditioning"]
    with pytest.raises(NodeFailed, match=r"input 'conditioning' is .*condition FLUX\.1 prompts"):
        run(ctx, "flux1/reference", {}, {"conditioning": other, "vae": vae, "image": REFERENCE})
    for shape in ((1, 16, 5, 4), (1, 128, 4, 4)):
        with pytest.raises(NodeFailed, match=r"input 'latent' must be a FLUX\.1 latent"):
            run(ctx, "flux1/reference-latent", {}, {"conditioning": positive,
                                                    "latent": Latent(torch.zeros(shape))})


@pytest.mark.django_db
def test_comfyuis_shipped_kontext_template_imports_and_renders(settings, tmp_path):
    """The workflow ComfyUI ships for FLUX.1 Kontext dev (flux_kontext_dev_basic: a subgraph;
    its second LoadImage bypassed, so the ImageStitch passes the first image through;
    FluxKontextImageScale → VAEEncode → ReferenceLatent on the prompt, the same latent sampled)
    with the tiny stack's files and its LoadImage bound to an uploaded asset: it imports with
    nothing unmapped and renders at 2 steps (the Kontext scale swapped for a small resize)."""
    from apps.importer.comfy_templates import shipped_file
    from apps.importer.services import comfy_import
    from workers.models.flux1.tiny import write_smoke_stack

    models_dir = tmp_path / "models"
    held = write_smoke_stack(models_dir)
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow = json.loads(shipped_file("flux_kontext_dev_basic.json") or b"{}")
    files = {"UNETLoader": [held["model"]], "VAELoader": [held["vae"]],
             "DualCLIPLoader": [held["text_encoder"], held["text_encoder_2"]]}
    for node in workflow["definitions"]["subgraphs"][0]["nodes"]:
        if node["type"] in files:
            node["widgets_values"][: len(files[node["type"]])] = files[node["type"]]
    catalog = {"diffusion_models": [held["model"]], "vae": [held["vae"]],
               "text_encoders": [held["text_encoder"], held["text_encoder_2"]]}
    kinds = {("diffusion_models", held["model"]): ("flux1",), ("vae", held["vae"]): ("flux1",),
             ("text_encoders", held["text_encoder"]): ("flux1",),
             ("text_encoders", held["text_encoder_2"]): ("flux1",)}
    assets = {"flux_kontext_dev_basic_input_image.jpg": asset_of(noise_image(40, 64, seed=6))}
    result = comfy_import(workflow=workflow, catalog=catalog, files=kinds,
                          resolve_asset=assets.get)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["192:177"]["type"] == "flux1/reference-latent"
    assert nodes["192:42"]["type"] == "image/scale-to-kontext"
    assert nodes["192:31"]["params"]["guidance"] == 2.5  # the FluxGuidance, folded
    nodes["192:31"]["params"]["steps"] = 2
    nodes["192:42"] |= {"type": "image/resize",  # CPU time: ~1 MP is the tiny stack's 17 s
                        "params": {"width": 48, "height": 80, "method": "lanczos", "fit": "crop"}}
    outcome, done = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    image = np.asarray(take_image(done))
    assert image.shape == (80, 48, 3)  # the reference's latent is the one sampled
    assert image.std() > 0
