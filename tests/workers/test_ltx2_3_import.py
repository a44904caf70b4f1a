"""ComfyUI's shipped LTX-2.3 templates (subgraphs of two stages — a half-size clip over the
distilled ManualSigmas with the distilled LoRA, its latents upsampled ×2 and refined from
σ 0.85) imported from the UI format with the tiny stack's files (ComfyUI's single checkpoint
file, the latent upsampler, the LoRAs) and rendered through the real executor into an MP4 with
sound: image-to-video (video_ltx2_3_i2v, its first frame at strength 0.7; its prompt enhancer
off as shipped, and on: the enhancer's image left out with a warning) and text-to-video
(video_ltx2_3_t2v, its prompt enhancer on as shipped). With the enhancer on, the tiny Gemma 3
with the templates' Gemma LoRA writes the prompt (a few tokens) that the clip is rendered from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.importer.services import comfy_import
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import assert_mp4_with_sound, asset_of, render

SIDE, SECONDS, FPS = 64, 1, 8  # the final clip: 64² px, 1 s × 8 fps + 1 = 9 frames


def tiny_files(models_dir: Path) -> dict[str, str]:
    """The tiny stack as the templates name their files: ComfyUI's single checkpoint (its
    Gemma 3 in <stem>.diffusers/), the latent upsampler, the distilled LoRA."""
    from workers.models.ltx2.tiny import (
        write_tiny_lora,
        write_tiny_single_file,
        write_tiny_upsampler,
    )

    return {"checkpoints": write_tiny_single_file(models_dir, name="smoke-ltx2")["checkpoint"],
            "latent_upscale_models": write_tiny_upsampler(models_dir)["latent_upscaler"],
            "loras": write_tiny_lora(models_dir)}


def shipped_clip(name: str) -> tuple[dict[str, Any], list[Any]]:
    """The shipped template `name` and its subgraph node's widget values (in the subgraph's
    input order), to be edited in place."""
    from apps.importer.comfy_templates import shipped_file

    workflow: dict[str, Any] = json.loads(shipped_file(name) or b"{}")
    ids = {s["id"] for s in workflow["definitions"]["subgraphs"]}
    clip = next(n for n in workflow["nodes"] if n["type"] in ids)
    return workflow, clip["widgets_values"]


def tiny_values(values: list[Any], files: dict[str, str], gemma_lora: str | None = None
                ) -> None:
    """The subgraph's widget values (after the i2v's first_frame: prompt, prompt_enhance, width,
    height, duration, fps, seed, checkpoint, LoRA, text encoder, upsampler, Gemma LoRA) set to
    the final clip's size and the tiny files."""
    values[2:6] = [SIDE, SIDE, SECONDS, FPS]
    values[7], values[8], values[10] = (files["checkpoints"], files["loras"],
                                        files["latent_upscale_models"])
    if gemma_lora is not None:
        values[11] = gemma_lora


def short_enhancer(workflow: dict[str, Any], tokens: int = 6) -> None:
    """TextGenerateLTX2Prompt's max_length set to a few tokens of the tiny Gemma."""
    [enhancer] = [n for s in workflow["definitions"]["subgraphs"] for n in s["nodes"]
                  if n["type"] == "TextGenerateLTX2Prompt"]
    enhancer["widgets_values"][1] = tokens


def assert_enhanced(outcome: Any, preview: str, raw: str) -> None:
    """The enhancer's PreviewAny `preview` showed a generated prompt, not the raw one."""
    [shown] = outcome.values
    assert shown["nodeId"] == preview and shown["text"] and shown["text"] != raw


def import_tiny(workflow: dict[str, Any], held: list[tuple[str, str]],
                assets: dict[str, str] | None = None) -> Any:
    """The template imported with the tiny files `held` ((folder, name) pairs) in the catalog,
    each known as LTX-2's."""
    catalog: dict[str, list[str]] = {}
    for folder, name in held:
        catalog.setdefault(folder, []).append(name)
    families = {file: ("ltx2",) for file in held}
    result = comfy_import(workflow=workflow, catalog=catalog, files=families,
                          resolve_asset=(assets or {}).get)
    assert result.report.format == "ui"
    return result


