"""The diffusion runners, called as the executor calls them, against the diffusers pipelines.

The reference pipelines are built from the same in-memory tiny modules that the smoke stack
saved (the transformer through the ComfyUI key layout), so equality proves the loaders and the
hand-written math at once.
"""

from __future__ import annotations

import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.helpers import noise_image, png_bytes
from workers.runners import diffusion  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS, NodeFailed, RunCancelled

W, H, STEPS = 64, 48, 4


def turbo_params(stack, **overrides):
    params = {
        "prompt": "a red fox in the snow",
        "negative_prompt": "",
        "width": W,
        "height": H,
        "steps": STEPS,
        "guidance": 0.0,
        "seed": 7,
        "strength": 0.6,
        "model": stack.names["model"],
        "vae": stack.names["vae"],
        "text_encoder": stack.names["text_encoder"],
    }
    return {**params, **overrides}


def run(node_type, ctx, params=None, inputs=None):
    return RUNNERS[node_type](ctx, params or {}, inputs or {})


def reference(pipe, params, **extra):
    return pipe(
        params["prompt"],
        negative_prompt=params["negative_prompt"] or None,
        width=params["width"],
        height=params["height"],
        num_inference_steps=params["steps"],
        guidance_scale=params["guidance"],
        generator=torch.Generator("cpu").manual_seed(params["seed"]),
        **extra,
    ).images[0]


@pytest.mark.parametrize(("guidance", "negative"), [(0.0, ""), (3.0, ""), (3.0, "blurry")])
def test_the_turbo_node_paints_exactly_what_the_pipeline_paints(
    smoke_stack, make_ctx, txt2img_pipeline, guidance, negative
):
    params = turbo_params(smoke_stack, guidance=guidance, negative_prompt=negative)
    ours = run("zimage/turbo", make_ctx(), params)["image"]
    assert ours.mode == "RGB" and ours.size == (W, H)
    assert png_bytes(ours) == png_bytes(reference(txt2img_pipeline, params))


def primitive_chain(stack, ctx, *, seed=7, guidance=0.0, negative_text=None, image=None, denoise=1.0):
    """load → encode → latent (empty or vae/encode) → sample → the final latent and image."""
    model = run("load/diffusion-model", ctx, {"file": stack.names["model"]})["model"]
    vae = run("load/vae", ctx, {"file": stack.names["vae"]})["vae"]
    encoder = run("load/text-encoder", ctx, {"file": stack.names["text_encoder"]})["encoder"]
    positive = run(
        "encode/text", ctx, {"text": "unused"}, {"encoder": encoder, "text": "a red fox in the snow"}
    )["conditioning"]
    inputs = {"model": model, "positive": positive}
    if negative_text is not None:
        inputs["negative"] = run("encode/text", ctx, {"text": negative_text}, {"encoder": encoder})[
            "conditioning"
        ]
    if image is None:
        inputs["latent"] = run("latent/empty", ctx, {"width": W, "height": H})["latent"]
    else:
        inputs["latent"] = run("vae/encode", ctx, {}, {"vae": vae, "image": image})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": denoise}
    latent = run("sample", ctx, params, inputs)["latent"]
    return latent, run("vae/decode", ctx, {}, {"vae": vae, "latent": latent})["image"]


@pytest.mark.parametrize(("guidance", "negative"), [(0.0, None), (2.0, None), (2.0, "blurry")])
def test_the_primitive_chain_matches_the_pipeline_latent_for_latent(
    smoke_stack, make_ctx, txt2img_pipeline, guidance, negative
):
    latent, image = primitive_chain(smoke_stack, make_ctx(), guidance=guidance, negative_text=negative)
    params = turbo_params(smoke_stack, guidance=guidance, negative_prompt=negative or "")
    ref_latent = reference(txt2img_pipeline, params, output_type="latent")
    assert torch.equal(latent.samples[0], ref_latent)  # the pipeline returns [16, h, w]
    assert png_bytes(image) == png_bytes(reference(txt2img_pipeline, params))


def test_the_turbo_node_with_an_image_matches_the_img2img_pipeline(smoke_stack, make_ctx, img2img_pipeline):
    init = noise_image(W, H)
    params = turbo_params(smoke_stack, guidance=1.5, negative_prompt="dark", strength=0.6)
    ours = run("zimage/turbo", make_ctx(), params, {"image": init})["image"]
    theirs = reference(img2img_pipeline, params, image=init, strength=0.6)
    assert png_bytes(ours) == png_bytes(theirs)


def test_an_image_of_another_size_is_resized_to_the_node_size(smoke_stack, make_ctx):
    params = turbo_params(smoke_stack)
    out = run("zimage/turbo", make_ctx(), params, {"image": noise_image(100, 70)})["image"]
    assert out.size == (W, H)


