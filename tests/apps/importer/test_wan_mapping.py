"""Wan workflows written the ComfyUI way (API format): Wan 2.2's two experts as two
KSamplerAdvanced, the `wan` CLIPLoader, EmptyHunyuanLatentVideo / WanImageToVideo /
WanFirstLastFrameToVideo, TI2V-5B's Wan22ImageToVideoLatent, and a VAEDecode of the video
latent (its frames) map onto the farm's nodes."""

from __future__ import annotations

from typing import Any

from apps.importer.services import comfy_import

HIGH, LOW, VAE, UMT5 = ("wan2.2_t2v_high_noise_14B.safetensors",
                        "wan2.2_t2v_low_noise_14B.safetensors", "wan_2.1_vae.safetensors",
                        "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
CATALOG = {"diffusion_models": [HIGH, LOW], "vae": [VAE], "text_encoders": [UMT5],
           "input": []}
FILES = {("diffusion_models", HIGH): ("wan",), ("diffusion_models", LOW): ("wan",),
         ("vae", VAE): ("qwenimage", "wan"), ("text_encoders", UMT5): ("wan",)}


def wan22(latent: dict[str, Any]) -> dict[str, Any]:
    """ComfyUI's Wan 2.2 14B template: high-noise steps 0–10 of 20 with leftover noise, then
    the low-noise expert from step 10 without new noise; one frame saved as a still."""
    def advanced(model: str, start: int, end: int, noise: str, leftover: str,
                 latent_from: list[Any]) -> dict[str, Any]:
        return {"class_type": "KSamplerAdvanced", "inputs": {
            "model": [model, 0], "positive": ["20", 0], "negative": ["20", 1],
            "latent_image": latent_from, "add_noise": noise, "noise_seed": 7,
            "control_after_generate": "fixed", "steps": 20, "cfg": 3.5,
            "sampler_name": "euler", "scheduler": "simple", "start_at_step": start,
            "end_at_step": end, "return_with_leftover_noise": leftover}}

    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": HIGH, "weight_dtype": "default"}},
        "2": {"class_type": "UNETLoader", "inputs": {"unet_name": LOW, "weight_dtype": "default"}},
        "3": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}},
        "4": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["2", 0], "shift": 8.0}},
        "5": {"class_type": "CLIPLoader", "inputs": {"clip_name": UMT5, "type": "wan",
                                                     "device": "default"}},
        "6": {"class_type": "VAELoader", "inputs": {"vae_name": VAE}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["5", 0]}},
        "8": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["5", 0]}},
        "20": latent,
        "30": advanced("3", 0, 10, "enable", "enable", ["20", 2]),
        "31": advanced("4", 10, 10000, "disable", "disable", ["30", 0]),
        "40": {"class_type": "VAEDecode", "inputs": {"samples": ["31", 0], "vae": ["6", 0]}},
        "41": {"class_type": "ImageFromBatch", "inputs": {"image": ["40", 0], "batch_index": 32,
                                                          "length": 1}},
        "42": {"class_type": "SaveImage", "inputs": {"images": ["41", 0],
                                                     "filename_prefix": "wan"}},
    }


I2V: dict[str, Any] = {"class_type": "WanImageToVideo", "inputs": {
    "positive": ["7", 0], "negative": ["8", 0], "vae": ["6", 0], "start_image": ["21", 0],
    "width": 832, "height": 480, "length": 81, "batch_size": 1}}
LOAD = {"class_type": "LoadImage", "inputs": {"image": "start.png", "upload": "image"}}


def imported(doc: dict[str, Any]) -> Any:
    return comfy_import(workflow=doc, catalog=CATALOG, files=FILES)


def test_wan22_image_to_video_with_two_experts_maps_onto_the_farm_s_nodes():
    result = imported({**wan22(I2V), "21": LOAD})
    graph = result.graph.model_dump()["nodes"]
    assert graph["20"]["type"] == "wan/image-to-video"
    assert graph["20"]["params"] == {"width": 832, "height": 480, "length": 81, "batch": 1}
    assert set(graph["20"]["inputs"]) == {"positive", "negative", "vae", "start_image"}
    high, low = graph["30"], graph["31"]
    assert (high["type"], low["type"]) == ("sample/advanced", "sample/advanced")
    window = ("start_step", "end_step", "add_noise", "return_with_leftover_noise")
    assert [high["params"][k] for k in window] == [0, 10, True, True]
    assert [low["params"][k] for k in window] == [10, 10000, False, False]
    assert high["params"]["shift"] == low["params"]["shift"] == 8.0
    assert high["params"]["guidance"] == 3.5  # Wan's cfg is the pipeline's guidance_scale
    assert high["inputs"]["positive"] == {"node": "20", "port": "positive"}
    assert low["inputs"]["latent"] == {"node": "30", "port": "latent"}
    assert graph["5"]["params"]["family"] == "wan"
    assert graph["40"]["type"] == "vae/decode-video"
    assert graph["41"] == {"type": "frames/image", "params": {"index": 32},
                           "inputs": {"frames": {"node": "40", "port": "frames"}}}


def test_first_last_frame_and_the_empty_video_latent_map_too():
    first_last = {"class_type": "WanFirstLastFrameToVideo", "inputs": {
        **I2V["inputs"], "end_image": ["22", 0]}}
    graph = imported({**wan22(first_last), "21": LOAD, "22": LOAD}).graph.model_dump()["nodes"]
    assert graph["20"]["type"] == "wan/image-to-video"
    assert graph["20"]["inputs"]["end_image"] == {"node": "22", "port": "image"}
    doc = wan22({"class_type": "EmptyHunyuanLatentVideo", "inputs": {
        "width": 640, "height": 352, "length": 33, "batch_size": 1}})
    for sampler in ("30", "31"):
        doc[sampler]["inputs"].update(positive=["7", 0], negative=["8", 0])
    doc["30"]["inputs"]["latent_image"] = ["20", 0]
    graph = imported(doc).graph.model_dump()["nodes"]
    assert graph["20"] == {"type": "latent/empty-video", "params": {
        "width": 640, "height": 352, "length": 33, "batch": 1}, "inputs": {}}
    assert graph["40"]["type"] == "vae/decode-video"


def test_wan22_ti2v_5b_latent_maps_to_wan_ti2v_latent_with_or_without_a_start_image():
    for start in (False, True):
        inputs: dict[str, Any] = {"vae": ["6", 0], "width": 1280, "height": 704,
                                  "length": 121, "batch_size": 1}
        doc = wan22({"class_type": "Wan22ImageToVideoLatent", "inputs": {
            **inputs, **({"start_image": ["21", 0]} if start else {})}})
        for sampler in ("30", "31"):
            doc[sampler]["inputs"].update(positive=["7", 0], negative=["8", 0])
        doc["30"]["inputs"]["latent_image"] = ["20", 0]
        graph = imported({**doc, "21": LOAD}).graph.model_dump()["nodes"]
        assert graph["20"]["type"] == "wan/ti2v-latent"
        assert graph["20"]["params"] == {"width": 1280, "height": 704, "length": 121, "batch": 1}
        assert set(graph["20"]["inputs"]) == ({"vae", "start_image"} if start else {"vae"})
        assert graph["40"]["type"] == "vae/decode-video"  # the 5B's clip decodes to frames
