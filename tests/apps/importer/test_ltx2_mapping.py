"""ComfyUI's LTX-2 text-to-video template (UI format, as its editor saves it) imported onto the
ltx2/* nodes — a graph rewrite: the AV latent's concat / separate fold away, the custom sampler
and its noise / guider / scheduler become ltx2/sample, VAEDecode + LTXVAudioVAEDecode +
CreateVideo become ltx2/decode — and rendered by the real executor on the tiny stack
(checkpoints/smoke-ltx2/) into an MP4 with sound. Plus image-to-video, the clear messages for a
checkpoint the farm does not hold, first and last frame guides (LTXVAddGuide), and LTX-Video
0.9 still refused."""

from __future__ import annotations

import io
from typing import Any

import pytest

from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import
from tests.apps.importer.builder import Ui

CKPT, GEMMA = "smoke-ltx2.safetensors", "gemma_3_12B_it_fp4_mixed.safetensors"
UPSCALER = "smoke-ltx2-upscaler.safetensors"  # tiny.SMOKE_UPSAMPLER
CATALOG = {"checkpoints": ["smoke-ltx2"], "text_encoders": [GEMMA], "input": [],
           "latent_upscale_models": [UPSCALER]}
FILES = {("checkpoints", "smoke-ltx2"): ("ltx2",), ("checkpoints", CKPT): ("ltx2",),
         ("latent_upscale_models", UPSCALER): ("ltx2",)}
W = H = 32
FRAMES, FPS, STEPS = 9, 25, 2


