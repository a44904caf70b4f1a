"""Qwen-Image-Edit through the family seam: the `qwenimage/edit` node's prompt (encoded by the
Qwen2.5-VL with its images) and reference latents, sampled by the generic nodes, against
diffusers' QwenImageEditPlusPipeline (1, 2, 3 images) and QwenImageEditPipeline on the tiny
stack; 2511 (references at timestep 0: the prompt's method, a config's zero_cond_t or ComfyUI's
marker) against the pipeline with zero_cond_t; runs with different reference counts, or with
and without timestep zero, in one worker; a missing processor named.

The pipelines size reference latents to ~1 MP (and Qwen-Image-Edit's VL image too): on CPU
that costs tens of seconds per image with the tiny VAE, so both sides use a smaller area here
— the node's `megapixels`, and the pipeline's own constant patched to the same area (its
calculate_dimensions is unchanged: only the target area differs)."""

from __future__ import annotations

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
               seed: int = 5, guidance: float = GUIDANCE, method: str | None = None) -> Any:
    """load ×3 → qwenimage/edit (prompt and negative, each with the images) [→
    qwenimage/reference-latent with `method` alone] → empty → sample; the latent."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    wired = {"encoder": encoder, "vae": vae,
             **dict(zip(("image", "image_2", "image_3"), images, strict=False))}
    params = {"variant": variant, "megapixels": AREA / (1024 * 1024)}

    def conditioning(text: str) -> Any:
        encoded = run(ctx, "qwenimage/edit", {**params, "text": text}, wired)["conditioning"]
        if method is None:
            return encoded
        return run(ctx, "qwenimage/reference-latent", {"method": method},
                   {"conditioning": encoded})["conditioning"]

    inputs = {"model": model, "positive": conditioning(PROMPT), "negative": conditioning(NEGATIVE),
              "latent": run(ctx, "latent/empty", {"width": W, "height": H})["latent"]}
    sample = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0}
    return run(ctx, "sample", sample, inputs)["latent"].samples


def pipeline_latents(monkeypatch: pytest.MonkeyPatch, images: list[Any], variant: str = "plus",
                     seed: int = 5, guidance: float = GUIDANCE, zero_cond_t: bool = False,
                     weights: int = 0) -> torch.Tensor:
    """The edit pipeline's final latents [1, 16, H/8, W/8] at the same reference area
    (`zero_cond_t`: its transformer configured as Qwen-Image-Edit-2511's; `weights`: the tiny
    stack's seed)."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    from workers.models.qwenimage.engine import unpack
    from workers.models.qwenimage.tiny import smoke_edit_pipeline

    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", AREA)
    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: original(AREA, ratio))
    pipe = smoke_edit_pipeline(variant, seed=weights, zero_cond_t=zero_cond_t)
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


@pytest.mark.parametrize("count", [1, 2])
def test_2511_samples_exactly_what_the_edit_plus_pipeline_samples_with_zero_cond_t(
        qwen_stack, make_ctx, monkeypatch, count):
    """Qwen-Image-Edit-2511: the prompt's method index_timestep_zero (ComfyUI's
    FluxKontextMultiReferenceLatentMethod) on a transformer whose config has no zero_cond_t
    samples what QwenImageEditPlusPipeline samples with zero_cond_t=True, bit for bit; it is
    not what the 2509 reading (index) samples."""
    models_dir, names = qwen_stack
    ctx = make_ctx(models_dir=models_dir)
    ours = edit_chain(ctx, names, IMAGES[:count], guidance=0.0, method="index_timestep_zero")
    theirs = pipeline_latents(monkeypatch, IMAGES[:count], guidance=0.0, zero_cond_t=True)
    assert torch.equal(ours, theirs)
    index = edit_chain(ctx, names, IMAGES[:count], guidance=0.0, method="index")
    assert torch.equal(index, pipeline_latents(monkeypatch, IMAGES[:count], guidance=0.0))
    assert not torch.allclose(index, ours, atol=1e-4)


