"""One image split over a worker group vs one process: seconds per denoise step, on CPU.

On CPU the group cannot be faster (2 processes share the same cores and exchange activations
through gloo over loopback): the point is the protocol's cost per step — the pipe round trip
of each forward (the jobs' latents and captions forth, velocities back), its broadcast to every
rank, and the gathers of the split itself — printed next to the single-process step.

Work: two random-weight Z-Image transformers — the tiny smoke stack (overhead-dominated) and a
mid-size one (dim 384, 6 layers, ~18 M parameters) — at 256² and 512², guidance 0 (Ulysses-style
sequence split, ulysses=2) and guidance 4 (CFG-parallel, cfg=2, vs one process computing both
halves in one forward). Group start and model load are excluded (a warm-up job first); each
figure is the best of 3 jobs. The process runs torch with its default threads, each rank with
cores / 2. Last, `BATCH` jobs at once on each (the group is a step batcher's forward, as in a
group worker with slots): seconds per step of the whole batch, and how many forwards it took.

Video row: the tiny random Wan transformer (workers/models/wan/tiny.py) on a 33-frame clip at
256² (9 latent frames, 2304 tokens), guidance 5: its token sequence F'·H'·W' split over 2 ranks
(ulysses=2, both CFG halves in one forward on each) and CFG-parallel (cfg=2), against one
process; `--video` runs only these rows.

Family rows (`--family flux1|flux2|qwenimage|krea2`, only those rows): the family's tiny random
stack (workers/models/<family>/tiny.py) at 512², guidance 3 (FLUX.1: its distilled guidance, no
CFG rows), its own predict on every rank (workers/parallel/split_family.py): tokens by diffusers'
context parallelism (ulysses=2) and CFG rows across the pair (cfg=2), against one process.

    .venv/bin/python bench/parallel.py [--steps 8] [--video] [--family flux2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._farm import all_at_once
from bench._mid import write_mid

REPEATS = 3
BATCH = 4
MID_NAME = "zimage-MID-parallel-bench"


def make_job(steps: int, side: int, guidance: float) -> Any:
    from workers.models.zimage import engine
    from workers.sampling import SampleJob

    sigmas, timesteps = engine.sigma_schedule(steps, side, side)
    generator = torch.Generator("cpu").manual_seed(3)
    return SampleJob(
        latents=engine.noise(engine.latent_shape(side, side), generator, "cpu"),
        sigmas=sigmas, timesteps=timesteps, positive=torch.randn(24, 16, generator=generator),
        negative=torch.randn(12, 16, generator=generator) if guidance > 0 else None,
        guidance=guidance)


def best_per_step(run: Any, make: Any, steps: int) -> tuple[float, Any]:
    """Seconds per step of the best of REPEATS timed jobs `make(steps)` (this box is shared)
    after one untimed 1-step job, and the last job's latents."""
    run(make(1))
    best, out = float("inf"), None
    for _ in range(REPEATS):
        start = time.perf_counter()
        out = run(make(steps))
        best = min(best, (time.perf_counter() - start) / steps)
    return best, out


def per_step(run: Any, steps: int, side: int, guidance: float) -> tuple[float, Any]:
    return best_per_step(run, lambda n: make_job(n, side, guidance), steps)


def constant(degrees: Any) -> Any:
    return lambda _jobs: degrees


def batched(batcher: Any, steps: int, side: int, guidance: float) -> tuple[float, Any]:
    """BATCH jobs through `batcher` from BATCH threads: seconds per step of the whole batch."""
    jobs = [make_job(steps, side, guidance) for _ in range(BATCH)]
    return all_at_once(batcher.run, jobs) / steps, jobs[0].latents