def t2v(*, image: bool = False, sigmas: str | None = None, upsample: bool = False,
        guides: bool = False, mask: bool = False) -> dict[str, Any]:
    """ComfyUI's LTX-2 template's wiring (comfy_extras/nodes_lt*.py widget orders)."""
    ui = Ui()
    ui.add(1, "CheckpointLoaderSimple", [CKPT], outputs=("MODEL", "CLIP", "VAE"))
    ui.add(2, "LTXAVTextEncoderLoader", [GEMMA, CKPT, "default"], outputs=("CLIP",))
    ui.add(3, "LTXVAudioVAELoader", [CKPT], outputs=("VAE",))
    ui.add(4, "CLIPTextEncode", ["a robot dancing"], inputs=[("clip", "CLIP")],
           outputs=("CONDITIONING",))
    ui.add(5, "CLIPTextEncode", ["blurry"], inputs=[("clip", "CLIP")], outputs=("CONDITIONING",))
    ui.add(6, "LTXVConditioning", [FPS], inputs=[("positive", "CONDITIONING"),
                                                 ("negative", "CONDITIONING")],
           outputs=("CONDITIONING", "CONDITIONING"))
    ui.add(7, "EmptyLTXVLatentVideo", [W, H, FRAMES, 1], outputs=("LATENT",))
    ui.add(8, "LTXVEmptyLatentAudio", [FRAMES, FPS, 1], inputs=[("audio_vae", "VAE")],
           outputs=("LATENT",))
    ui.add(9, "LTXVConcatAVLatent", [], inputs=[("video_latent", "LATENT"),
                                                ("audio_latent", "LATENT")], outputs=("LATENT",))
    ui.add(10, "ModelSamplingLTXV", [2.05, 0.95], inputs=[("model", "MODEL"),
                                                          ("latent", "LATENT")],
           outputs=("MODEL",))
    if sigmas is None:
        ui.add(11, "LTXVScheduler", [STEPS, 2.05, 0.95, True, 0.1],
               inputs=[("latent", "LATENT")], outputs=("SIGMAS",))
    else:  # the LTX-2.3 templates' hand-written schedule
        ui.add(11, "ManualSigmas", [sigmas], outputs=("SIGMAS",))
    ui.add(12, "CFGGuider", [3.0], inputs=[("model", "MODEL"), ("positive", "CONDITIONING"),
                                           ("negative", "CONDITIONING")], outputs=("GUIDER",))
    ui.add(13, "KSamplerSelect", ["euler"], outputs=("SAMPLER",))
    ui.add(14, "RandomNoise", [7, "fixed"], outputs=("NOISE",))
    ui.add(15, "SamplerCustomAdvanced", [], inputs=[
        ("noise", "NOISE"), ("guider", "GUIDER"), ("sampler", "SAMPLER"), ("sigmas", "SIGMAS"),
        ("latent_image", "LATENT")], outputs=("LATENT", "LATENT"))
    ui.add(16, "LTXVSeparateAVLatent", [], inputs=[("av_latent", "LATENT")],
           outputs=("LATENT", "LATENT"))
    ui.add(17, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")],
           outputs=("IMAGE",))
    ui.add(18, "LTXVAudioVAEDecode", [], inputs=[("samples", "LATENT"), ("audio_vae", "VAE")],
           outputs=("AUDIO",))
    ui.add(19, "CreateVideo", [FPS], inputs=[("images", "IMAGE"), ("audio", "AUDIO")],
           outputs=("VIDEO",))
    ui.add(20, "SaveVideo", ["ltx2", "auto", "auto"], inputs=[("video", "VIDEO")])
    wires = [(1, 0, 10, "model"), (2, 0, 4, "clip"), (2, 0, 5, "clip"), (4, 0, 6, "positive"),
             (5, 0, 6, "negative"), (3, 0, 8, "audio_vae"), (7, 0, 9, "video_latent"),
             (8, 0, 9, "audio_latent"), (9, 0, 10, "latent"), (9, 0, 11, "latent"),
             (10, 0, 12, "model"), (6, 0, 12, "positive"), (6, 1, 12, "negative"),
             (14, 0, 15, "noise"), (12, 0, 15, "guider"), (13, 0, 15, "sampler"),
             (11, 0, 15, "sigmas"), (9, 0, 15, "latent_image"), (15, 0, 16, "av_latent"),
             (16, 0, 17, "samples"), (1, 2, 17, "vae"), (16, 1, 18, "samples"),
             (3, 0, 18, "audio_vae"), (17, 0, 19, "images"), (18, 0, 19, "audio"),
             (19, 0, 20, "video")]
    if sigmas is not None:
        wires.remove((9, 0, 11, "latent"))
    if upsample:  # the 2.3 templates' second stage's input, decoded as it is
        ui.add(24, "LatentUpscaleModelLoader", [UPSCALER], outputs=("LATENT_UPSCALE_MODEL",))
        ui.add(25, "LTXVLatentUpsampler", [], inputs=[
            ("samples", "LATENT"), ("upscale_model", "LATENT_UPSCALE_MODEL"), ("vae", "VAE")],
            outputs=("LATENT",))
        wires = [w for w in wires if w[2:] != (17, "samples")] + [
            (16, 0, 25, "samples"), (24, 0, 25, "upscale_model"), (1, 2, 25, "vae"),
            (25, 0, 17, "samples")]
    if image:
        ui.add(21, "LoadImage", ["start.png", "image"], outputs=("IMAGE", "MASK"))
        ui.add(22, "LTXVPreprocess", [33], inputs=[("image", "IMAGE")], outputs=("IMAGE",))
        ui.add(23, "LTXVImgToVideoInplace", [1.0, False], inputs=[
            ("vae", "VAE"), ("image", "IMAGE"), ("latent", "LATENT")], outputs=("LATENT",))
        wires = [w for w in wires if w[2:] != (9, "video_latent")] + [
            (21, 0, 22, "image"), (22, 0, 23, "image"), (1, 2, 23, "vae"), (7, 0, 23, "latent"),
            (23, 0, 9, "video_latent")]
    if guides:  # first and last frame to video (the flf2v templates' wiring)
        wires = _guides(ui, wires, mask)
    for origin, slot, target, name in wires:
        ui.link(origin, slot, target, name)
    return {"nodes": ui.nodes, "links": ui.links, "version": 0.4}


GUIDE_PORTS = [("positive", "CONDITIONING"), ("negative", "CONDITIONING"), ("vae", "VAE"),
               ("latent", "LATENT"), ("image", "IMAGE")]
PROMPTS_AND_LATENT = ("CONDITIONING", "CONDITIONING", "LATENT")


