"""Image and mask operations beyond load / resize / crop / save (ComfyUI's image basics).

Images between nodes are RGB (or RGBA) Pillow images; a mask is a float plane in 0..1 where 1
marks the area to paint, as ComfyUI's MASK. Where a param takes a size, an upstream int output
may supply it instead (ComfyUI's widget inputs), checked against the same range when it arrives.
"""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor, Param, Port

MAX_SIDE = 4096
RESAMPLE_METHODS = ("lanczos", "bicubic", "bilinear", "nearest")
_image_in, _image_out = (Port("image", "image"),), (Port("image", "image"),)
_method = Param("method", "enum", "lanczos", choices=RESAMPLE_METHODS)


def _wired_int(name: str, default: int | None, lo: int, hi: int) -> tuple[Port, Param]:
    return (Port(name, "int", required=False),
            Param(name, "int", default, required=default is None, min=lo, max=hi, input=name))


_width, _height = _wired_int("width", None, 1, MAX_SIDE * 2), _wired_int("height", None, 1,
                                                                            MAX_SIDE * 2)
_scale_by = (Port("scale_by", "float", required=False, accepts=("int",)),
             Param("scale_by", "float", 1.0, min=0.01, max=8.0, input="scale_by"))
_side_size = _wired_int("size", 512, 1, MAX_SIDE * 2)
_x, _y = _wired_int("x", 0, 0, MAX_SIDE * 2), _wired_int("y", 0, 0, MAX_SIDE * 2)
_pads = tuple(_wired_int(side, 0, 0, MAX_SIDE) for side in ("left", "top", "right", "bottom"))

_tiles = (
    Param("tile", "int", 512, min=32, max=MAX_SIDE,
          description="Input pixels per tile side: smaller tiles need less memory."),
    Param("overlap", "int", 32, min=0, max=512,
          description="Context pixels each tile sees beyond its own edges (only its own part "
          "is kept): more hides tile seams."),
)

