"""Values computed at run time (booleans, text, math, image sizes, resolution presets), the lazy
switch and the value preview: ComfyUI's core graph vocabulary around the models.

Every output's kind is declared here, so a graph that wires them wrongly is a 422 at submit
even though the values themselves are only known when the run computes them.
"""

from __future__ import annotations

from apps.graphs.descriptors import PORT_KINDS, VALUE_KINDS, NodeDescriptor, Param, Port
from apps.graphs.mathexpr import MAX_LENGTH as MAX_EXPRESSION
from apps.graphs.mathexpr import NAMES as MATH_NAMES

MAX_TEXT = 32000  # as a prompt (apps/graphs/nodes.py MAX_PROMPT): text feeds text encoders

# ComfyUI's ResolutionSelector presets (comfy_extras/nodes_resolution.py): label → ratio.
ASPECT_RATIOS: dict[str, tuple[int, int]] = {
    "1:1 (Square)": (1, 1),
    "3:2 (Photo)": (3, 2),
    "4:3 (Standard)": (4, 3),
    "16:9 (Widescreen)": (16, 9),
    "21:9 (Ultrawide)": (21, 9),
    "2:3 (Portrait Photo)": (2, 3),
    "3:4 (Portrait Standard)": (3, 4),
    "9:16 (Portrait Widescreen)": (9, 16),
}


def _text(name: str, default: str = "", max_length: int = MAX_TEXT) -> tuple[Port, Param]:
    """A text param that an upstream text output may supply instead (ComfyUI's widget input)."""
    return (Port(name, "text", required=False),
            Param(name, "string", default, input=name, max_length=max_length))


_string_a, _string_b = _text("string_a"), _text("string_b")

VALUES = (
    NodeDescriptor(
        "input/bool", "Boolean", "input",
        outputs=(Port("value", "bool"),),
        params=(Param("value", "bool", False),),
        description="A boolean (ComfyUI's PrimitiveBoolean).",
    ),
    NodeDescriptor(
        "text/concat", "Concatenate text", "text",
        inputs=(_string_a[0], _string_b[0]),
        outputs=(Port("text", "text"),),
        params=(_string_a[1], _string_b[1], Param("delimiter", "string", "", max_length=100)),
        description="string_a + delimiter + string_b (ComfyUI's StringConcatenate).",
    ),
    NodeDescriptor(
        "text/camera-angle", "Camera angle prompt", "text",
        outputs=(Port("prompt", "text"),),
        params=(
            Param("horizontal_angle", "int", 0, min=0, max=360,
                  description="Azimuth around the subject in degrees: 0 the front, 90 the right "
                  "side, 180 the back."),
            Param("vertical_angle", "int", 0, min=-30, max=60,
                  description="Elevation in degrees: negative looks up from below, positive "
                  "down from above."),
            Param("zoom", "float", 5.0, min=0.0, max=10.0,
                  description="How close the camera is: 0 a wide shot, 10 a close-up."),
        ),
        description="The shot as words for a multi-angle prompt, e.g. \"front-left quarter view "
        "elevated shot medium shot\" (ComfyUI's CameraAngle, its prompt output: one of 8 "
        "azimuth, 4 elevation and 3 distance terms, the 96 camera positions of the Qwen-Image-"
        "Edit-2511 multiple-angles LoRA).",
    ),
    NodeDescriptor(
        "math/expression", "Math expression", "math",
        inputs=tuple(Port(name, "float", required=False, accepts=("int", "bool"))
                     for name in MATH_NAMES),
        outputs=(Port("float", "float"), Port("int", "int"), Port("bool", "bool")),
        params=(Param("expression", "string", "a + b", max_length=MAX_EXPRESSION,
                      description="Arithmetic, comparisons, and/or/not, x if c else y, and "
                      "sum min max abs round pow sqrt ceil floor log log2 log10 sin cos tan "
                      "int float over the inputs a…z (and `values`, all of them)."),),
        description="Evaluates a math expression of its inputs (ComfyUI's ComfyMathExpression): "
        "the result as a float, an int (truncated) and a bool. A safe evaluator, never eval.",
    ),
    NodeDescriptor(
        "image/size", "Image size", "image",
        inputs=(Port("image", "image"),),
        outputs=(Port("width", "int"), Port("height", "int"), Port("batch_size", "int")),
        description="The image's width and height (batch size: always 1 here).",
    ),
    NodeDescriptor(
        "util/resolution", "Resolution preset", "util",
        outputs=(Port("width", "int"), Port("height", "int")),
        params=(
            Param("aspect_ratio", "enum", "1:1 (Square)", choices=tuple(ASPECT_RATIOS)),
            Param("megapixels", "float", 1.0, min=0.1, max=16.0,
                  description="Target pixels in millions of 1024² (1.0 ≈ 1024×1024)."),
            Param("multiple", "int", 8, min=8, max=128,
                  description="Each side is rounded to a multiple of this."),
            Param("minimum", "int", 256, min=32, max=4096,
                  description="The smallest side allowed."),
        ),
        description="Width and height from an aspect ratio and a megapixel target "
        "(ComfyUI's ResolutionSelector).",
    ),
    NodeDescriptor(
        "util/preview", "Preview value", "output",
        inputs=(Port("source", "text", accepts=("int", "float", "bool")),),
        shows_value=True,
        description="Shows a value on the run (its `values`), as ComfyUI's PreviewAny shows it "
        "on the node; keeps no take.",
    ),
)


def _switch(kind: str) -> NodeDescriptor:
    return NodeDescriptor(
        f"switch/{kind}", f"Switch ({kind})", "logic",
        inputs=(Port("switch", "bool", required=False), Port("on_false", kind, required=False),
                Port("on_true", kind, required=False)),
        outputs=(Port("output", kind),),
        params=(Param("switch", "bool", False, input="switch"),),
        lazy=("on_false", "on_true"),
        description="Passes on_true when switch is true, else on_false. Only the chosen branch "
        "runs: the other's nodes are not executed (ComfyUI's ComfySwitchNode).",
    )


# One switch per port kind: the output's kind is known at submit, whatever the branch.
SWITCHES = tuple(_switch(kind) for kind in sorted(PORT_KINDS))
assert set(VALUE_KINDS) <= PORT_KINDS
