"""Values computed at run time, the lazy switch and the value preview, through the real executor
and the real database (tests/workers/vocab_helpers.py `render`): what runs, what is shown on the
run, what a node_done says, and what submit refuses."""

from __future__ import annotations

from typing import Any

import pytest

from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, graph_validate
from apps.runs.models import RunEvent
from tests.workers.vocab_helpers import done_nodes, render, wire
from workers.nodecache import NodeCache

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _blobs(settings: Any, tmp_path: Any) -> None:
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"


def _preview(source: str, port: str) -> dict[str, Any]:
    return {"type": "util/preview", "inputs": {"source": wire(source, port)}}


def test_typed_values_compute_at_run_time_and_show_on_the_run():
    nodes = {
        "flag": {"type": "input/bool", "params": {"value": True}},
        "a": {"type": "input/text", "params": {"value": "a lighthouse"}},
        "cat": {"type": "text/concat", "params": {"string_b": "at dusk", "delimiter": ", "},
                "inputs": {"string_a": wire("a", "text")}},
        "res": {"type": "util/resolution", "params": {"aspect_ratio": "16:9 (Widescreen)"}},
        "math": {"type": "math/expression", "params": {"expression": "a * 2 + (b if c else 0)"},
                 "inputs": {"a": wire("res", "width"), "b": wire("res", "height"),
                            "c": wire("flag", "value")}},
        "show_text": _preview("cat", "text"),
        "show_int": _preview("math", "int"),
        "show_float": _preview("math", "float"),
        "show_bool": _preview("flag", "value"),
    }
    outcome, run = render(nodes, "show_int")
    assert outcome.status == "succeeded", outcome.error
    # ComfyUI's ResolutionSelector at 1 MP, 16:9, multiple 8: 1368x768. The other previews
    # whose inputs the target's run computed show too; the text (off its path) does not.
    assert [(v["nodeId"], v["kind"], v["value"], v["text"]) for v in run.shown_values] == [
        ("show_int", "int", 1368 * 2 + 768, "3504"),
        ("show_bool", "bool", True, "True"),
        ("show_float", "float", 3504.0, "3504.0"),
    ]
    shown = RunEvent.objects.get(run=run, type="node_done", payload__nodeId="show_int")
    assert shown.payload["value"] == {"kind": "int", "value": 3504, "text": "3504"}
    done = RunEvent.objects.get(run=run, type="run_done")
    assert len(done.payload["values"]) == 3 and not run.takes.exists()
    _, run = render(nodes, "show_text")
    assert [v["value"] for v in run.shown_values] == ["a lighthouse, at dusk"]


def _switch_graph(flag: bool | None = None, *, expression: str | None = None) -> dict[str, Any]:
    """Two text branches (each two nodes) into switch/text; the choice is a boolean node, or a
    math expression over an int computed at run time."""
    nodes: dict[str, Any] = {
        "yes": {"type": "input/text", "params": {"value": "chosen"}},
        "yes2": {"type": "text/concat", "params": {"string_b": "!"},
                 "inputs": {"string_a": wire("yes", "text")}},
        "no": {"type": "input/text", "params": {"value": "never"}},
        "no2": {"type": "text/concat", "params": {"string_b": "?"},
                "inputs": {"string_a": wire("no", "text")}},
        "sw": {"type": "switch/text", "inputs": {"on_true": wire("yes2", "text"),
                                                 "on_false": wire("no2", "text")}},
        "show": _preview("sw", "output"),
    }
    if expression is None:
        nodes["flag"] = {"type": "input/bool", "params": {"value": flag}}
        nodes["sw"]["inputs"]["switch"] = wire("flag", "value")
    else:
        nodes["n"] = {"type": "input/int", "params": {"value": 5}}
        nodes["test"] = {"type": "math/expression", "params": {"expression": expression},
                         "inputs": {"a": wire("n", "value")}}
        nodes["sw"]["inputs"]["switch"] = wire("test", "bool")
    return nodes


@pytest.mark.parametrize(("flag", "ran", "skipped", "text"), [
    (True, {"yes", "yes2"}, {"no", "no2"}, "chosen!"),
    (False, {"no", "no2"}, {"yes", "yes2"}, "never?"),
])
def test_only_the_chosen_branch_of_a_switch_runs(flag, ran, skipped, text):
    outcome, run = render(_switch_graph(flag), "show")
    assert outcome.status == "succeeded", outcome.error
    done = done_nodes(run)
    assert ran <= set(done) and not skipped & set(done)
    assert done.index("flag") < done.index("sw")  # the choice ran before the switch
    assert run.shown_values[0]["value"] == text


@pytest.mark.parametrize(("expression", "text"), [("a > 3", "chosen!"), ("a - 5", "never?")])
def test_a_switch_chosen_by_a_value_computed_at_run_time(expression, text):
    outcome, run = render(_switch_graph(expression=expression), "show")
    assert outcome.status == "succeeded", outcome.error
    assert run.shown_values[0]["text"] == text
    assert len({"yes", "no"} & set(done_nodes(run))) == 1


