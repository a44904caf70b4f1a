"""Qwen-Image-Edit through the family seam: the `qwenimage/edit` node's prompt (encoded by the
Qwen2.5-VL with its images) and reference latents, sampled by the generic nodes, against
diffusers' QwenImageEditPlusPipeline (1, 2, 3 images) and QwenImageEditPipeline on the tiny
stack; runs with different reference counts in one worker; a missing processor named.

The pipelines size reference latents to ~1 MP (and Qwen-Image-Edit's VL image too): on CPU
that costs tens of seconds per image with the tiny VAE, so both sides use a smaller area here
— the node's `megapixels`, and the pipeline's own constant patched to the same area (its
calculate_dimensions is unchanged: only the target area differs)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.helpers import noise_image
from workers.runners import RUNNERS

W, H, STEPS, GUIDANCE = 32, 32, 2, 3.0  # the pipeline's true_cfg_scale: GUIDANCE + 1
AREA = 64 * 64  # the reference latents' images (the pipelines': 1024²)
PROMPT, NEGATIVE = "make it blue", " "
IMAGES = [noise_image(80, 48, seed=1), noise_image(48, 64, seed=2), noise_image(64, 64, seed=3)]


@pytest.fixture(scope="module")
def qwen_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.qwenimage.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("qwen-edit-models")
    return models_dir, write_tiny_stack(models_dir)


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


def edit_chain(ctx: Any, names: dict[str, str], images: list[Any], variant: str = "plus",
               seed: int = 5, guidance: float = GUIDANCE) -> Any:
    """load ×3 → qwenimage/edit (prompt and negative, each with the images) → empty → sample;
    the latent."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    wired = {"encoder": encoder, "vae": vae,
             **dict(zip(("image", "image_2", "image_3"), images, strict=False))}
    params = {"variant": variant, "megapixels": AREA / (1024 * 1024)}

    def conditioning(text: str) -> Any:
        return run(ctx, "qwenimage/edit", {**params, "text": text}, wired)["conditioning"]

    inputs = {"model": model, "positive": conditioning(PROMPT), "negative": conditioning(NEGATIVE),
              "latent": run(ctx, "latent/empty", {"width": W, "height": H})["latent"]}
    sample = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0}
    return run(ctx, "sample", sample, inputs)["latent"].samples