IMAGE_OPS = (
    NodeDescriptor(
        "image/resize", "Resize image", "image",
        inputs=(Port("image", "image"), _width[0], _height[0]),
        outputs=_image_out,
        params=(
            _width[1], _height[1], _method,
            Param("fit", "enum", "stretch", choices=("stretch", "crop", "pad"),
                  description="stretch to the size; crop: scale to cover it and cut the centre "
                  "(ComfyUI's crop 'center'); pad: scale to fit inside and pad the rest."),
            Param("pad_color", "enum", "black", choices=("black", "white", "gray")),
        ),
    ),
    NodeDescriptor(
        "image/scale-by", "Scale image by", "image",
        inputs=(Port("image", "image"), _scale_by[0]),
        outputs=_image_out,
        params=(_scale_by[1], _method),
        description="Both sides times a factor, rounded (ComfyUI's ImageScaleBy).",
    ),
    NodeDescriptor(
        "image/scale-to-pixels", "Scale image to total pixels", "image",
        inputs=_image_in, outputs=_image_out,
        params=(
            Param("megapixels", "float", 1.0, min=0.01, max=16.0,
                  description="Millions of 1024² pixels; the aspect ratio is kept."),
            Param("resolution_steps", "int", 1, min=1, max=256,
                  description="Each side is rounded to a multiple of this."),
            _method,
        ),
        description="Scales to a pixel count keeping the aspect (ComfyUI's "
        "ImageScaleToTotalPixels).",
    ),
    NodeDescriptor(
        "image/scale-to-kontext", "Scale image to a Kontext resolution", "image",
        inputs=_image_in, outputs=_image_out,
        params=(
            _method,
            Param("fit", "enum", "crop", choices=("crop", "stretch"),
                  description="crop: scale to cover it and cut the centre (ComfyUI's "
                  "FluxKontextImageScale); stretch: to the size (FluxKontextPipeline)."),
        ),
        description="Scales to the resolution FLUX.1 Kontext was trained at nearest the "
        "image's aspect (672×1568 … 1024² … 1568×672; ComfyUI's FluxKontextImageScale).",
    ),
    NodeDescriptor(
        "image/scale-side", "Scale image by one side", "image",
        inputs=(Port("image", "image"), _side_size[0]),
        outputs=_image_out,
        params=(
            Param("side", "enum", "longer", choices=("longer", "shorter", "width", "height")),
            _side_size[1], _method,
        ),
        description="Scales so that one side has `size` pixels, keeping the aspect (ComfyUI's "
        "ResizeImageMaskNode longer / shorter / width / height, ImageScale with a 0 side).",
    ),
    NodeDescriptor(
        "image/resize-to-match", "Resize image to match", "image",
        inputs=(Port("image", "image"), Port("match", "image", accepts=("mask",))),
        outputs=_image_out,
        params=(
            _method,
            Param("fit", "enum", "crop", choices=("stretch", "crop"),
                  description="stretch to match's size; crop: scale to cover it and cut the "
                  "centre (ComfyUI's crop 'center')."),
        ),
        description="Resizes to the size of `match`, an image or a mask (ComfyUI's "
        "ResizeImageMaskNode 'match size').",
    ),
    NodeDescriptor(
        "image/scale-to-multiple", "Scale image to a multiple", "image",
        inputs=_image_in, outputs=_image_out,
        params=(
            Param("multiple", "int", 8, min=1, max=MAX_SIDE,
                  description="Both sides become multiples of this (rounded down)."),
            _method,
        ),
        description="Scales to cover the largest size whose sides are multiples of "
        "`multiple`, keeping the aspect, and cuts the centre (ComfyUI's ResizeImageMaskNode "
        "'scale to multiple'); an image already on the grid (or smaller than one step) is "
        "kept as it is.",
    ),
    NodeDescriptor(
        "image/empty", "Empty image", "image",
        inputs=(_width[0], _height[0]),
        outputs=_image_out,
        params=(_wired_int("width", 512, 1, MAX_SIDE * 2)[1],
                _wired_int("height", 512, 1, MAX_SIDE * 2)[1],
                Param("color", "int", 0, min=0, max=0xFFFFFF,
                      description="The colour as 0xRRGGBB (0: black).")),
        description="An image of one colour (ComfyUI's EmptyImage, one image).",
    ),
    NodeDescriptor(
        "image/invert", "Invert image", "image",
        inputs=_image_in, outputs=_image_out,
        description="255 − every colour value (alpha kept), ComfyUI's ImageInvert.",
    ),
    NodeDescriptor(
        "image/composite", "Composite images", "image",
        inputs=(Port("destination", "image"), Port("source", "image"),
                Port("mask", "mask", required=False), _x[0], _y[0]),
        outputs=_image_out,
        params=(
            _x[1], _y[1],
            Param("resize_source", "bool", False,
                  description="Stretch the source to the destination's size first."),
        ),
        description="Pastes source onto destination at (x, y), through the mask when one is "
        "wired (ComfyUI's ImageCompositeMasked).",
    ),
    NodeDescriptor(
        "image/pad-outpaint", "Pad image for outpainting", "image",
        inputs=(Port("image", "image"), *(port for port, _ in _pads)),
        outputs=(Port("image", "image"), Port("mask", "mask")),
        params=(
            *(param for _, param in _pads),
            Param("feathering", "int", 40, min=0, max=MAX_SIDE),
        ),
        description="Grows the canvas (new area mid-grey) and gives the mask of what to paint, "
        "feathered into the old image (ComfyUI's ImagePadForOutpaint).",
    ),
    NodeDescriptor(
        "mask/from-image", "Mask from image", "mask",
        inputs=_image_in, outputs=(Port("mask", "mask"),),
        params=(Param("channel", "enum", "red", choices=("red", "green", "blue", "alpha")),),
        description="One channel of the image as a mask (ComfyUI's ImageToMask).",
    ),
    NodeDescriptor(
        "mask/to-image", "Mask to image", "mask",
        inputs=(Port("mask", "mask"),), outputs=_image_out,
        description="The mask as a grey image (ComfyUI's MaskToImage).",
    ),
)

# Upscale models (ESRGAN family, workers/models/upscale): a loader and the node that runs one.
UPSCALING = (
    NodeDescriptor(
        "load/upscale-model", "Load upscale model", "loaders",
        outputs=(Port("upscale_model", "upscale-model"),),
        params=(Param("file", "model", required=True, options_from="upscale_models"),),
        description="An upscale model from the models dir's upscale_models/ (.pth or "
        ".safetensors): ESRGAN / Real-ESRGAN (RRDBNet) or SRVGGNetCompact (ComfyUI's "
        "UpscaleModelLoader).",
    ),
    NodeDescriptor(
        "image/upscale-with-model", "Upscale image with model", "image",
        inputs=(Port("upscale_model", "upscale-model"), Port("image", "image")),
        outputs=_image_out,
        params=_tiles,
        description="The image upscaled by the model's own factor, in tiles (ComfyUI's "
        "ImageUpscaleWithModel; the farm keeps each tile's own part where ComfyUI blends "
        "overlaps).",
    ),
    NodeDescriptor(
        "frames/upscale-with-model", "Upscale frames with model", "video",
        inputs=(Port("upscale_model", "upscale-model"), Port("frames", "frames")),
        outputs=(Port("frames", "frames"),),
        params=_tiles,
        description="Each frame of a clip upscaled as image/upscale-with-model upscales an "
        "image (ComfyUI's ImageUpscaleWithModel on a video's IMAGE batch); progress counts "
        "frames.",
    ),
)