def assert_two_stages(nodes: dict[str, Any], stages: tuple[str, str], upsample: str,
                      second_latent: str) -> None:
    """Both samplers are ltx2/sample over the template's distilled sigmas; the second refines
    the upsampled clip (through `second_latent`, the node that feeds it)."""
    samplers = [nodes[n] for n in stages]
    assert [s["type"] for s in samplers] == ["ltx2/sample"] * 2
    assert [nodes[s["inputs"]["sigmas"]["node"]]["params"]["sigmas"] for s in samplers] == [
        "1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0",
        "0.85, 0.7250, 0.4219, 0.0"]
    assert nodes[upsample]["type"] == "ltx2/upsample-latent"
    assert samplers[1]["inputs"]["latent"] == {"node": second_latent, "port": "latent"}


def assert_clip_with_sound(run: Any) -> None:
    """The run's one take: a SIDE² MP4 of SECONDS × FPS + 1 frames at FPS, with a sound track."""
    assert_mp4_with_sound(run, side=SIDE, fps=FPS, frames=SECONDS * FPS + 1)


@pytest.mark.django_db
@pytest.mark.parametrize("enhance", [False, True], ids=["enhancer-off", "enhancer-on"])
def test_comfyuis_shipped_ltx2_3_i2v_template_imports_and_renders(settings, tmp_path, enhance):
    """As shipped (its enhancer off: the switch routes around TextGenerateLTX2Prompt), and with
    it on: the enhancer's image is left out with a warning (the farm's LTX-2 Gemma reads no
    images) and Gemma writes the prompt from its text; the clip still starts from the image."""
    from workers.models.ltx2.tiny import write_tiny_gemma_lora

    files = tiny_files(tmp_path / "models")
    gemma_lora = write_tiny_gemma_lora(tmp_path / "models")
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", tmp_path / "models"
    workflow, values = shipped_clip("video_ltx2_3_i2v.json")  # (after first_frame)
    assert values[1] is False  # prompt_enhance off as shipped
    values[1] = enhance
    tiny_values(values, files, gemma_lora)
    short_enhancer(workflow)
    assets = {"egyptian_queen.png": asset_of(noise_image(96, 64, seed=3))}
    result = import_tiny(workflow, [*files.items(), ("loras", gemma_lora)], assets)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert_two_stages(nodes, ("320:283", "320:308"), "320:287", "320:288")
    assert [nodes[n]["params"]["strength"] for n in ("320:296", "320:288")] == [0.7, 1.0]
    assert nodes["320:288"]["inputs"]["latent"] == {"node": "320:287", "port": "latent"}
    assert ("320:325" in nodes) is enhance
    if enhance:
        assert "image" not in nodes["320:325"]["inputs"]
        assert nodes["320:303"]["inputs"]["text"] == {"node": "320:325", "port": "text"}
        [warned] = [w["message"] for w in result.report.warnings if w["id"] == "320:325"
                    and "image" in w["message"]]
        assert "is not passed to Gemma 3" in warned
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    if enhance:
        assert_enhanced(outcome, "320:326", nodes["320:319"]["params"]["value"])
    assert_clip_with_sound(run)