def pipeline_latents(monkeypatch: pytest.MonkeyPatch, images: list[Any], variant: str = "plus",
                     seed: int = 5, guidance: float = GUIDANCE) -> torch.Tensor:
    """The edit pipeline's final latents [1, 16, H/8, W/8] at the same reference area."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    from workers.models.qwenimage.engine import unpack
    from workers.models.qwenimage.tiny import smoke_edit_pipeline

    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", AREA)
    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: original(AREA, ratio))
    pipe = smoke_edit_pipeline(variant)
    packed = pipe(image=images if variant == "plus" else images[0], prompt=PROMPT,
                  negative_prompt=NEGATIVE, true_cfg_scale=guidance + 1.0, height=H, width=W,
                  num_inference_steps=STEPS, generator=torch.Generator("cpu").manual_seed(seed),
                  output_type="latent").images  # [1, S, 64]
    return unpack(packed, H // 8, W // 8)


@pytest.mark.parametrize("count", [1, 3])
def test_edit_plus_samples_exactly_what_the_edit_plus_pipeline_samples(qwen_stack, make_ctx,
                                                                        monkeypatch, count):
    """Without CFG (one row per forward on both sides) the latents are bit-identical."""
    models_dir, names = qwen_stack
    ours = edit_chain(make_ctx(models_dir=models_dir), names, IMAGES[:count], guidance=0.0)
    theirs = pipeline_latents(monkeypatch, IMAGES[:count], guidance=0.0)
    assert ours.shape == theirs.shape == (1, 16, H // 8, W // 8)
    assert torch.equal(ours, theirs)


def test_edit_plus_with_true_cfg_is_the_pipeline_within_float_rounding(qwen_stack, make_ctx,
                                                                         monkeypatch):
    """With CFG the farm puts the prompt's and the negative's rows in ONE forward (the shorter
    prompt zero-padded under the transformer's text mask); the pipeline runs two forwards of
    one row. Batch-2 kernels round differently: measured 1.43e-6 at most, not bit-identical."""
    models_dir, names = qwen_stack
    ours = edit_chain(make_ctx(models_dir=models_dir), names, IMAGES[:2])
    theirs = pipeline_latents(monkeypatch, IMAGES[:2])
    assert (ours - theirs).abs().max().item() < 5e-6


def test_edit_samples_exactly_what_the_edit_pipeline_samples(qwen_stack, make_ctx, monkeypatch):
    models_dir, names = qwen_stack
    ours = edit_chain(make_ctx(models_dir=models_dir), names, IMAGES[:1], variant="edit",
                      guidance=0.0)
    theirs = pipeline_latents(monkeypatch, IMAGES[:1], variant="edit", guidance=0.0)
    assert torch.equal(ours, theirs)


def test_runs_with_other_reference_counts_sample_apart_and_alike_ones_together(qwen_stack,
                                                                                make_ctx):
    """Four concurrent runs, two with one reference and two with two: the transformer reads
    one set of image shapes per forward, so a forward serves runs of one reference layout (its
    progress `batch` at most 2), and each run's latents are its solo run's within rounding."""
    from tests.workers.conftest import Recorder

    models_dir, names = qwen_stack
    runs = {(seed, count): IMAGES[:count] for seed in (1, 2) for count in (1, 2)}
    solo = {key: edit_chain(make_ctx(models_dir=models_dir), names, images, seed=key[0],
                            guidance=0.0) for key, images in runs.items()}
    batches: dict[tuple[int, int], list[int]] = {key: [] for key in runs}
    results: dict[tuple[int, int], Any] = {}

    def one(key: tuple[int, int]) -> None:
        class Batches(Recorder):
            def report(self, step: int, total: int, preview: bytes | None,
                       batch: int | None = None) -> None:
                batches[key].append(batch or 0)
                super().report(step, total, preview, batch)

        ctx = make_ctx(Batches(), models_dir=models_dir)
        results[key] = edit_chain(ctx, names, runs[key], seed=key[0], guidance=0.0)

    threads = [threading.Thread(target=one, args=(key,)) for key in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(1 <= b <= 2 for seen in batches.values() for b in seen), batches
    assert max(b for seen in batches.values() for b in seen) == 2, batches
    for key in runs:
        assert (results[key] - solo[key]).abs().max().item() < 1e-5, key


def test_a_text_encoder_without_the_processor_files_is_refused_naming_its_folder(make_ctx,
                                                                                 tmp_path):
    from workers.models.qwenimage.tiny import write_smoke_stack
    from workers.runners.base import NodeFailed

    names = write_smoke_stack(tmp_path, seed=2)  # other weights: no cache hit
    folder = tmp_path / "text_encoders" / names["text_encoder"].replace(".safetensors",
                                                                        ".tokenizer")
    (folder / "processor_config.json").unlink()
    ctx = make_ctx(models_dir=tmp_path)
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    with pytest.raises(NodeFailed, match=rf"no Qwen2-VL processor.*{folder.name}/"):
        run(ctx, "qwenimage/edit", {"text": "x", "variant": "plus"},
            {"encoder": encoder, "image": IMAGES[0]})
    assert run(ctx, "encode/text", {"text": "x"}, {"encoder": encoder})["conditioning"]  # t2i: none
    with pytest.raises(NodeFailed, match="at most 1 image"):
        run(ctx, "qwenimage/edit", {"text": "x", "variant": "edit"},
            {"encoder": encoder, "image": IMAGES[0], "image_2": IMAGES[1]})
