"""Seconds per denoise step of a full-size Wan 2.2 transformer at 720p: farm sampler vs WanPipeline.

The model: Wan 2.2 TI2V-5B's transformer (the Wan team's `ti2v_5B` config in diffusers' names:
30 layers, dim 3072 = 24 heads × 128, ffn 14336, 48 latent channels, text_dim 4096), RANDOM
weights in bf16 built on the GPU (no weights file). Its clip: 1280×704 (720p in the 5B's
multiples of 32), 121 frames → latents [1, 48, 31, 44, 80] (its VAE packs 16×16×4), 27,280
tokens; 512-token random prompt embeddings, CFG 5 (two rows per step). Timed, in one run:
  - diffusers' WanPipeline.__call__ (prompt_embeds given, output_type="latent", no VAE: it is
    given 640×352 so that its ÷8 default makes the 5B's ÷16 latents), per step;
  - the farm's sampler: SampleJob + StepBatcher + the Wan engine's `predict`, one job, per step;
  - per xfuser degree the machine has (2, 4, 8 GPUs): the same job on a worker group
    (`workers/parallel/`, ulysses=n: one clip's tokens split across the GPUs), per step;
and the peak GPU memory of each. Both sides run the 5B's per-token timesteps (the pipeline
with `expand_timesteps=True`, the farm's engine for a 48-channel transformer): the same math.
`--tiny` runs the same code on the CPU with the tiny TI2V test config (48 channels; a 2-rank
gloo group stands in for the degree rows) to check the script itself.

    .venv/bin/python bench/gpu_video.py [--steps 4] [--frames 121] [--tiny]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workers.models.wan import engine  # noqa: E402
from workers.sampling import SampleJob  # noqa: E402
from workers.sampling.batcher import StepBatcher  # noqa: E402

TI2V_5B = {  # the Wan team's ti2v_5B config (wan/configs/wan_ti2v_5B.py) in diffusers' names
    "patch_size": [1, 2, 2], "num_attention_heads": 24, "attention_head_dim": 128,
    "in_channels": 48, "out_channels": 48, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 14336,
    "num_layers": 30, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
    "rope_max_seq_len": 1024,
}
GUIDANCE = 5.0


def build(tiny: bool, device: str, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    from diffusers import WanTransformer3DModel

    if tiny:
        from workers.models.wan import TI2V_CHANNELS
        from workers.models.wan.tiny import transformer_config

        config = transformer_config(TI2V_CHANNELS)
    else:
        config = dict(TI2V_5B)
    with torch.device(device):
        model: Any = WanTransformer3DModel(**config)
    model = model.to(dtype).eval()
    return model, config


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_gib(device: str) -> str:
    if device != "cuda":
        return ""
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return f"  peak {peak:.1f} GiB"


def time_pipeline(model: Any, embeds: Any, args: Any, spatial: int, device: str) -> float:
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    scheduler = FlowMatchEulerDiscreteScheduler(shift=engine.SHIFT)
    pipe: Any = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=scheduler,
                            transformer=model, expand_timesteps=engine.per_token(model))
    pipe.set_progress_bar_config(disable=True)
    scale = spatial // 8  # no VAE: the pipeline divides by 8; the model's VAE by `spatial`

    def go(steps: int) -> None:
        pipe(prompt_embeds=embeds[None], negative_prompt_embeds=embeds[None],
             height=args.height // scale, width=args.width // scale, num_frames=args.frames,
             num_inference_steps=steps, guidance_scale=GUIDANCE, output_type="latent",
             generator=torch.Generator("cpu").manual_seed(0))

    go(1)  # warm-up
    sync(device)
    start = time.perf_counter()
    go(args.steps)
    sync(device)
    return (time.perf_counter() - start) / args.steps


def make_job(config: dict[str, Any], embeds: Any, args: Any, spatial: int, device: str,
             steps: int) -> SampleJob:
    sigmas, timesteps = engine.schedule(steps, args.width, args.height)
    shape = (1, config["in_channels"], (args.frames - 1) // 4 + 1, args.height // spatial,
             args.width // spatial)
    latents = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(0)).to(device)
    return SampleJob(latents=latents, sigmas=sigmas.to(device), timesteps=timesteps.to(device),
                     positive=embeds, negative=embeds, guidance=GUIDANCE)


def time_runner(run: Any, make: Any, steps: int, device: str) -> float:
    run(make(1))  # warm-up (a group: its start and model load)
    sync(device)
    start = time.perf_counter()
    run(make(steps))
    sync(device)
    return (time.perf_counter() - start) / steps


def group_rows(model: Any, config: dict[str, Any], make: Any, args: Any, device: str) -> None:
    """Per degree the machine has: the clip on a worker group of that many ranks (each rank
    loads the random model from a file written once, as a real models dir holds it)."""
    from safetensors.torch import save_file

    from workers.models.wan.tiny import _config
    from workers.parallel.config import Degrees
    from workers.parallel.group import WorkerGroup
    from workers.parallel.protocol import ModelRef

    gpus = torch.cuda.device_count() if device == "cuda" else 2
    degrees = [n for n in (2, 4, 8) if n <= gpus]
    if not degrees:
        print("  worker group: one GPU here, no xfuser degree to time")
        return
    models_dir = Path(tempfile.mkdtemp(prefix="bench-gpu-video-"))
    path = models_dir / "diffusion_models" / "wan-bench.safetensors"
    path.parent.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    _config(path, "WanTransformer3DModel", config)
    dtype = "float32" if device == "cpu" else "bfloat16"
    ref = ModelRef(str(models_dir), path.name, dtype)
    for n in degrees:
        group = WorkerGroup(n, "gloo" if device == "cpu" else "xfuser", step_timeout=1800)
        try:
            split = Degrees(ulysses=n)
            seconds = time_runner(lambda job, g=group, d=split: g.run(job, ref, d), make,
                                  args.steps, device)
        finally:
            group.close()
        print(f"  worker group, ulysses={n}      : {seconds:.4f} s/step "
              f"({group.last_report.get('local_tokens')} of {group.last_report.get('tokens')} "
              "tokens per rank)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=704)
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="tiny config on the CPU (self-check)")
    parser.add_argument("--no-group", action="store_true", help="skip the worker-group rows")
    args = parser.parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny to check the script on the CPU")
    if args.tiny:
        args.width, args.height, args.frames = min(args.width, 128), min(args.height, 96), 9
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model, config = build(args.tiny, device, dtype)
    spatial = 16 if config["in_channels"] == 48 else 8  # TI2V-5B's VAE: 16×16; Wan 2.1's: 8×8
    embeds = torch.randn(engine.MAX_SEQUENCE_LENGTH, config["text_dim"], device=device,
                         dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    latent_frames = (args.frames - 1) // 4 + 1
    tokens = latent_frames * (args.height // spatial // 2) * (args.width // spatial // 2)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"bench/gpu_video: {params / 1e9:.3f} B params, {dtype}, {name}, {args.width}x"
          f"{args.height}, {args.frames} frames ({tokens} tokens), {args.steps} steps, cfg "
          f"{GUIDANCE}")
    peak_gib(device)
    pipe_s = time_pipeline(model, embeds, args, spatial, device)
    print(f"  diffusers WanPipeline        : {pipe_s:.4f} s/step{peak_gib(device)}")
    batcher = StepBatcher(lambda jobs: engine.predict(model, jobs), max_items=2)

    def make(steps: int) -> SampleJob:
        return make_job(config, embeds, args, spatial, device, steps)

    farm_s = time_runner(batcher.run, make, args.steps, device)
    print(f"  farm sampler, 1 job          : {farm_s:.4f} s/step  ratio farm/pipeline "
          f"{farm_s / pipe_s:.3f}{peak_gib(device)}")
    if not args.no_group:
        cpu_embeds = embeds.cpu()
        group_rows(model.cpu() if device == "cpu" else model, config,
                   lambda steps: make_job(config, cpu_embeds, args, spatial, device, steps),
                   args, device)


if __name__ == "__main__":
    main()
