"""`./farm render` / `./farm check` without --model drive a prompt graph of images: the default
model is not a video family's, nor Wan's I2V (36-channel) one, while an image model is held."""

from __future__ import annotations

from inline_farm.terminal import _first_prompt_model


def held(name: str, family: str, variant: str | None = None) -> dict[str, object]:
    return {"folder": "diffusion_models", "name": name, "family": family, "variant": variant}


def test_the_default_model_skips_video_and_i2v_models():
    files = [held("a-wan-i2v.safetensors", "wan", "i2v"), held("b-wan.safetensors", "wan", "t2v"),
             held("c-turbo.safetensors", "zimage")]
    names = [str(f["name"]) for f in files]
    assert _first_prompt_model(names, files) == "c-turbo.safetensors"
    assert _first_prompt_model(names[:2], files) == "a-wan-i2v.safetensors"  # nothing else held