def main() -> None:
    from workers.device.policy import DevicePolicy
    from workers.models.zimage.loading import load_diffusion_model
    from workers.models.zimage.tiny import write_smoke_stack
    from workers.parallel.config import Degrees
    from workers.parallel.group import WorkerGroup
    from workers.parallel.protocol import ModelRef

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--video", action="store_true", help="only the Wan video rows")
    parser.add_argument("--family", choices=("flux1", "flux2", "qwenimage", "krea2"),
                        help="only this family's rows")
    args = parser.parse_args()
    if args.video:
        video_rows(args.steps)
        return
    if args.family:
        family_rows(args.family, args.steps)
        return
    models_dir = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    models = {"tiny": write_smoke_stack(models_dir)["model"], "mid": write_mid(models_dir, MID_NAME)}
    policy = DevicePolicy(profile="cpu")
    print(f"{'model':6} {'side':>5} {'method':10} {'1 process':>11} {'group of 2':>11} "
          f"{'overhead':>10} {'max |Δ|':>9}")
    for degrees, guidance in ((Degrees(ulysses=2), 0.0), (Degrees(cfg=2), 4.0)):
        group = WorkerGroup(2)
        try:
            for label, name in models.items():
                single = load_diffusion_model(models_dir, name, policy)
                ref = ModelRef(str(models_dir), name, "float32")
                group.run(make_job(1, 64, guidance), ref, degrees)  # start + load: not timed
                for side in (256, 512):
                    alone, expected = per_step(single.batcher.run, args.steps, side, guidance)
                    split, got = per_step(
                        lambda job, g=group, r=ref, d=degrees: g.run(job, r, d),
                        args.steps, side, guidance)
                    print(f"{label:6} {side:>5} {degrees!s:10} {alone * 1e3:>8.1f} ms "
                          f"{split * 1e3:>8.1f} ms {(split - alone) * 1e3:>+7.1f} ms "
                          f"{float((got - expected).abs().max()):>9.1e}")
                side = 256
                alone, _ = batched(single.batcher, args.steps, side, guidance)
                forwards = group.forwards
                split, _ = batched(group.batcher(ref, constant(degrees), key=degrees),
                                   args.steps, side, guidance)
                print(f"{label:6} {side:>5} {degrees!s:10} {alone * 1e3:>8.1f} ms "
                      f"{split * 1e3:>8.1f} ms {(split - alone) * 1e3:>+7.1f} ms   "
                      f"{BATCH} jobs at once, {group.forwards - forwards} forwards for "
                      f"{BATCH * args.steps} job-steps")
        finally:
            group.close()
    video_rows(args.steps)


VIDEO_SIDE, VIDEO_LATENT_FRAMES, VIDEO_GUIDANCE = 256, 9, 5.0


def make_video_job(steps: int) -> Any:
    from workers.models.wan import engine
    from workers.models.wan.tiny import TEXT_WIDTH
    from workers.sampling import SampleJob

    sigmas, timesteps = engine.schedule(steps, VIDEO_SIDE, VIDEO_SIDE)
    generator = torch.Generator("cpu").manual_seed(3)
    latent = VIDEO_SIDE // 8
    return SampleJob(
        latents=torch.randn(1, 16, VIDEO_LATENT_FRAMES, latent, latent, generator=generator),
        sigmas=sigmas, timesteps=timesteps,
        positive=torch.randn(512, TEXT_WIDTH, generator=generator),
        negative=torch.randn(512, TEXT_WIDTH, generator=generator), guidance=VIDEO_GUIDANCE)


def video_per_step(run: Any, steps: int) -> tuple[float, Any]:
    return best_per_step(run, make_video_job, steps)