def test_the_unchosen_branch_is_not_cached_and_runs_when_chosen_later():
    cache = NodeCache(64 << 20)
    render(_switch_graph(True), "show", cache=cache)
    entries = len(cache)
    _, again = render(_switch_graph(True), "show", cache=cache)
    cached = {e.payload["nodeId"]: e.payload["cached"]
              for e in RunEvent.objects.filter(run=again, type="node_done")}
    assert cached == {"flag": True, "yes": True, "yes2": True, "sw": True, "show": False}
    assert len(cache) == entries  # nothing of the unchosen branch was ever put in it
    _, flipped = render(_switch_graph(False), "show", cache=cache)
    cached = {e.payload["nodeId"]: e.payload["cached"]
              for e in RunEvent.objects.filter(run=flipped, type="node_done")}
    assert cached["no"] is False and cached["no2"] is False and "yes" not in cached
    assert flipped.shown_values[0]["text"] == "never?"


def test_a_switch_whose_chosen_branch_is_unwired_fails_naming_it():
    nodes = _switch_graph(False)
    del nodes["sw"]["inputs"]["on_false"]
    outcome, _ = render(nodes, "show")
    error = outcome.error or {}
    assert outcome.status == "failed" and error["nodeId"] == "sw"
    assert "on_false is not connected" in error["message"]


def test_the_whole_graph_is_validated_at_submit_even_the_branch_that_would_not_run():
    nodes = _switch_graph(True)
    nodes["no2"]["inputs"]["string_b"] = wire("flag", "value")  # a bool into a text input
    with pytest.raises(GraphInvalid) as err:
        graph_validate(GraphDoc.model_validate({"nodes": nodes}), target="show")
    assert err.value.code == "kind_mismatch" and err.value.node_id == "no2"


def test_a_switch_output_s_kind_is_known_at_submit():
    nodes = _switch_graph(True)
    nodes["bad"] = {"type": "image/save", "inputs": {"image": wire("sw", "output")}}
    with pytest.raises(GraphInvalid) as err:
        graph_validate(GraphDoc.model_validate({"nodes": nodes}), target="bad")
    assert err.value.code == "kind_mismatch" and err.value.node_id == "bad"


def test_a_value_that_arrives_out_of_a_param_s_range_fails_the_run_naming_the_node():
    nodes = {
        "n": {"type": "input/int", "params": {"value": 50}},
        "side": {"type": "math/expression", "params": {"expression": "a * 2"},
                 "inputs": {"a": wire("n", "value")}},
        "empty": {"type": "latent/empty", "params": {"height": 64},
                  "inputs": {"width": wire("side", "int")}},
    }
    outcome, run = render(nodes, "empty")
    error = outcome.error or {}
    assert outcome.status == "failed" and error["nodeId"] == "empty"
    assert error["code"] == "param_range"
    assert "multiple of 16" in error["message"] and "'width'" in error["message"]
    assert run.error_node == "empty"


def test_a_preview_off_the_target_s_path_does_not_run():
    nodes = _switch_graph(True)
    nodes["lonely"] = {"type": "input/text", "params": {"value": "not computed"}}
    nodes["show_lonely"] = _preview("lonely", "text")
    nodes["show_no"] = _preview("no", "text")  # on the unchosen branch
    outcome, run = render(nodes, "show")
    assert outcome.status == "succeeded"
    assert [v["nodeId"] for v in run.shown_values] == ["show"]
    assert {"lonely", "show_lonely", "show_no", "no"}.isdisjoint(done_nodes(run))


@pytest.mark.parametrize(("horizontal", "vertical", "zoom", "prompt"), [
    (333, 17, 5.0, "front-left quarter view elevated shot medium shot"),  # the shipped template's
    (0, 0, 5.0, "front view eye-level shot medium shot"),  # ComfyUI's defaults
    (22, -30, 0.0, "front view low-angle shot wide shot"),
    (23, 15, 2.0, "front-right quarter view elevated shot medium shot"),  # each bound is the next
    (90, -16, 1.9, "right side view low-angle shot wide shot"),
    (135, -15, 6.0, "back-right quarter view eye-level shot close-up"),
    (180, 44, 5.9, "back view elevated shot medium shot"),
    (225, 45, 10.0, "back-left quarter view high-angle shot close-up"),
    (270, 60, 7.5, "left side view high-angle shot close-up"),
    (337, 14, 3.0, "front-left quarter view eye-level shot medium shot"),
    (338, 0, 5.0, "front view eye-level shot medium shot"),  # past 337.5: the front again
    (360, 0, 5.0, "front view eye-level shot medium shot"),
])
def test_a_camera_angle_is_comfyui_s_shot_description(horizontal, vertical, zoom, prompt):
    nodes = {
        "angle": {"type": "text/camera-angle", "params": {
            "horizontal_angle": horizontal, "vertical_angle": vertical, "zoom": zoom}},
        "show": _preview("angle", "prompt"),
    }
    outcome, run = render(nodes, "show")
    assert outcome.status == "succeeded", outcome.error
    assert run.shown_values[0]["value"] == prompt


@pytest.mark.parametrize(("param", "value"), [("horizontal_angle", 361), ("vertical_angle", -31),
                                              ("zoom", 10.5)])
def test_a_camera_angle_out_of_comfyui_s_range_is_refused_at_submit(param, value):
    nodes = {"angle": {"type": "text/camera-angle", "params": {param: value}},
             "show": _preview("angle", "prompt")}
    with pytest.raises(GraphInvalid) as err:
        graph_validate(GraphDoc.model_validate({"nodes": nodes}), target="show")
    assert err.value.node_id == "angle" and param in str(err.value)
