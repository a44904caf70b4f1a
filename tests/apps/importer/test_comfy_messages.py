"""Run events → ComfyUI's /ws messages, and our refusals → ComfyUI's error shapes (pure)."""

from __future__ import annotations

import base64
import struct
from typing import Any

from apps.importer.comfy_messages import PromptMessages, status_message
from apps.importer.comfy_shapes import node_refusal, unknown_refusal

WORKFLOW = {"1": {"class_type": "LoadImage", "inputs": {}},
            "2": {"class_type": "ImageScale", "inputs": {}},
            "3": {"class_type": "SaveImage", "inputs": {}},
            "4": {"class_type": "PreviewImage", "inputs": {}}}


def types_of(messages: list[Any]) -> list[str]:
    return [m["type"] if isinstance(m, dict) else "binary" for m in messages]


def feed(events: list[dict[str, Any]]) -> list[Any]:
    translator = PromptMessages(prompt_id="p", workflow=WORKFLOW)
    out: list[Any] = []
    for event in events:
        out += translator.of(event)
    return out


def test_a_successful_run_reads_as_comfyuis_sequence_ending_with_executing_none():
    out = feed([
        {"type": "snapshot", "run": {}},
        {"type": "status", "status": "running"},
        {"type": "node_done", "nodeId": "1", "cached": True},
        {"type": "node_done", "nodeId": "2", "cached": False, "takes": []},
        {"type": "node_done", "nodeId": "3", "cached": False, "takes": [{"id": "t1"}]},
        {"type": "run_done", "status": "succeeded", "takes": [], "error": None},
    ])
    assert types_of(out) == ["execution_start", "execution_cached", "executing", "executing",
                             "executed", "execution_success", "executing"]
    assert out[1]["data"]["nodes"] == ["1"]
    assert out[4]["data"] == {"node": "3", "display_node": "3", "prompt_id": "p", "output": {
        "images": [{"filename": "t1.png", "subfolder": "", "type": "output"}]}}
    assert out[-1]["data"] == {"node": None, "display_node": None, "prompt_id": "p"}


def test_progress_enters_the_node_once_and_sends_previews_as_binary_frames():
    png = b"\x89PNG fake"
    preview = "data:image/png;base64," + base64.b64encode(png).decode()
    out = feed([
        {"type": "status", "status": "running"},
        {"type": "progress", "nodeId": "2", "step": 1, "total": 4, "preview": preview},
        {"type": "progress", "nodeId": "2", "step": 2, "total": 4},
        {"type": "node_done", "nodeId": "2", "cached": False},
    ])
    assert types_of(out) == ["execution_start", "executing", "progress", "binary", "progress"]
    assert out[2]["data"] == {"value": 1, "max": 4, "node": "2", "prompt_id": "p"}
    assert out[3] == struct.pack(">II", 1, 2) + png


def test_a_failed_run_is_an_execution_error_naming_the_node_and_its_class():
    out = feed([
        {"type": "status", "status": "running"},
        {"type": "node_done", "nodeId": "1", "cached": False},
        {"type": "run_done", "status": "failed",
         "error": {"code": "node_failed", "message": "boom", "nodeId": "2"}},
    ])
    error = next(m for m in out if m["type"] == "execution_error")["data"]
    assert error["node_id"] == "2" and error["node_type"] == "ImageScale"
    assert error["exception_message"] == "boom" and error["executed"] == ["1"]
    assert out[-1]["type"] == "executing" and out[-1]["data"]["node"] is None


def test_a_cancelled_run_is_execution_interrupted_and_nothing_follows_run_done():
    translator = PromptMessages(prompt_id="p", workflow=WORKFLOW)
    out = translator.of({"type": "run_done", "status": "cancelled", "error": None})
    assert types_of(out) == ["execution_start", "execution_interrupted", "executing"]
    assert translator.of({"type": "status", "status": "running"}) == []


def test_a_preview_output_is_a_temp_image():
    out = feed([{"type": "node_done", "nodeId": "4", "cached": False, "takes": [{"id": "t"}]}])
    assert out[-1]["data"]["output"]["images"][0]["type"] == "temp"


def test_status_carries_the_queue_and_the_sid_once():
    assert status_message(3, "abc") == {"type": "status", "data": {
        "status": {"exec_info": {"queue_remaining": 3}}, "sid": "abc"}}
    assert "sid" not in status_message(0)["data"]


def test_refusals_name_the_comfyui_input_not_our_port():
    prompt = {"10": {"class_type": "KSampler", "inputs": {}}}
    refused = node_refusal("missing_input", "required input 'latent' is not connected", "10",
                           prompt, ["9"])
    entry = refused.node_errors["10"]
    assert refused.status == 400 and entry["class_type"] == "KSampler"
    assert entry["dependent_outputs"] == ["9"]
    assert entry["errors"][0]["extra_info"]["input_name"] == "latent_image"
    widget = node_refusal("param_range", "param 'guidance' is 30; allowed range is 0..20", "10",
                          prompt, [])
    assert widget.node_errors["10"]["errors"][0]["extra_info"]["input_name"] == "cfg"


def test_an_unknown_type_anywhere_is_refused_and_known_ones_are_not():
    assert unknown_refusal({"1": {"class_type": "SaveImage", "inputs": {}},
                            "2": {"class_type": "LoraLoaderModelOnly", "inputs": {}}}) is None
    refused = unknown_refusal({"5": {"class_type": "Mystery", "inputs": {}}})
    assert refused is not None and refused.error["details"] == "Node ID '#5'"
    assert refused.body()["node_errors"]["5"]["class_type"] == "Mystery"


def test_a_shown_value_reads_as_comfyui_s_text_output_and_a_webp_take_keeps_its_suffix():
    out = feed([
        {"type": "status", "status": "running"},
        {"type": "node_done", "nodeId": "2", "cached": False, "takes": [],
         "value": {"kind": "int", "value": 64, "text": "64"}},
        {"type": "node_done", "nodeId": "3", "cached": False,
         "takes": [{"id": "t1", "mediaType": "image/webp"}]},
    ])
    assert types_of(out) == ["execution_start", "executing", "executed", "executing", "executed"]
    assert out[2]["data"]["output"] == {"text": ["64"]}
    assert out[4]["data"]["output"]["images"][0]["filename"] == "t1.webp"
