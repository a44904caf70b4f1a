"""Seconds per denoise step of the full-size Z-Image Turbo transformer: farm sampler vs diffusers.

Builds the 6.15 B-parameter transformer from the config the farm ships
(workers/models/zimage/configs/transformer) with RANDOM weights in bf16 on the GPU (no weights
file needed), random caption embeddings of a typical prompt length, and times, in one run:
  - diffusers' ZImagePipeline.__call__ (prompt_embeds given, output_type="latent"), per step;
  - the farm's sampler: SampleJob + StepBatcher + predict_velocity, one job, per step;
  - the farm's sampler with 4 concurrent jobs in one batch (throughput per image-step).
Needs CUDA for the real measurement; `--tiny` runs the same code on the CPU with the tiny test
config to check the script itself.

    .venv/bin/python bench/gpu_zimage.py [--size 1024] [--steps 8] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workers.models.zimage import engine  # noqa: E402
from workers.sampling import SampleJob  # noqa: E402
from workers.sampling.batcher import StepBatcher  # noqa: E402


def build(tiny: bool, device: str, dtype: torch.dtype):
    from diffusers import ZImageTransformer2DModel

    if tiny:
        from workers.models.zimage.tiny import TRANSFORMER_CONFIG as config
    else:
        config = json.loads((engine.CONFIGS / "transformer" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    with torch.device(device):
        model = ZImageTransformer2DModel.from_config(config).to(dtype).eval()
    return model, config["cap_feat_dim"]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_pipeline(model, caption, size, steps, device) -> float:
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    scheduler = FlowMatchEulerDiscreteScheduler.from_config(engine.scheduler_config())
    pipe: Any = ZImagePipeline(scheduler=scheduler, vae=None, text_encoder=None, tokenizer=None,
                               transformer=model)
    pipe.set_progress_bar_config(disable=True)

    def go() -> None:
        pipe(prompt_embeds=[caption], height=size, width=size, num_inference_steps=steps,
             guidance_scale=0.0, output_type="latent",
             generator=torch.Generator("cpu").manual_seed(0))

    go()  # warm-up
    sync(device)
    start = time.perf_counter()
    go()
    sync(device)
    return (time.perf_counter() - start) / steps


def time_farm(model, caption, size, steps, device, jobs: int) -> float:
    batcher = StepBatcher(lambda batch: engine.predict_velocity(model, batch), max_batch=jobs)

    sigmas, timesteps = engine.sigma_schedule(steps, size, size)
    shape = engine.latent_shape(size, size)

    def job(seed: int) -> SampleJob:  # set-up outside the timed region, as the pipeline's is not
        start = engine.noise(shape, torch.Generator("cpu").manual_seed(seed), device)
        return SampleJob(latents=start, sigmas=sigmas.to(device), timesteps=timesteps.to(device),
                         positive=caption)

    def go() -> None:
        threads = [threading.Thread(target=batcher.run, args=(job(s),)) for s in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    go()  # warm-up
    sync(device)
    start = time.perf_counter()
    forwards = batcher.forwards
    go()
    sync(device)
    elapsed = time.perf_counter() - start
    print(f"    ({batcher.forwards - forwards} forwards for {jobs} job(s) x {steps} steps)")
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--caption-tokens", type=int, default=120)
    parser.add_argument("--tiny", action="store_true", help="tiny config on the CPU (self-check)")
    args = parser.parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny to check the script on the CPU")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model, cap_dim = build(args.tiny, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    caption = torch.randn(args.caption_tokens, cap_dim, device=device, dtype=dtype)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"bench/gpu_zimage: {params / 1e9:.3f} B params, {dtype}, {name}, "
          f"{args.size}x{args.size}, {args.steps} steps, caption {args.caption_tokens} tokens")
    pipe_s = time_pipeline(model, caption, args.size, args.steps, device)
    print(f"  diffusers ZImagePipeline     : {pipe_s:.4f} s/step")
    farm_s = time_farm(model, caption, args.size, args.steps, device, jobs=1)
    print(f"  farm sampler, 1 job          : {farm_s:.4f} s/step  ratio farm/pipeline "
          f"{farm_s / pipe_s:.3f}")
    batch_s = time_farm(model, caption, args.size, args.steps, device, jobs=4)
    print(f"  farm sampler, 4 jobs batched : {batch_s:.4f} s/step for 4 images = "
          f"{batch_s / 4:.4f} s per image-step")
    if device == "cuda":
        print(f"  peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