def _guides(ui: Ui, wires: list[tuple[int, int, int, str]], mask: bool
            ) -> list[tuple[int, int, int, str]]:
    """LTXVAddGuide at frame 0 (its image through LTXVPreprocess, strength 0.7) then at -1
    (strength 1.5; with `mask`, an attention mask), the guider reading the last one's
    prompts, LTXVCropGuides between the separate and the frames' decode."""
    ui.add(26, "LoadImage", ["first.png", "image"], outputs=("IMAGE", "MASK"))
    ui.add(27, "LTXVPreprocess", [18], inputs=[("image", "IMAGE")], outputs=("IMAGE",))
    ui.add(28, "LTXVAddGuide", [0, 0.7], inputs=GUIDE_PORTS, outputs=PROMPTS_AND_LATENT)
    ui.add(29, "LoadImage", ["last.png", "image"], outputs=("IMAGE", "MASK"))
    ui.add(30, "LTXVAddGuide", [-1, 1.5], outputs=PROMPTS_AND_LATENT,
           inputs=GUIDE_PORTS + ([("attention_mask", "MASK")] if mask else []))
    ui.add(31, "LTXVCropGuides", [], inputs=[("positive", "CONDITIONING"),
                                             ("negative", "CONDITIONING"), ("latent", "LATENT")],
           outputs=PROMPTS_AND_LATENT)
    gone = {(9, "video_latent"), (12, "positive"), (12, "negative"), (17, "samples")}
    return [w for w in wires if w[2:] not in gone] + [
        (26, 0, 27, "image"), (6, 0, 28, "positive"), (6, 1, 28, "negative"), (1, 2, 28, "vae"),
        (7, 0, 28, "latent"), (27, 0, 28, "image"), (28, 0, 30, "positive"),
        (28, 1, 30, "negative"), (1, 2, 30, "vae"), (28, 2, 30, "latent"), (29, 0, 30, "image"),
        (30, 2, 9, "video_latent"), (30, 0, 12, "positive"), (30, 1, 12, "negative"),
        (30, 0, 31, "positive"), (30, 1, 31, "negative"), (16, 0, 31, "latent"),
        (31, 2, 17, "samples"), *([(29, 1, 30, "attention_mask")] if mask else [])]


def imported(doc: dict[str, Any], catalog: dict[str, list[str]] = CATALOG, **kw: Any) -> Any:
    return comfy_import(workflow=doc, catalog=catalog, files=FILES, **kw)


def test_the_t2v_template_becomes_the_ltx2_nodes():
    result = imported(t2v())
    graph = result.graph.model_dump()["nodes"]
    assert result.report.format == "ui" and result.target == "20"
    assert result.report.unmapped == [], result.report.unmapped
    assert {nid: n["type"] for nid, n in graph.items()} == {
        "1": "load/checkpoint", "2": "load/checkpoint", "4": "encode/text",
        "5": "encode/text", "7": "ltx2/empty-latent", "15": "ltx2/sample",
        "19": "ltx2/decode", "20": "video/save"}
    assert graph["1"]["params"]["file"] == graph["2"]["params"]["file"] == "smoke-ltx2"
    assert graph["7"]["params"] == {"width": W, "height": H, "length": FRAMES, "fps": 25.0}
    sample = graph["15"]
    assert sample["params"] == {"seed": 7, "steps": STEPS, "cfg": 3.0, "audio_cfg": 3.0,
                                "stg": 0.0, "audio_stg": 0.0, "modality": 1.0,
                                "audio_modality": 1.0, "rescale": 0.0, "audio_rescale": 0.0,
                                "stg_blocks": "28"}
    assert sample["inputs"] == {"model": {"node": "1", "port": "model"},
                                "positive": {"node": "4", "port": "conditioning"},
                                "negative": {"node": "5", "port": "conditioning"},
                                "latent": {"node": "7", "port": "latent"}}
    assert graph["19"]["inputs"] == {"vae": {"node": "1", "port": "vae"},
                                     "latent": {"node": "15", "port": "latent"}}
    dropped = {d["id"]: d["reason"] for d in result.report.dropped}
    assert set(dropped) >= {"6", "8", "9", "10", "11", "12", "13", "14", "16", "17", "18"}
    assert "ltx2/sample 15's seed" in dropped["14"] and "ltx2/decode 19" in dropped["18"]
    warned = [w["message"] for w in result.report.warnings]
    assert any("text_encoder 'gemma_3_12B" in m for m in warned), warned
    assert [m["name"] for m in result.report.models if m["held"]] == ["smoke-ltx2"] * 2
    assert "audio VAE and vocoder" in dropped["3"]