def test_partial_denoise_starts_from_the_input_latent_and_full_denoise_ignores_it(smoke_stack, make_ctx):
    one, two = noise_image(W, H, seed=1), noise_image(W, H, seed=2)
    partial = [primitive_chain(smoke_stack, make_ctx(), image=im, denoise=0.5)[1] for im in (one, two)]
    full = [primitive_chain(smoke_stack, make_ctx(), image=im, denoise=1.0)[1] for im in (one, two)]
    _, empty = primitive_chain(smoke_stack, make_ctx())
    assert png_bytes(partial[0]) != png_bytes(partial[1])
    assert png_bytes(full[0]) == png_bytes(full[1]) == png_bytes(empty)


def test_partial_denoise_runs_only_the_tail_of_the_schedule(smoke_stack, make_ctx):
    recorder = Recorder()
    primitive_chain(smoke_stack, make_ctx(recorder), image=noise_image(W, H), denoise=0.5)
    assert recorder.progress == [(1, 2), (2, 2)]  # half of STEPS=4


def test_the_same_seed_gives_the_same_bytes_and_another_seed_does_not(smoke_stack, make_ctx):
    first = run("zimage/turbo", make_ctx(), turbo_params(smoke_stack, seed=11))["image"]
    again = run("zimage/turbo", make_ctx(), turbo_params(smoke_stack, seed=11))["image"]
    other = run("zimage/turbo", make_ctx(), turbo_params(smoke_stack, seed=12))["image"]
    assert png_bytes(first) == png_bytes(again)
    assert png_bytes(first) != png_bytes(other)


def test_wired_seed_and_prompt_inputs_override_the_params(smoke_stack, make_ctx):
    wired = run(
        "zimage/turbo",
        make_ctx(),
        turbo_params(smoke_stack, seed=1, prompt="x"),
        {"seed": 5, "prompt": "a blue boat"},
    )["image"]
    direct = run("zimage/turbo", make_ctx(), turbo_params(smoke_stack, seed=5, prompt="a blue boat"))["image"]
    assert png_bytes(wired) == png_bytes(direct)


def test_the_lineage_names_the_seed_and_every_model_file_hash(smoke_stack, make_ctx):
    from workers.models.catalog import file_sha256, resolve

    ctx = make_ctx()
    run("zimage/turbo", ctx, {**turbo_params(smoke_stack), "seed": 3})
    names = smoke_stack.names
    folders = {"model": "diffusion_models", "vae": "vae", "text_encoder": "text_encoders"}
    expected = {
        f"{folder}/{names[key]}": file_sha256(resolve(smoke_stack.models_dir, folder, names[key]))
        for key, folder in folders.items()
    }
    assert ctx.lineage == {"seed": 3, "models": expected}


def test_progress_is_reported_after_every_step(smoke_stack, make_ctx):
    recorder = Recorder()
    run("zimage/turbo", make_ctx(recorder), turbo_params(smoke_stack, steps=5))
    assert recorder.progress == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]


def test_img2img_progress_counts_only_the_steps_it_runs(smoke_stack, make_ctx):
    recorder = Recorder()
    run(
        "zimage/turbo",
        make_ctx(recorder),
        turbo_params(smoke_stack, steps=10, strength=0.3),
        {"image": noise_image(W, H)},
    )
    assert recorder.progress[-1] == (3, 3)


def test_cancelling_mid_sampling_stops_within_one_step(smoke_stack, make_ctx):
    recorder = Recorder(cancel_after_step=2)
    with pytest.raises(RunCancelled):
        run("zimage/turbo", make_ctx(recorder), turbo_params(smoke_stack, steps=8))
    assert recorder.progress[-1] == (2, 8)


def test_a_denoise_that_leaves_no_step_fails_clearly(smoke_stack, make_ctx):
    with pytest.raises(NodeFailed, match="leaves no step"):
        run(
            "zimage/turbo",
            make_ctx(),
            turbo_params(smoke_stack, steps=4, strength=0.0),
            {"image": noise_image(W, H)},
        )


def test_wrong_or_missing_inputs_fail_clearly(smoke_stack, make_ctx):
    latent = run("latent/empty", make_ctx(), {"width": W, "height": H})["latent"]
    with pytest.raises(NodeFailed, match="'model' must be a DiffusionModel, got nothing"):
        run(
            "sample", make_ctx(), {"seed": 0, "steps": 2, "guidance": 0.0, "denoise": 1.0}, {"latent": latent}
        )
    with pytest.raises(NodeFailed, match="multiples of 16"):
        run("latent/empty", make_ctx(), {"width": 50, "height": 48})


def test_vae_encode_refuses_images_off_the_16_pixel_grid(smoke_stack, make_ctx):
    vae = run("load/vae", make_ctx(), {"file": smoke_stack.names["vae"]})["vae"]
    with pytest.raises(NodeFailed, match="multiples of 16"):
        run("vae/encode", make_ctx(), {}, {"vae": vae, "image": noise_image(50, 48)})