@pytest.mark.parametrize("how", ["config", "marker"])
def test_a_2511_transformer_reads_references_at_timestep_zero_without_a_method_node(
        make_ctx, monkeypatch, tmp_path, how):
    """A transformer whose config says zero_cond_t (a 2511 diffusers folder's, or a sidecar's),
    or a ComfyUI single file with its `__index_timestep_zero__` marker, needs no method: the
    plain edit prompt samples what the pipeline with zero_cond_t samples; `index` turns it off."""
    import json

    from safetensors.torch import load_file, save_file

    from workers.models.qwenimage.tiny import write_smoke_stack

    names = write_smoke_stack(tmp_path, seed=3)  # other weights: no cache hit (a worker keys a
    transformer = tmp_path / "diffusion_models" / names["model"]  # single file by its content)
    stem = names["model"].removesuffix(".safetensors")
    if how == "config":
        config = transformer.with_name(f"{stem}.config.json")
        config.write_text(json.dumps({**json.loads(config.read_text()), "zero_cond_t": True}))
    else:
        state = load_file(transformer)
        state["model.diffusion_model.__index_timestep_zero__"] = torch.tensor([])
        save_file(state, transformer)
    ctx = make_ctx(models_dir=tmp_path)
    ours = edit_chain(ctx, names, IMAGES[:1], guidance=0.0)
    assert torch.equal(ours, pipeline_latents(monkeypatch, IMAGES[:1], guidance=0.0,
                                              zero_cond_t=True, weights=3))
    index = edit_chain(ctx, names, IMAGES[:1], guidance=0.0, method="index")
    assert torch.equal(index, pipeline_latents(monkeypatch, IMAGES[:1], guidance=0.0, weights=3))


def test_edit_samples_exactly_what_the_edit_pipeline_samples(qwen_stack, make_ctx, monkeypatch):
    models_dir, names = qwen_stack
    ours = edit_chain(make_ctx(models_dir=models_dir), names, IMAGES[:1], variant="edit",
                      guidance=0.0)
    theirs = pipeline_latents(monkeypatch, IMAGES[:1], variant="edit", guidance=0.0)
    assert torch.equal(ours, theirs)


def test_one_forward_serves_jobs_of_one_reference_layout_and_others_run_apart():
    """The transformer reads one set of image shapes per forward: of three jobs, the two with
    one 16×16 reference share a forward, the one with two references runs apart (each job's
    `forward_jobs`, the progress `batch`), and each velocity is its solo one within rounding."""
    from workers.models.qwenimage.engine import QwenPrompt, predict
    from workers.models.qwenimage.tiny import build_tiny_components
    from workers.sampling import SampleJob
    from workers.sampling.batcher import FORWARD_JOBS

    transformer = build_tiny_components(0)["transformer"]
    rng = torch.Generator().manual_seed(0)
    sigmas, timesteps = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([1000.0, 500.0])

    def job(refs: int, words: int) -> SampleJob:
        prompt = QwenPrompt(torch.randn(words, 16, generator=rng),
                            tuple(torch.randn(1, 16, 2, 2, generator=rng) for _ in range(refs)))
        return SampleJob(torch.randn(1, 16, 4, 4, generator=rng), sigmas, timesteps, prompt)

    jobs = [job(1, 5), job(2, 7), job(1, 9)]
    together = predict(transformer, jobs)
    assert [j.extra[FORWARD_JOBS] for j in jobs] == [2, 1, 2]
    for one, velocity in zip(jobs, together, strict=True):
        assert (predict(transformer, [one])[0] - velocity).abs().max().item() < 1e-5


def test_runs_with_and_without_timestep_zero_never_share_a_forward():
    """Timestep zero is one switch per forward (diffusers' zero_cond_t): of three jobs with the
    same latent and reference sizes, the two 2511 ones share a forward, the 2509 one runs
    apart; each velocity is its solo one within rounding, and the switch is restored."""
    from workers.models.qwenimage.engine import QwenPrompt, predict
    from workers.models.qwenimage.tiny import build_tiny_components
    from workers.sampling import SampleJob
    from workers.sampling.batcher import FORWARD_JOBS

    transformer = build_tiny_components(0)["transformer"]
    rng = torch.Generator().manual_seed(0)
    sigmas, timesteps = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([1000.0, 500.0])

    def job(zero: bool) -> SampleJob:
        prompt = QwenPrompt(torch.randn(6, 16, generator=rng),
                            (torch.randn(1, 16, 2, 2, generator=rng),), timestep_zero=zero)
        return SampleJob(torch.randn(1, 16, 4, 4, generator=rng), sigmas, timesteps, prompt)

    jobs = [job(True), job(False), job(True)]
    together = predict(transformer, jobs)
    assert [j.extra[FORWARD_JOBS] for j in jobs] == [2, 1, 2]
    assert not transformer.zero_cond_t and not transformer.transformer_blocks[0].zero_cond_t
    for one, velocity in zip(jobs, together, strict=True):
        assert (predict(transformer, [one])[0] - velocity).abs().max().item() < 1e-5
    off = SampleJob(jobs[0].latents, sigmas, timesteps,
                    jobs[0].positive._replace(timestep_zero=False))  # the same run, as 2509
    assert (predict(transformer, [off])[0] - together[0]).abs().max().item() > 1e-4


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