def test_manual_sigmas_are_wired_into_ltx2_sample_as_they_are():
    result = imported(t2v(sigmas="1.0, 0.725, 0.421875, 0.0"))
    graph = result.graph.model_dump()["nodes"]
    assert result.report.unmapped == [], result.report.unmapped
    assert graph["11"]["type"] == "sampling/manual-sigmas"
    assert graph["11"]["params"] == {"sigmas": "1.0, 0.725, 0.421875, 0.0"}
    assert graph["15"]["inputs"]["sigmas"] == {"node": "11", "port": "sigmas"}
    assert "11" not in {d["id"] for d in result.report.dropped}


def test_the_latent_upsampler_and_its_model_map_between_the_sampler_and_the_decode():
    result = imported(t2v(upsample=True))
    graph = result.graph.model_dump()["nodes"]
    assert result.report.unmapped == [], result.report.unmapped
    assert (graph["24"]["type"], graph["24"]["params"]) == ("load/latent-upscale-model",
                                                            {"file": UPSCALER})
    assert graph["25"]["type"] == "ltx2/upsample-latent"
    assert graph["25"]["inputs"] == {"latent": {"node": "15", "port": "latent"},
                                     "latent_upscale_model": {"node": "24",
                                                              "port": "latent_upscale_model"},
                                     "vae": {"node": "1", "port": "vae"}}
    assert graph["19"]["inputs"]["latent"] == {"node": "25", "port": "latent"}


def test_the_dual_cfg_guider_gives_video_and_sound_their_own_cfg():
    """LTX-2.5's templates guide with LTXVDualCFGGuider (video_cfg, audio_cfg): plain CFG with a
    scale per modality, ltx2/sample's cfg and audio_cfg."""
    doc = t2v()
    [guider] = [n for n in doc["nodes"] if n["type"] == "CFGGuider"]
    guider["type"], guider["widgets_values"] = "LTXVDualCFGGuider", [3.0, 7.0]
    result = imported(doc)
    sample = result.graph.model_dump()["nodes"]["15"]
    assert {k: sample["params"][k] for k in ("cfg", "audio_cfg", "stg", "modality")} == {
        "cfg": 3.0, "audio_cfg": 7.0, "stg": 0.0, "modality": 1.0}
    assert sample["inputs"]["negative"] == {"node": "5", "port": "conditioning"}
    assert "its model, prompts and cfg are ltx2/sample 15's" in {
        d["id"]: d["reason"] for d in result.report.dropped}["12"]


def test_a_text_to_video_template_s_bypassed_image_folds_away():
    """LTX-2.3's text-to-video template is its image-to-video graph with LTXVImgToVideoInplace's
    bypass wired to a PrimitiveBoolean (True): the image nodes fold away."""
    prompt = _api(t2v(image=True))
    prompt["23"]["inputs"]["bypass"] = ["30", 0]
    prompt["30"] = {"class_type": "PrimitiveBoolean", "inputs": {"value": True}}
    result = imported(prompt)
    graph = result.graph.model_dump()["nodes"]
    assert "23" not in graph and "21" not in graph
    assert graph["15"]["inputs"]["latent"] == {"node": "7", "port": "latent"}
    dropped = {d["id"]: d["reason"] for d in result.report.dropped}
    assert "bypass" in dropped["23"]
    # what makes only its image (the shipped template's EmptyImage → LTXVPreprocess) folds
    # with it, rather than being listed as unmapped
    assert result.report.unmapped == []
    assert dropped["21"] == dropped["22"] == (
        "it makes only the image of a bypassed LTXVImgToVideoInplace, which is not used")