def video_rows(steps: int) -> None:
    """The tiny Wan transformer on one clip: one process vs a group of 2, per split."""
    from workers.device.policy import DevicePolicy
    from workers.models.wan.loading import load_diffusion_model
    from workers.models.wan.tiny import write_smoke_stack
    from workers.parallel.config import Degrees
    from workers.parallel.group import WorkerGroup
    from workers.parallel.protocol import ModelRef

    models_dir = Path(tempfile.mkdtemp(prefix="bench-parallel-wan-"))
    name = write_smoke_stack(models_dir)["model"]
    single = load_diffusion_model(models_dir, name, DevicePolicy(profile="cpu"))
    ref = ModelRef(str(models_dir), name, "float32")
    frames = (VIDEO_LATENT_FRAMES - 1) * 4 + 1
    print(f"{'video':6} {'clip':>13} {'method':10} {'1 process':>11} {'group of 2':>11} "
          f"{'overhead':>10} {'max |Δ|':>9}")
    alone, expected = video_per_step(single.batcher.run, steps)
    for degrees in (Degrees(ulysses=2), Degrees(cfg=2)):
        group = WorkerGroup(2)
        try:
            group.run(make_video_job(1), ref, degrees)  # start + load: not timed
            split, got = video_per_step(lambda job, g=group, d=degrees: g.run(job, ref, d), steps)
        finally:
            group.close()
        print(f"{'wan':6} {frames:>3}×{VIDEO_SIDE}×{VIDEO_SIDE} {degrees!s:10} "
              f"{alone * 1e3:>8.1f} ms {split * 1e3:>8.1f} ms {(split - alone) * 1e3:>+7.1f} ms "
              f"{float((got - expected).abs().max()):>9.1e}")


FAMILY_SIDE, FAMILY_GUIDANCE = 512, 3.0


def family_rows(family: str, steps: int) -> None:
    """A family's tiny transformer on one 512² image: one process vs a group of 2, per split."""
    import importlib

    from workers.device.policy import DevicePolicy
    from workers.models.families import plugin
    from workers.parallel.config import Degrees
    from workers.parallel.group import WorkerGroup
    from workers.parallel.protocol import ModelRef
    from workers.sampling import SampleJob

    family_plugin, policy = plugin(family), DevicePolicy(profile="cpu")
    models_dir = Path(tempfile.mkdtemp(prefix=f"bench-parallel-{family}-"))
    names = family_plugin.write_tiny_stack(models_dir)
    encoder = family_plugin.load_text_encoder(
        models_dir, [names[k] for k in ("text_encoder", "text_encoder_2") if k in names], policy)
    positive, negative = family_plugin.encode_prompts(encoder, ["a lighthouse at dusk", ""])
    single = family_plugin.load_diffusion_model(models_dir, names["model"], policy)
    ref = ModelRef(str(models_dir), names["model"], "float32")
    latent = importlib.import_module(f"workers.models.{family}").FAMILY.latent
    guidance = 0.0 if family == "flux1" else FAMILY_GUIDANCE

    def make(count: int) -> Any:
        sigmas, timesteps = family_plugin.schedule(count, FAMILY_SIDE, FAMILY_SIDE, 1.0)
        generator = torch.Generator("cpu").manual_seed(3)
        return SampleJob(latents=torch.randn(latent.shape(FAMILY_SIDE, FAMILY_SIDE),
                                             generator=generator),
                         sigmas=sigmas, timesteps=timesteps, positive=positive,
                         negative=negative if guidance else None, guidance=guidance,
                         extra={"guidance": 3.5})

    print(f"{'family':9} {'side':>5} {'method':10} {'1 process':>11} {'group of 2':>11} "
          f"{'overhead':>10} {'max |Δ|':>9}")
    alone, expected = best_per_step(single.batcher.run, make, steps)
    for degrees in (Degrees(ulysses=2), Degrees(cfg=2)):
        group = WorkerGroup(2)
        try:
            split, got = best_per_step(lambda job, g=group, d=degrees: g.run(job, ref, d),
                                       make, steps)
        finally:
            group.close()
        print(f"{family:9} {FAMILY_SIDE:>5} {degrees!s:10} {alone * 1e3:>8.1f} ms "
              f"{split * 1e3:>8.1f} ms {(split - alone) * 1e3:>+7.1f} ms "
              f"{float((got - expected).abs().max()):>9.1e}")


if __name__ == "__main__":
    main()