@pytest.mark.django_db
def test_comfyuis_shipped_ltx2_3_t2v_template_renders_with_its_prompt_enhancer(settings,
                                                                                tmp_path):
    from workers.models.ltx2.tiny import write_tiny_gemma_lora

    files = tiny_files(tmp_path / "models")
    gemma_lora = write_tiny_gemma_lora(tmp_path / "models")
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", tmp_path / "models"
    workflow, values = shipped_clip("video_ltx2_3_t2v.json")
    assert values[1] is True  # prompt_enhance on: TextGenerateLTX2Prompt writes the prompt
    tiny_values(values, files, gemma_lora)
    short_enhancer(workflow)
    result = import_tiny(workflow, [*files.items(), ("loras", gemma_lora)])
    assert result.report.unmapped == []  # its bypassed image's nodes fold with it
    assert [w["type"] for w in result.report.warnings] == [
        "LTXAVTextEncoderLoader", "TextGenerateLTX2Prompt"]  # its Gemma file, ComfyUI's system turn
    nodes = result.graph.model_dump()["nodes"]
    assert_two_stages(nodes, ("267:215", "267:219"), "267:253", "267:253")
    enhance, encode, gemma = nodes["267:327"], nodes["267:240"], nodes["267:326"]
    assert (enhance["type"], enhance["params"]["template"]) == ("text/generate", "ltx2")
    assert encode["inputs"]["text"] == {"node": "267:327", "port": "text"}
    assert enhance["inputs"]["encoder"] == {"node": "267:326", "port": "encoder"}
    assert (gemma["type"], gemma["params"]["lora"], gemma["params"]["strength_clip"]) == (
        "load/lora", gemma_lora, 1.0)
    assert gemma["inputs"]["encoder"] == {"node": "267:243", "port": "encoder"}
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert_enhanced(outcome, "267:328", nodes["267:266"]["params"]["value"])
    assert_clip_with_sound(run)
    assert list(run.takes.get().lineage["textEncoderLoras"]) == [f"loras/{gemma_lora}"]


@pytest.mark.django_db
def test_comfyuis_shipped_ltx2_3_ia2v_template_renders_a_clip_to_a_given_sound(settings,
                                                                              tmp_path):
    """Image + sound to video (video_ltx2_3_ia2v, lip sync): LoadAudio → TrimAudioDuration →
    LTXVAudioVAEEncode → SetLatentNoiseMask(SolidMask 0) → LTXVConcatAVLatent is
    ltx2/encode-audio keeping the sound; the clip lasts the trimmed sound (duration × fps + 1
    frames) and both stages keep it, so the take's sound is the uploaded one's second."""
    from tests.workers.vocab_helpers import sound_asset_of
    from workers.models.ltx2.tiny import write_tiny_gemma_lora

    files = tiny_files(tmp_path / "models")
    gemma_lora = write_tiny_gemma_lora(tmp_path / "models")
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", tmp_path / "models"
    workflow, values = shipped_clip("video_ltx2_3_ia2v.json")  # (after first_frame and audio)
    assert values[1] is True and values[4:7] == [0, 9, 24]  # enhancer on; audio 0 s + 9 s at 24 fps
    values[2:7] = [SIDE, SIDE, 0, SECONDS, FPS]
    values[8], values[9], values[11], values[12] = (
        files["checkpoints"], files["loras"], files["latent_upscale_models"], gemma_lora)
    short_enhancer(workflow)
    assets = {"cactus_man.png": asset_of(noise_image(96, 64, seed=3)),
              "ltx_23_audio.mp3": sound_asset_of("mp3", seconds=1.5)}
    result = import_tiny(workflow, [*files.items(), ("loras", gemma_lora)], assets)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert_two_stages(nodes, ("340:291", "340:310"), "340:295", "340:296")
    given = nodes["340:326"]
    assert (given["type"], given["params"]) == ("ltx2/encode-audio", {"keep": True})
    assert given["inputs"]["audio"] == {"node": "340:332", "port": "audio"}
    assert given["inputs"]["latent"] == {"node": "340:325", "port": "latent"}
    assert nodes["340:332"]["type"] == "audio/trim"
    assert nodes["340:332"]["inputs"]["audio"] == {"node": "276", "port": "audio"}
    assert (nodes["276"]["type"], nodes["276"]["params"]["asset"]) == (
        "audio/load", assets["ltx_23_audio.mp3"])
    assert nodes["340:291"]["inputs"]["latent"] == {"node": "340:326", "port": "latent"}
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert_clip_with_sound(run)
    assert run.takes.get().audio_seconds == pytest.approx(SECONDS, abs=0.05)