def test_an_image_a_bypassed_clip_shares_with_another_reader_stays():
    """The bypassed image's source also feeds a saved image: it is kept for that output."""
    prompt = _api(t2v(image=True))
    prompt["23"]["inputs"]["bypass"] = True
    prompt["31"] = {"class_type": "SaveImage", "inputs": {"images": ["21", 0],
                                                          "filename_prefix": "frame"}}
    result = imported(prompt)
    dropped = {d["id"]: d["reason"] for d in result.report.dropped}
    assert dropped["22"] == (
        "it makes only the image of a bypassed LTXVImgToVideoInplace, which is not used")
    assert "21" not in dropped and "21" in result.graph.model_dump()["nodes"]


def test_an_encoded_sound_track_is_refused_not_dropped():
    """LTX-2.3's audio-to-video template concatenates an encoded sound track
    (LTXVAudioVAEEncode): refused, naming it, rather than sampled from noise."""
    prompt = _api(t2v())
    prompt["30"] = {"class_type": "LTXVAudioVAEEncode", "inputs": {
        "audio": ["31", 0], "audio_vae": ["3", 0]}}
    prompt["31"] = {"class_type": "LoadAudio", "inputs": {"audio": "talk.wav"}}
    prompt["9"]["inputs"]["audio_latent"] = ["30", 0]
    with pytest.raises(ImportInvalid) as err:
        imported(prompt)
    assert err.value.node_id == "15"
    assert "its audio latent comes from LTXVAudioVAEEncode" in err.value.message
    assert "audio-to-video" in err.value.message


def test_image_to_video_takes_ltxv_preprocess_s_compression_as_its_crf():
    result = imported(t2v(image=True), resolve_asset=lambda name: "asset-1")
    graph = result.graph.model_dump()["nodes"]
    assert graph["23"]["type"] == "ltx2/image-to-video"
    assert graph["23"]["params"] == {"crf": 33, "strength": 1.0}
    assert graph["23"]["inputs"]["image"] == {"node": "21", "port": "image"}
    assert graph["15"]["inputs"]["latent"] == {"node": "23", "port": "latent"}
    assert "22" in {d["id"] for d in result.report.dropped}


def test_first_and_last_frame_guides_map_onto_ltx2_add_guide():
    """LTXVAddGuide → ltx2/add-guide (its LTXVPreprocess's img_compression as its crf, 0
    without one; a strength above 1 held at 1, with a warning); the sampler reads the last
    guide's latent and prompts; LTXVCropGuides folds: the decode reads the sampled clip."""
    result = imported(t2v(guides=True), resolve_asset=lambda name: "asset-1")
    graph = result.graph.model_dump()["nodes"]
    assert graph["28"]["type"] == graph["30"]["type"] == "ltx2/add-guide"
    assert graph["28"]["params"] == {"frame_idx": 0, "strength": 0.7, "crf": 18}
    assert graph["28"]["inputs"]["image"] == {"node": "26", "port": "image"}
    assert graph["30"]["params"] == {"frame_idx": -1, "strength": 1.0, "crf": 0}
    assert graph["30"]["inputs"]["latent"] == {"node": "28", "port": "latent"}
    assert graph["15"]["inputs"]["latent"] == {"node": "30", "port": "latent"}
    assert graph["15"]["inputs"]["positive"] == {"node": "30", "port": "positive"}
    assert graph["15"]["inputs"]["negative"] == {"node": "30", "port": "negative"}
    decode = next(n for n in graph.values() if n["type"] == "ltx2/decode")
    assert decode["inputs"]["latent"] == {"node": "15", "port": "latent"}
    dropped = {d["id"]: d["reason"] for d in result.report.dropped}
    assert "crf" in dropped["27"] and "without its guides' frames" in dropped["31"]
    assert any(w["id"] == "30" and "strength 1.5 is held as 1" in w["message"]
               for w in result.report.warnings)


