"""Z-Image (Turbo) through diffusers: loading from a models dir, and the math done by hand.

- `loading`: transformer / VAE / text encoder from single files or folders, cached per process.
- `engine`: encode prompt → sigmas → transformer + Euler (via the step batcher) → VAE decode;
  reproduces `ZImagePipeline` / `ZImageImg2ImgPipeline` bit for bit on CPU.
- `tiny`: a tiny random-weight stack written in the ComfyUI layout, for smoke runs and tests.
Importing this package imports no torch; its modules do.
"""