def test_a_guide_with_an_attention_mask_is_refused_naming_it():
    with pytest.raises(ImportInvalid) as refused:
        imported(t2v(guides=True, mask=True), resolve_asset=lambda name: "asset-1")
    assert "LTXVAddGuide" in refused.value.message
    assert "attention_mask is not built on this farm yet" in refused.value.message


def test_a_checkpoint_no_worker_holds_names_where_the_file_or_the_folder_goes():
    result = imported(t2v(), catalog={"checkpoints": [], "input": []})
    messages = [w["message"] for w in result.report.warnings if w["id"] == "1"]
    assert any("put ComfyUI's file at checkpoints/smoke-ltx2.safetensors" in m
               and "in checkpoints/smoke-ltx2.diffusers/" in m and "LTX2Pipeline folder" in m
               and "put it at checkpoints/smoke-ltx2/" in m for m in messages), messages


FILE_CATALOG = {"checkpoints": ["smoke-ltx2", CKPT], "text_encoders": [GEMMA], "input": []}


def test_a_held_single_file_is_picked_over_the_folder_of_its_stem():
    result = imported(t2v(), catalog=FILE_CATALOG)
    graph = result.graph.model_dump()["nodes"]
    assert graph["1"]["params"]["file"] == graph["2"]["params"]["file"] == CKPT
    assert not [w for w in result.report.warnings if "no live worker" in w["message"]]


def test_ltx_video_0_9_without_the_audio_latent_is_still_unsupported():
    doc = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "ltxv-2b.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["1", 1]}},
        "3": {"class_type": "EmptyLTXVLatentVideo", "inputs": {
            "width": 768, "height": 512, "length": 97, "batch_size": 1}},
        "4": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["2", 0], "negative": ["2", 0], "latent_image": ["3", 0],
            "seed": 1, "steps": 20, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0}},
        "5": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["1", 2]}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "x"}},
    }
    with pytest.raises(ImportInvalid) as err:
        imported(doc)
    assert (err.value.code, err.value.node_id) == ("unsupported_family", "3")
    assert "ltxv model family" in err.value.message and "LTX-Video 0.9" in err.value.message


@pytest.mark.django_db
@pytest.mark.parametrize("held", ["folder", "single file"])
def test_the_imported_template_renders_an_mp4_with_sound(settings, tmp_path, held):
    """From the diffusers folder, and from ComfyUI's single file (smoke-ltx2.safetensors, the
    name the workflow loads) with its .diffusers/ configs."""
    import av

    from apps.takes.storage import blob_read
    from tests.workers.vocab_helpers import render
    from workers.models.ltx2.tiny import write_tiny_single_file, write_tiny_stack

    settings.INLINE_BLOB_DIR = tmp_path / "blobs"
    settings.INLINE_MODELS_DIR = tmp_path / "models"
    if held == "folder":
        write_tiny_stack(tmp_path / "models")
        result = imported(t2v())
    else:
        write_tiny_single_file(tmp_path / "models", name="smoke-ltx2")
        result = imported(t2v(), catalog={**FILE_CATALOG, "checkpoints": [CKPT]})
        assert result.graph.model_dump()["nodes"]["1"]["params"]["file"] == CKPT
    outcome, run = render(result.graph.model_dump()["nodes"], result.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    data = blob_read(take.sha256)
    with av.open(io.BytesIO(data), "r") as clip:
        stream = clip.streams.video[0]
        frames = len(list(clip.decode(stream)))
        fps = float(stream.average_rate or 0)
    with av.open(io.BytesIO(data), "r") as clip:
        assert clip.streams.audio, "the clip has a sound track"
        rate = clip.streams.audio[0].rate
        sound = sum(f.samples for f in clip.decode(audio=0)) / rate
    assert (frames, fps) == (FRAMES, FPS)
    assert sound == pytest.approx(FRAMES / FPS, abs=0.08)


@pytest.mark.django_db
def test_an_upsampled_clip_renders_at_twice_the_size(settings, tmp_path):
    import av

    from apps.takes.storage import blob_read
    from tests.workers.vocab_helpers import render
    from workers.models.ltx2.plugin import write_tiny_stack

    settings.INLINE_BLOB_DIR = tmp_path / "blobs"
    settings.INLINE_MODELS_DIR = tmp_path / "models"
    write_tiny_stack(tmp_path / "models")  # the pipeline folder and the latent upsampler
    result = imported(t2v(upsample=True))
    outcome, run = render(result.graph.model_dump()["nodes"], result.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as clip:
        stream = clip.streams.video[0]
        assert (stream.width, stream.height) == (2 * W, 2 * H)
        assert len(list(clip.decode(stream))) == FRAMES


def _api(doc: dict[str, Any]) -> dict[str, Any]:
    """The UI template as the API prompt ComfyUI queues (the importer's own reader)."""
    from apps.importer.report import Report
    from apps.importer.services import _prompt_of

    return _prompt_of(doc, Report())


def test_a_ksampler_over_the_av_latent_and_a_ltxv_clip_loader_map_too():
    prompt = _api(t2v())
    for nid in ("10", "11", "12", "13", "14", "15"):
        del prompt[nid]
    prompt["2"] = {"class_type": "CLIPLoader", "inputs": {"clip_name": GEMMA, "type": "ltxv"}}
    prompt["15"] = {"class_type": "KSampler", "inputs": {
        "model": ["1", 0], "positive": ["6", 0], "negative": ["6", 1], "latent_image": ["9", 0],
        "seed": 3, "steps": 4, "cfg": 2.5, "sampler_name": "res_multistep",
        "scheduler": "simple", "denoise": 1.0}}
    result = imported(prompt)
    graph = result.graph.model_dump()["nodes"]
    assert (graph["2"]["type"], graph["2"]["params"]["file"]) == ("load/checkpoint", "smoke-ltx2")
    assert graph["15"]["type"] == "ltx2/sample"
    assert {k: graph["15"]["params"][k] for k in ("seed", "steps", "cfg", "audio_cfg")} == {
        "seed": 3, "steps": 4, "cfg": 2.5, "audio_cfg": 2.5}
    warned = {(w["id"], w["message"].split(":")[0]) for w in result.report.warnings}
    assert ("15", "sampler 'res_multistep' is not used") in warned
    assert ("2", f"{GEMMA} not loaded") in warned
    assert "3" in {d["id"] for d in result.report.dropped}  # the audio VAE loader


def test_the_clip_s_frames_alone_are_refused_with_what_to_wire():
    prompt = _api(t2v())
    prompt["20"] = {"class_type": "SaveAnimatedWEBP", "inputs": {
        "images": ["17", 0], "filename_prefix": "x", "fps": 25, "lossless": False,
        "quality": 80, "method": "default"}}
    del prompt["19"]
    with pytest.raises(ImportInvalid) as err:
        imported(prompt)
    assert (err.value.code, err.value.node_id) == ("unmapped_node", "17")
    assert "ltx2/decode makes the clip with its sound" in err.value.message


def test_object_info_lists_the_ltx2_nodes_a_comfyui_client_sends():
    from apps.importer.comfy_object_info import object_info

    info = object_info(catalog=CATALOG, uploads=[])
    for name in ("EmptyLTXVLatentVideo", "LTXVImgToVideoInplace", "LTXAVTextEncoderLoader",
                 "LTXVAudioVAELoader", "LTXVConditioning", "LTXVEmptyLatentAudio",
                 "LTXVConcatAVLatent", "LTXVSeparateAVLatent", "LTXVScheduler",
                 "ModelSamplingLTXV", "LTXVPreprocess", "LTXVAudioVAEDecode", "LTXVAddGuide",
                 "LTXVCropGuides"):
        assert name in info, name
    assert info["LTXAVTextEncoderLoader"]["input"]["required"]["ckpt_name"][0] == ["smoke-ltx2"]
    assert info["LTXVSeparateAVLatent"]["output"] == ["LATENT", "LATENT"]
    guide = info["LTXVAddGuide"]
    assert guide["output"] == ["CONDITIONING", "CONDITIONING", "LATENT"]
    assert guide["input"]["required"]["frame_idx"][1]["min"] == -9999
    assert "optional" not in guide["input"]  # its attention mask and IC-LoRA: refused
