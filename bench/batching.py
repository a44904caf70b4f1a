"""Cross-run batching: images/s of the farm with slots vs one slot vs diffusers' list-batched call.

One run prints a table, for 1, 4 and 16 concurrent requests, on two random-weight Z-Image stacks:
the tiny smoke stack and a mid-size transformer (bench/_mid.py, ~18 M parameters: what this CPU
renders in seconds) with the tiny VAE and text encoder.
  - farm batched : one worker with 16 slots; N runs submitted together over /v1 (different
                   prompts and seeds), until every run's websocket says `run_done` (a poll
                   loop would take the CPU being measured);
  - farm 1 slot  : the same farm, one worker with one slot (what the farm did before slots);
  - diffusers    : ZImagePipeline called once with the list of N prompts (one generator each);
  - sampler alone: the farm's StepBatcher + predict_velocity with N threads (one SampleJob each)
                   vs the pipeline's own transformer loop (prompt_embeds list, latents out).
Targets (issue 8): at 16, farm batched ≥ 2× farm 1 slot on the tiny stack; sampler ≥ 0.95×
the pipeline's loop. What batching can give at all is printed beside them: diffusers' own list
call at 16 vs at 1 (on a CPU the VAE decode costs the same per image in any batch).
The `sdxl` rows (issue 41): the same sampler-alone comparison for SDXL on a mid-size random UNet
(SDXL_MID, ~30 M parameters, 128², CFG on: each job's negative and positive in the forward):
the step batcher + sdxl.engine.predict / advance with N threads vs StableDiffusionXLPipeline
called once with the N prompts' embeddings (its own UNet + EulerDiscrete loop). Target ≥ 0.95×.
The batcher runs twice: under the CPU policy's bounds (16 items: 16 CFG jobs are 32, so two
forwards a step) and bounded at the pipeline's own batch (2N items: one forward a step).

A row per other family (issue 41), in process: the farm's step batcher with N threads (one
SampleJob each, the family's `predict`) vs that family's diffusers pipeline called once with
the list of N prompts' embeds (latents out), on a mid-size random stack. Target ≥ 0.95×.
  - flux1: FluxPipeline, a ~14 M-parameter FluxTransformer2DModel (2 double + 4 single blocks,
           width 384) with the tiny CLIP-L / T5 / VAE, 128², guidance 3.5.
  - qwenimage: QwenImagePipeline, a ~16 M-parameter QwenImageTransformer2DModel (4 blocks,
           width 384) with the tiny Qwen2.5-VL, 128², true CFG (scale 4) with the empty negative.
  - flux2: Flux2KleinPipeline, a ~15 M-parameter Flux2Transformer2DModel (2 double + 4 single
           blocks, width 384) with the tiny Qwen3 / VAE, 128², no CFG.
  - qwen-edit: QwenImageEditPipeline (Edit Plus takes one prompt a call: no list call) with the
           qwenimage row's transformer and one 128² reference image (its VAE encode timed and
           left out; the pipeline's 1 MP reference area patched to 128²), no CFG.
  - wan: WanPipeline, a ~10 M-parameter WanTransformer3DModel (4 blocks, width 384) with the
           tiny UMT5 / VAE, 9 frames of 96², CFG 5 with the empty negative (rates in clips/s).
  - krea2: Krea2Pipeline, a ~15 M-parameter Krea2Transformer2DModel (4 blocks, width 384, GQA)
           with the tiny Qwen3-VL, 128² (64 image tokens beside the fixed 512 text tokens), CFG
           3.5 with the empty negative.
  - qwenimage21: QwenImage21Pipeline without its KV cache (the call the farm is bit-identical
           to), a ~16.5 M-parameter QwenImage21Transformer2DModel (8 single-stream blocks,
           width 384) with the tiny Qwen3-VL, 128², no CFG; prompts of one token count (2.1's
           runs share a forward only then).
  - wan-ti2v: the same as Wan 2.2 TI2V-5B (48 channels in and out, the tiny Wan 2.2 VAE's ÷16,
           9 frames of 192²: the wan row's tokens), WanPipeline with `expand_timesteps`: a
           timestep per token, per row in the farm's shared forward.

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/batching.py [--steps 8]
The `lora` row (issue 35): 16 concurrent FLUX.1 runs (mid-size stack) through the step batcher,
each with its own LoRA vs all sharing one (and vs none). Target ≥ 0.8×.

    .venv/bin/python bench/batching.py --family FAMILY
      (flux1|flux2|qwenimage|qwenimage21|qwen-edit|wan|wan-ti2v|krea2|sdxl|lora)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._farm import all_at_once, bench_farm, wait_for_model, wait_run_done  # after sys.path
from bench._mid import mid_transformer, write_mid

CONCURRENCY = (1, 4, 16)
REPEAT = 3
MID_NAME = "zimage-MID-random-weights"
STACKS = {"tiny": 256, "mid": 128}  # stack → image side (px)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--family", choices=sorted([*FAMILY_ROWS, "sdxl", "lora"]),
                        help="only this family's rows (in process: no farm); lora: the "
                        "mixed-LoRA row")
    args = parser.parse_args()
    if args.family == "lora":
        print_lora_row(lora_row(args.steps))
        return
    if args.family == "sdxl":
        print_sdxl(sdxl_rows(args.steps), args.steps)
        return
    if args.family:
        print_family_row(args.family, FAMILY_ROWS[args.family](args.steps))
        return
    results: dict[tuple[str, str, int], float] = {}
    for label, slots in (("farm batched", 16), ("farm 1 slot", 1)):
        with bench_farm(slots=slots) as (farm, token, models_dir):
            names = write_stacks(models_dir)
            client = httpx.Client(base_url=farm.url, timeout=120,
                                  headers={"Authorization": f"Bearer {token}"})
            wait_for_model(client, names["mid"]["model"])
            for stack, side in STACKS.items():
                farm_burst(client, names[stack], side, args.steps, 1, seed=90_000)  # warm
                for n in CONCURRENCY:
                    results[(stack, label, n)] = farm_burst(client, names[stack], side,
                                                            args.steps, n, seed=1000 * n)
    for stack, side in STACKS.items():
        pipe = pipeline(stack)
        pipe_burst(pipe, side, args.steps, 1)  # warm
        sampler_alone(pipe, side, args.steps, 1)  # warm
        for n in CONCURRENCY:  # in process: the best of REPEAT (this machine is shared)
            results[(stack, "diffusers list", n)] = max(
                pipe_burst(pipe, side, args.steps, n) for _ in range(REPEAT))
            pairs = [sampler_alone(pipe, side, args.steps, n) for _ in range(REPEAT)]
            results[(stack, "pipeline loop", n)] = max(loop for loop, _ in pairs)
            results[(stack, "farm sampler", n)] = max(sampler for _, sampler in pairs)
    print_table(results, args.steps)
    for family, row in FAMILY_ROWS.items():
        print_family_row(family, row(args.steps))
    print_sdxl(sdxl_rows(args.steps), args.steps)
    print_lora_row(lora_row(args.steps))


# --- the stacks ---------------------------------------------------------------------------------


def write_stacks(models_dir: Path) -> dict[str, dict[str, str]]:
    """The smoke stack, and the mid-size transformer beside it (same VAE and text encoder)."""
    from workers.models.zimage.tiny import write_smoke_stack

    tiny = write_smoke_stack(models_dir)
    return {"tiny": tiny, "mid": {**tiny, "model": write_mid(models_dir, MID_NAME)}}


def pipeline(stack: str) -> Any:
    from diffusers import ZImagePipeline

    from workers.models.zimage.tiny import build_tiny_components

    parts = build_tiny_components(0)
    if stack == "mid":
        parts["transformer"] = mid_transformer()
    pipe: Any = ZImagePipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def prompts(n: int) -> list[str]:
    return [f"a lighthouse at dusk, study {i}" for i in range(n)]


# --- the farm -------------------------------------------------------------------------------------


def farm_burst(client: httpx.Client, names: dict[str, str], side: int, steps: int, n: int,
               seed: int) -> float:
    """Submit n runs together; images/s until the last one is done."""
    start = time.perf_counter()
    ids = []
    for i, prompt in enumerate(prompts(n)):
        params = {"prompt": prompt, "width": side, "height": side, "steps": steps,
                  "seed": seed + i, **names}
        body = {"graph": {"nodes": {
            "gen": {"type": "zimage/turbo", "params": params},
            "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}},
        }}, "target": "out"}
        ids.append(client.post("/v1/runs", json=body).raise_for_status().json()["runId"])
    for run_id in ids:  # followed over its websocket: polling would take the CPU it measures
        done = wait_run_done(client, run_id)
        if done["status"] != "succeeded":
            raise SystemExit(f"run failed: {done['error']}")
    return n / (time.perf_counter() - start)


# --- in process -----------------------------------------------------------------------------------


def pipe_burst(pipe: Any, side: int, steps: int, n: int) -> float:
    """ZImagePipeline once with the list of n prompts (PIL images out); images/s."""
    start = time.perf_counter()
    pipe(prompts(n), width=side, height=side, num_inference_steps=steps, guidance_scale=0.0,
         generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
    return n / (time.perf_counter() - start)


def sampler_alone(pipe: Any, side: int, steps: int, n: int) -> tuple[float, float]:
    """images/s of the denoise only: the pipeline's transformer loop over n caption embeds vs the
    farm's step batcher with n threads (the same embeds, sigmas and noise)."""
    from workers.device.policy import DevicePolicy
    from workers.models.values import TextEncoder
    from workers.models.zimage import engine
    from workers.sampling import SampleJob, StepBatcher

    encoder = TextEncoder("te", "", pipe.text_encoder, pipe.tokenizer,
                          DevicePolicy(profile="cpu").placement("text-encoder"))
    captions = engine.encode_prompts(encoder, prompts(n))
    start = time.perf_counter()
    pipe(prompt_embeds=captions, width=side, height=side, num_inference_steps=steps,
         guidance_scale=0.0, output_type="latent",
         generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
    loop = n / (time.perf_counter() - start)

    bounds = DevicePolicy(profile="cpu").batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict_velocity(pipe.transformer, jobs),
                          bounds.items, bounds.tokens)
    sigmas, timesteps = engine.sigma_schedule(steps, side, side)
    jobs = [SampleJob(engine.noise(engine.latent_shape(side, side),
                                   torch.Generator("cpu").manual_seed(i), "cpu"),
                      sigmas, timesteps, captions[i]) for i in range(n)]
    return loop, n / all_at_once(batcher.run, jobs)


def print_table(results: dict[tuple[str, str, int], float], steps: int) -> None:
    print(f"\nbench/batching: images/s, {steps} steps, CPU ({torch.get_num_threads()} threads); "
          f"tiny {STACKS['tiny']}², mid {STACKS['mid']}² (~18 M-param transformer)")
    rows = ("farm batched", "farm 1 slot", "diffusers list", "farm sampler", "pipeline loop")
    header = f"  {'stack':6} {'':16}" + "".join(f"{f'{n} concurrent':>15}" for n in CONCURRENCY)
    print(header)
    for stack in STACKS:
        for row in rows:
            cells = "".join(f"{results[(stack, row, n)]:15.2f}" for n in CONCURRENCY)
            print(f"  {stack:6} {row:16}{cells}")
        at16 = {row: results[(stack, row, 16)] for row in rows}
        print(f"  {stack:6} at 16: batched / 1 slot = "
              f"{at16['farm batched'] / at16['farm 1 slot']:.2f}x, sampler / pipeline loop = "
              f"{at16['farm sampler'] / at16['pipeline loop']:.2f}x, batched / diffusers list = "
              f"{at16['farm batched'] / at16['diffusers list']:.2f}x")
        bound = results[(stack, "diffusers list", 16)] / results[(stack, "diffusers list", 1)]
        print(f"  {stack:6} what batching can give here: diffusers list at 16 / at 1 = {bound:.2f}x "
              "(the VAE decode is linear in the batch on a CPU)")


# --- SDXL ----------------------------------------------------------------------------------------

SDXL_SIDE, SDXL_GUIDANCE = 128, 4.0  # the farm's guidance 4: the pipeline's scale 5
SDXL_MID: dict[str, Any] = {"block_out_channels": [128, 256], "attention_head_dim": [4, 8]}
SDXL_ROWS = ("pipeline loop", "farm sampler", "sampler 2N items")
SDXL_CPU = tuple(f"{row}, CPU" for row in SDXL_ROWS)  # images per CPU-second of this process


def sdxl_pipeline() -> Any:
    """StableDiffusionXLPipeline on the tiny stack's encoders and VAE with a mid-size UNet."""
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel

    from workers.models.sdxl.tiny import UNET_CONFIG, build_tiny_components

    parts = build_tiny_components(0)
    torch.manual_seed(0)
    unet: Any = UNet2DConditionModel(**{**UNET_CONFIG, **SDXL_MID})
    parts["unet"] = unet.eval()
    pipe: Any = StableDiffusionXLPipeline(**parts, add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sdxl_rows(steps: int) -> dict[tuple[str, int], float]:
    pipe = sdxl_pipeline()
    params = sum(p.numel() for p in pipe.unet.parameters()) / 1e6
    print(f"sdxl: mid-size UNet {params:.1f} M parameters")
    sdxl_sampler_alone(pipe, steps, 1)  # warm
    results: dict[tuple[str, int], float] = {}
    for n in CONCURRENCY:  # the best of REPEAT (this machine is shared)
        runs = [sdxl_sampler_alone(pipe, steps, n) for _ in range(REPEAT)]
        for index, row in enumerate(SDXL_ROWS + SDXL_CPU):
            results[(row, n)] = max(run[index] for run in runs)
    return results


def sdxl_sampler_alone(pipe: Any, steps: int, n: int) -> tuple[float, ...]:
    """images/s of the denoise only: the pipeline's loop over n prompts' embeddings (CFG, a
    generator each, latents out) vs the farm's step batcher with n threads (the same embeddings,
    sigmas and noise); then the same three as images per CPU-second of this process (steadier
    than wall time while other processes share the CPU)."""
    from workers.device.policy import DevicePolicy
    from workers.models.sdxl import LATENT, engine
    from workers.models.values import TextEncoder
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob, StepBatcher

    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", (pipe.text_encoder, pipe.text_encoder_2),
                          (pipe.tokenizer, pipe.tokenizer_2), policy.placement("text-encoder"))
    positive, negative = engine.encode_prompts(encoder, prompts(n)), engine.encode_prompts(
        encoder, [""] * n)
    start, cpu = time.perf_counter(), time.process_time()
    pipe(prompt_embeds=torch.stack([p.embeds for p in positive]),
         pooled_prompt_embeds=torch.stack([p.pooled for p in positive]),
         negative_prompt_embeds=torch.stack([p.embeds for p in negative]),
         negative_pooled_prompt_embeds=torch.stack([p.pooled for p in negative]),
         width=SDXL_SIDE, height=SDXL_SIDE, num_inference_steps=steps,
         guidance_scale=SDXL_GUIDANCE + 1, output_type="latent",
         generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
    loop, loop_cpu = n / (time.perf_counter() - start), n / (time.process_time() - cpu)

    sigmas, timesteps = engine.schedule(steps, SDXL_SIDE, SDXL_SIDE)
    shape = LATENT.shape(SDXL_SIDE, SDXL_SIDE)
    bounds, rates, cpu_rates = policy.batch_bounds(), [], []
    for items in (bounds.items, max(bounds.items, 2 * n)):
        batcher = StepBatcher(lambda jobs: engine.predict(pipe.unet, jobs), items, bounds.tokens)
        jobs = [SampleJob(engine.init_noise(noise(shape, torch.Generator("cpu").manual_seed(i),
                                                  "cpu"), sigmas),
                          sigmas, timesteps, positive[i], negative=negative[i],
                          guidance=SDXL_GUIDANCE, advance=engine.advance) for i in range(n)]
        cpu = time.process_time()
        rates.append(n / all_at_once(batcher.run, jobs))
        cpu_rates.append(n / (time.process_time() - cpu))
    return loop, rates[0], rates[1], loop_cpu, cpu_rates[0], cpu_rates[1]


def print_sdxl(results: dict[tuple[str, int], float], steps: int) -> None:
    print(f"\nbench/batching sdxl: images/s of the denoise, {steps} steps, {SDXL_SIDE}², CFG, CPU "
          f"({torch.get_num_threads()} threads)")
    print(f"  {'':21}" + "".join(f"{f'{n} concurrent':>15}" for n in CONCURRENCY))
    for row in SDXL_ROWS + SDXL_CPU:
        print(f"  {row:21}" + "".join(f"{results[(row, n)]:15.2f}" for n in CONCURRENCY))
    for rows in (SDXL_ROWS, SDXL_CPU):
        for row in rows[1:]:
            ratios = ", ".join(f"{n}: {results[(row, n)] / results[(rows[0], n)]:.2f}x"
                               for n in CONCURRENCY)
            print(f"  {row} / {rows[0]}: {ratios} (target ≥ 0.95x)")


# --- a row per family -----------------------------------------------------------------------------

FLUX_MID: dict[str, Any] = {  # head dim 64 = sum(axes); text widths = the tiny encoders'
    "patch_size": 1, "in_channels": 64, "num_layers": 2, "num_single_layers": 4,
    "attention_head_dim": 64, "num_attention_heads": 6, "joint_attention_dim": 32,
    "pooled_projection_dim": 32, "guidance_embeds": True, "axes_dims_rope": [16, 24, 24],
}
FLUX_SIDE, FLUX_GUIDANCE = 128, 3.5


def flux1_row(steps: int) -> dict[int, tuple[float, float]]:
    """n → (FluxPipeline with the list of n prompts' embeds, the farm's step batcher) images/s,
    the best of REPEAT alternating runs each; denoise only (latents out), the same embeds,
    sigmas and guidance."""
    from diffusers import FluxPipeline, FluxTransformer2DModel

    from workers.device.policy import DevicePolicy
    from workers.models.flux1 import LATENT, engine
    from workers.models.flux1.tiny import build_tiny_components
    from workers.models.values import TextEncoder
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob, StepBatcher

    parts = build_tiny_components(0)
    torch.manual_seed(0)
    parts["transformer"] = FluxTransformer2DModel.from_config(FLUX_MID).eval()
    pipe: Any = FluxPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", (pipe.text_encoder, pipe.text_encoder_2),
                          (pipe.tokenizer, pipe.tokenizer_2), policy.placement("text-encoder"))
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict(pipe.transformer, jobs), bounds.items,
                          bounds.tokens)
    sigmas, timesteps = engine.schedule(steps, FLUX_SIDE, FLUX_SIDE)

    def pipeline(n: int) -> float:
        conds = engine.encode_prompts(encoder, prompts(n))
        start = time.perf_counter()
        pipe(prompt_embeds=torch.stack([c.embeds for c in conds]),
             pooled_prompt_embeds=torch.stack([c.pooled for c in conds]), width=FLUX_SIDE,
             height=FLUX_SIDE, num_inference_steps=steps, guidance_scale=FLUX_GUIDANCE,
             output_type="latent",
             generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        return n / (time.perf_counter() - start)

    def sampler(n: int) -> float:
        conds = engine.encode_prompts(encoder, prompts(n))
        jobs = [SampleJob(noise(LATENT.shape(FLUX_SIDE, FLUX_SIDE),
                                torch.Generator("cpu").manual_seed(i), "cpu"),
                          sigmas, timesteps, conds[i], extra={"guidance": FLUX_GUIDANCE})
                for i in range(n)]
        return n / all_at_once(batcher.run, jobs)

    return _alternating(pipeline, sampler)


QWEN_MID: dict[str, Any] = {  # ~16 M parameters: 4 blocks of width 384, the tiny encoder's 16
    "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 4,
    "attention_head_dim": 64, "num_attention_heads": 6, "joint_attention_dim": 16,
    "guidance_embeds": False, "axes_dims_rope": [16, 24, 24],
}
QWEN_SIDE, QWEN_GUIDANCE = 128, 3.0  # the farm's g: the pipeline's true_cfg_scale g + 1


def qwenimage_row(steps: int) -> dict[int, tuple[float, float]]:
    """n → (QwenImagePipeline with the n prompts' embeds and masks and the empty negative's,
    true CFG on; the farm's step batcher: each job's two rows in the shared forward, prompts
    padded under the mask) images/s, the best of REPEAT alternating runs each; denoise only."""
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel
    from diffusers.utils import logging as diffusers_logging

    from workers.device.policy import DevicePolicy
    from workers.models.qwenimage import LATENT, engine
    from workers.models.qwenimage.tiny import build_tiny_components
    from workers.models.values import TextEncoder
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob, StepBatcher

    diffusers_logging.set_verbosity_error()  # its "no mask given" note when a batch needs none
    parts = build_tiny_components(0)
    torch.manual_seed(0)
    parts["transformer"] = QwenImageTransformer2DModel.from_config(QWEN_MID).eval()
    pipe: Any = QwenImagePipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", pipe.text_encoder, pipe.tokenizer,
                          policy.placement("text-encoder"))
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict(pipe.transformer, jobs), bounds.items,
                          bounds.tokens)
    sigmas, timesteps = engine.schedule(steps, QWEN_SIDE, QWEN_SIDE)

    def pipeline(n: int) -> float:
        embeds, mask = pipe.encode_prompt(prompts(n))
        negative, negative_mask = pipe.encode_prompt([""] * n)
        start = time.perf_counter()
        pipe(prompt_embeds=embeds, prompt_embeds_mask=mask, negative_prompt_embeds=negative,
             negative_prompt_embeds_mask=negative_mask, true_cfg_scale=QWEN_GUIDANCE + 1,
             width=QWEN_SIDE, height=QWEN_SIDE, num_inference_steps=steps, output_type="latent",
             generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        return n / (time.perf_counter() - start)

    def sampler(n: int) -> float:
        conds = engine.encode_prompts(encoder, prompts(n))
        [empty] = engine.encode_prompts(encoder, [""])
        jobs = [SampleJob(noise(LATENT.shape(QWEN_SIDE, QWEN_SIDE),
                                torch.Generator("cpu").manual_seed(i), "cpu"),
                          sigmas, timesteps, conds[i], negative=empty, guidance=QWEN_GUIDANCE)
                for i in range(n)]
        return n / all_at_once(batcher.run, jobs)

    return _alternating(pipeline, sampler)


FLUX2_MID: dict[str, Any] = {  # ~15 M parameters: 2 double + 4 single blocks of width 384
    "patch_size": 1, "in_channels": 128, "num_layers": 2, "num_single_layers": 4,
    "attention_head_dim": 64, "num_attention_heads": 6, "joint_attention_dim": 48,
    "timestep_guidance_channels": 256, "axes_dims_rope": [16, 16, 16, 16],
    "guidance_embeds": False,
}
FLUX2_SIDE = 128


def flux2_row(steps: int) -> dict[int, tuple[float, float]]:
    """n → (Flux2KleinPipeline with the list of n prompts' embeds, the farm's step batcher)
    images/s, the best of REPEAT alternating runs each; denoise only, no CFG (the pipeline's
    scale 1, the farm's g 0: one row a job on both sides)."""
    from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel

    from workers.models.flux2 import LATENT, engine
    from workers.models.flux2.tiny import build_tiny_components

    parts = build_tiny_components(0)
    torch.manual_seed(0)
    parts["transformer"] = Flux2Transformer2DModel.from_config(FLUX2_MID).eval()
    pipe: Any = Flux2KleinPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    encoder, batcher = _encoder_and_batcher(pipe, engine)
    sigmas, timesteps = engine.schedule(steps, FLUX2_SIDE, FLUX2_SIDE)

    def pipeline(n: int) -> float:
        conds = engine.encode_prompts(encoder, prompts(n))
        start = time.perf_counter()
        pipe(prompt_embeds=torch.stack([c.embeds for c in conds]), width=FLUX2_SIDE,
             height=FLUX2_SIDE, num_inference_steps=steps, guidance_scale=1.0,
             output_type="latent",
             generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        return n / (time.perf_counter() - start)

    def sampler(n: int) -> float:
        conds = engine.encode_prompts(encoder, prompts(n))
        jobs = [_job(LATENT.shape(FLUX2_SIDE, FLUX2_SIDE), i, sigmas, timesteps, conds[i])
                for i in range(n)]
        return n / all_at_once(batcher.run, jobs)

    return _alternating(pipeline, sampler)


EDIT_SIDE = 128  # the image and, patched into the pipeline, its reference's size (not 1 MP)


def qwen_edit_row(steps: int) -> dict[int, tuple[float, float]]:
    """n → (QwenImageEditPipeline with n prompts' embeds and its one reference image, the farm's
    step batcher over n jobs with that reference latent) images/s, the best of REPEAT
    alternating runs each; denoise only: the pipeline's VAE encode of the reference is timed
    and left out (the farm's is done before), no CFG. (QwenImageEditPlusPipeline takes one
    prompt a call: no list call to compare with.)"""
    from diffusers import QwenImageEditPipeline, QwenImageTransformer2DModel
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit
    from diffusers.utils import logging as diffusers_logging
    from PIL import Image

    from workers.models.qwenimage import LATENT, engine, vl
    from workers.models.qwenimage.tiny import build_tiny_components, tiny_processor
    from workers.models.values import Vae

    diffusers_logging.set_verbosity_error()
    area = EDIT_SIDE * EDIT_SIDE
    original = edit.calculate_dimensions
    edit.calculate_dimensions = lambda _, ratio: original(area, ratio)  # the pipeline's 1 MP
    parts = build_tiny_components(0)
    torch.manual_seed(0)
    parts["transformer"] = QwenImageTransformer2DModel.from_config(QWEN_MID).eval()
    pipe: Any = QwenImageEditPipeline(processor=tiny_processor(parts["tokenizer"]), **parts)
    pipe.set_progress_bar_config(disable=True)
    encoder, batcher = _encoder_and_batcher(pipe, engine)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (EDIT_SIDE, EDIT_SIDE, 3),
                                                             dtype=np.uint8))
    vae = Vae("vae", "", pipe.vae, encoder.placement)
    reference = vl.encode_reference(vae, image, area)
    shown = vl.condition_images([image], "edit", area)
    sigmas, timesteps = engine.schedule(steps, EDIT_SIDE, EDIT_SIDE)
    encoding = [0.0]
    encode = pipe.vae.encode

    def timed_encode(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return encode(*args, **kwargs)
        finally:
            encoding[0] += time.perf_counter() - start

    pipe.vae.encode = timed_encode

    def embeds(n: int) -> list[Any]:
        return [vl.encode_prompt(pipe.text_encoder, pipe.processor, text, shown, "edit", "cpu")
                for text in prompts(n)]

    def pipeline(n: int) -> float:
        rows = embeds(n)
        longest = max(e.shape[0] for e in rows)
        stacked = torch.stack([torch.cat([e, e.new_zeros(longest - e.shape[0], e.shape[1])])
                               for e in rows])
        mask = torch.stack([torch.arange(longest) < e.shape[0] for e in rows]).long()
        encoding[0] = 0.0
        start = time.perf_counter()
        pipe(image=image, prompt_embeds=stacked, prompt_embeds_mask=mask, width=EDIT_SIDE,
             height=EDIT_SIDE, num_inference_steps=steps, output_type="latent",
             generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        return n / (time.perf_counter() - start - encoding[0])

    def sampler(n: int) -> float:
        jobs = [_job(LATENT.shape(EDIT_SIDE, EDIT_SIDE), i, sigmas, timesteps,
                     engine.QwenPrompt(e, (reference,))) for i, e in enumerate(embeds(n))]
        return n / all_at_once(batcher.run, jobs)

    return _alternating(pipeline, sampler)


def _encoder_and_batcher(pipe: Any, engine: Any) -> tuple[Any, Any]:
    from workers.device.policy import DevicePolicy
    from workers.models.values import TextEncoder
    from workers.sampling import StepBatcher

    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", pipe.text_encoder, pipe.tokenizer,
                          policy.placement("text-encoder"))
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict(pipe.transformer, jobs), bounds.items,
                          bounds.tokens)
    return encoder, batcher


def _job(shape: tuple[int, ...], seed: int, sigmas: Any, timesteps: Any, positive: Any) -> Any:
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    return SampleJob(noise(shape, torch.Generator("cpu").manual_seed(seed), "cpu"), sigmas,
                     timesteps, positive)


def _alternating(pipeline: Any, sampler: Any) -> dict[int, tuple[float, float]]:
    with torch.no_grad():
        pipeline(1), sampler(1)  # warm
        row = {}
        for n in CONCURRENCY:  # alternating, the best of REPEAT each: the machine is shared
            pairs = [(pipeline(n), sampler(n)) for _ in range(REPEAT)]
            row[n] = (max(p for p, _ in pairs), max(s for _, s in pairs))
        return row


WAN_MID: dict[str, Any] = {"patch_size": [1, 2, 2], "num_attention_heads": 6,
                           "attention_head_dim": 64, "in_channels": 16, "out_channels": 16,
                           "text_dim": 32, "freq_dim": 256, "ffn_dim": 1536, "num_layers": 4,
                           "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
                           "rope_max_seq_len": 1024}
WAN_SIDE, WAN_FRAMES, WAN_GUIDANCE = 96, 9, 5.0


def wan_row(steps: int, ti2v: bool = False) -> dict[int, tuple[float, float]]:
    """n → (WanPipeline with the n prompts' embeds and the empty negative's, CFG on; the
    farm's step batcher: each job's two rows in the shared forward) clips/s, the best of REPEAT
    alternating runs each; denoise only (latents out). `ti2v`: TI2V-5B's 48 channels at ÷16
    (twice the side: the same tokens) with per-token timesteps on both sides."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from workers.device.policy import DevicePolicy
    from workers.models.values import TextEncoder
    from workers.models.wan import LATENT, LATENT_22, engine, latent_frames
    from workers.models.wan.tiny import build_tiny_components
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob, StepBatcher

    parts = build_tiny_components(0)
    torch.manual_seed(0)
    fmt = LATENT_22 if ti2v else LATENT
    config = {**WAN_MID, "in_channels": fmt.channels, "out_channels": fmt.channels}
    transformer = WanTransformer3DModel.from_config(config).eval()
    side_px = WAN_SIDE * fmt.downscale // LATENT.downscale
    pipe: Any = WanPipeline(transformer=transformer, vae=parts["vae_22" if ti2v else "vae"],
                            expand_timesteps=ti2v,
                            **{k: parts[k] for k in ("tokenizer", "text_encoder", "scheduler")})
    pipe.set_progress_bar_config(disable=True)
    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", pipe.text_encoder, pipe.tokenizer,
                          policy.placement("text-encoder"))
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict(transformer, jobs), bounds.items,
                          bounds.tokens)
    sigmas, timesteps = engine.schedule(steps, side_px, side_px)
    side = side_px // fmt.downscale
    shape = (1, fmt.channels, latent_frames(WAN_FRAMES), side, side)

    def pipeline(n: int) -> float:
        embeds, negative = pipe.encode_prompt(prompts(n), [""] * n, max_sequence_length=512)
        start = time.perf_counter()
        pipe(prompt_embeds=embeds, negative_prompt_embeds=negative, guidance_scale=WAN_GUIDANCE,
             width=side_px, height=side_px, num_frames=WAN_FRAMES, num_inference_steps=steps,
             output_type="latent",
             generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        return n / (time.perf_counter() - start)

    def sampler(n: int) -> float:
        conds = engine.encode_prompts(encoder, prompts(n))
        [empty] = engine.encode_prompts(encoder, [""])
        jobs = [SampleJob(noise(shape, torch.Generator("cpu").manual_seed(i), "cpu"), sigmas,
                          timesteps, conds[i], negative=empty, guidance=WAN_GUIDANCE)
                for i in range(n)]
        return n / all_at_once(batcher.run, jobs)

    with torch.no_grad():
        pipeline(1), sampler(1)  # warm
        row = {}
        for n in CONCURRENCY:  # alternating, the best of REPEAT each: the machine is shared
            pairs = [(pipeline(n), sampler(n)) for _ in range(REPEAT)]
            row[n] = (max(p for p, _ in pairs), max(s for _, s in pairs))
        return row


KREA2_MID: dict[str, Any] = {  # ~15 M parameters: 4 blocks of width 384 (GQA 6/2 heads)
    "in_channels": 64, "num_layers": 4, "attention_head_dim": 64, "num_attention_heads": 6,
    "num_key_value_heads": 2, "intermediate_size": 1024, "timestep_embed_dim": 256,
    "text_hidden_dim": 16, "num_text_layers": 2, "text_num_attention_heads": 2,
    "text_num_key_value_heads": 2, "text_intermediate_size": 32, "num_layerwise_text_blocks": 2,
    "num_refiner_text_blocks": 2, "axes_dims_rope": [16, 24, 24],
}
KREA2_SIDE, KREA2_GUIDANCE = 128, 3.5  # the pipeline's guidance_scale is the farm's g


def krea2_row(steps: int) -> dict[int, tuple[float, float]]:
    """n → (Krea2Pipeline with the n prompts' tapped states and masks and the empty
    negative's, CFG on; the farm's step batcher: each job's two rows in the shared forward)
    images/s, the best of REPEAT alternating runs each; denoise only (512 text tokens a row)."""
    from diffusers import Krea2Pipeline
    from diffusers.models import Krea2Transformer2DModel

    from workers.device.policy import DevicePolicy
    from workers.models.krea2 import LATENT, engine
    from workers.models.krea2.tiny import build_tiny_components
    from workers.models.values import TextEncoder
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob, StepBatcher

    parts = build_tiny_components(0)
    torch.manual_seed(0)
    parts["transformer"] = Krea2Transformer2DModel.from_config(KREA2_MID).eval()
    pipe: Any = Krea2Pipeline(**parts, text_encoder_select_layers=engine.taps(parts["text_encoder"]))
    pipe.set_progress_bar_config(disable=True)
    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", pipe.text_encoder, pipe.tokenizer,
                          policy.placement("text-encoder"))
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict(pipe.transformer, jobs), bounds.items,
                          bounds.tokens)
    sigmas, timesteps = engine.schedule(steps, KREA2_SIDE, KREA2_SIDE)

    def pipeline(n: int) -> float:
        embeds, mask = pipe.encode_prompt(prompts(n))
        negative, negative_mask = pipe.encode_prompt([""] * n)
        start = time.perf_counter()
        pipe(prompt_embeds=embeds, prompt_embeds_mask=mask, negative_prompt_embeds=negative,
             negative_prompt_embeds_mask=negative_mask, guidance_scale=KREA2_GUIDANCE,
             width=KREA2_SIDE, height=KREA2_SIDE, num_inference_steps=steps, output_type="latent",
             generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        return n / (time.perf_counter() - start)

    def sampler(n: int) -> float:
        conds = engine.encode_prompts(encoder, prompts(n))
        [empty] = engine.encode_prompts(encoder, [""])
        jobs = [SampleJob(noise(LATENT.shape(KREA2_SIDE, KREA2_SIDE),
                                torch.Generator("cpu").manual_seed(i), "cpu"),
                          sigmas, timesteps, conds[i], negative=empty, guidance=KREA2_GUIDANCE)
                for i in range(n)]
        return n / all_at_once(batcher.run, jobs)

    return _alternating(pipeline, sampler)


QWEN21_MID: dict[str, Any] = {  # ~16.5 M parameters: 8 single-stream blocks of width 384
    "num_layers": 8, "attention_head_dim": 64, "num_attention_heads": 6, "context_in_dim": 16,
    "axes_dims_rope": [16, 24, 24],
}
QWEN21_SIDE = 128  # 8×8 latent tokens at ÷16


def qwen21_prompts(n: int) -> list[str]:
    """n prompts of one token count: 2.1's runs share a forward only at one prompt length (a
    shorter one padded would move the image's rotary positions), so the row measures that."""
    return [f"a lighthouse at dusk, study {i:02d}" for i in range(n)]


def qwenimage21_row(steps: int) -> dict[int, tuple[float, float]]:
    """n → (QwenImage21Pipeline without its KV cache — the call the farm is bit-identical to —
    with the n prompts' embeds, the farm's step batcher) images/s, the best of REPEAT
    alternating runs each; denoise only, no CFG (2.1 is sampled without: the farm's g 0)."""
    from diffusers import QwenImage21Pipeline, QwenImage21Transformer2DModel

    from workers.device.policy import DevicePolicy
    from workers.models.qwenimage21 import LATENT, engine
    from workers.models.qwenimage21.engine import Tokenizers
    from workers.models.qwenimage21.tiny import build_tiny_components
    from workers.models.values import TextEncoder
    from workers.sampling import StepBatcher

    parts = build_tiny_components(0)
    torch.manual_seed(0)
    transformer: Any = QwenImage21Transformer2DModel(**QWEN21_MID)
    parts["transformer"] = transformer.eval()
    pipe: Any = QwenImage21Pipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", pipe.text_encoder,
                          Tokenizers(pipe.processor.tokenizer, pipe.processor, Path(".")),
                          policy.placement("text-encoder"))
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict(pipe.transformer, jobs), bounds.items,
                          bounds.tokens)
    sigmas, timesteps = engine.schedule(steps, QWEN21_SIDE, QWEN21_SIDE)

    def pipeline(n: int) -> float:
        conds = engine.encode_prompts(encoder, qwen21_prompts(n))
        start = time.perf_counter()
        pipe(prompt_embeds=torch.stack([c.embeds for c in conds]), width=QWEN21_SIDE,
             height=QWEN21_SIDE, num_inference_steps=steps, output_type="latent",
             use_kv_cache=False,
             generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        return n / (time.perf_counter() - start)

    def sampler(n: int) -> float:
        conds = engine.encode_prompts(encoder, qwen21_prompts(n))
        jobs = [_job(LATENT.shape(QWEN21_SIDE, QWEN21_SIDE), i, sigmas, timesteps, conds[i])
                for i in range(n)]
        return n / all_at_once(batcher.run, jobs)

    return _alternating(pipeline, sampler)


FAMILY_ROWS = {"flux1": flux1_row, "qwenimage": qwenimage_row, "flux2": flux2_row,
               "qwen-edit": qwen_edit_row, "wan": wan_row,
               "wan-ti2v": lambda steps: wan_row(steps, ti2v=True), "krea2": krea2_row,
               "qwenimage21": qwenimage21_row}
LORA_RANK, LORA_RUNS = 16, 16


def lora_row(steps: int) -> dict[str, float]:
    """Mixed-LoRA batching (issue 35): images/s of LORA_RUNS concurrent FLUX.1 runs on the
    mid-size transformer through the step batcher, each with its own rank-16 LoRA on every
    attention and feed-forward Linear (S-LoRA style: each run's delta on its own rows), vs the
    same runs sharing one LoRA, vs no LoRA; the best of REPEAT alternating runs each."""
    from diffusers import FluxTransformer2DModel

    from workers.device.policy import DevicePolicy
    from workers.models.flux1 import LATENT, engine
    from workers.models.flux1.tiny import build_tiny_components
    from workers.models.lora import AppliedLora, LoraWeights, install_hooks
    from workers.models.values import TextEncoder
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob, StepBatcher

    parts = build_tiny_components(0)
    torch.manual_seed(0)
    transformer: Any = FluxTransformer2DModel.from_config(FLUX_MID).eval()
    policy = DevicePolicy(profile="cpu")
    encoder = TextEncoder("te", "", (parts["text_encoder"], parts["text_encoder_2"]),
                          (parts["tokenizer"], parts["tokenizer_2"]),
                          policy.placement("text-encoder"))
    targets = {name: m for name, m in transformer.named_modules()
               if (isinstance(m, torch.nn.Linear) and ".attn." in f".{name}") or (".ff" in name
               and isinstance(m, torch.nn.Linear))}

    def lora(seed: int) -> AppliedLora:
        g = torch.Generator("cpu").manual_seed(seed)
        modules = {name: (torch.randn(LORA_RANK, m.in_features, generator=g) * 0.01,
                          torch.randn(m.out_features, LORA_RANK, generator=g) * 0.01, 1.0)
                   for name, m in targets.items()}
        weights = LoraWeights(f"bench-{seed}", str(seed), modules)
        install_hooks(transformer, weights)
        return AppliedLora(weights, 1.0)

    own = [lora(i) for i in range(LORA_RUNS)]
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: engine.predict(transformer, jobs), bounds.items,
                          bounds.tokens, max_loras=LORA_RUNS)
    sigmas, timesteps = engine.schedule(steps, FLUX_SIDE, FLUX_SIDE)
    conds = engine.encode_prompts(encoder, prompts(LORA_RUNS))
    cases: dict[str, list[tuple[AppliedLora, ...]]] = {
        "no LoRA": [()] * LORA_RUNS, "one shared LoRA": [(own[0],)] * LORA_RUNS,
        f"{LORA_RUNS} different LoRAs": [(a,) for a in own]}

    def burst(sets: list[tuple[AppliedLora, ...]]) -> float:
        jobs = [SampleJob(noise(LATENT.shape(FLUX_SIDE, FLUX_SIDE),
                                torch.Generator("cpu").manual_seed(i), "cpu"),
                          sigmas, timesteps, conds[i], extra={"guidance": FLUX_GUIDANCE},
                          loras=sets[i]) for i in range(LORA_RUNS)]
        return LORA_RUNS / all_at_once(batcher.run, jobs)

    with torch.no_grad():
        for sets in cases.values():
            burst(sets)  # warm
        best = {label: 0.0 for label in cases}
        for _ in range(REPEAT):
            for label, sets in cases.items():
                best[label] = max(best[label], burst(sets))
    return best


def print_lora_row(row: dict[str, float]) -> None:
    print(f"\nbench/batching lora: {LORA_RUNS} concurrent FLUX.1 runs, images/s (denoise only), "
          f"CPU ({torch.get_num_threads()} threads), mid-size random stack, rank {LORA_RANK}")
    for label, value in row.items():
        print(f"  {label:28}{value:15.2f}")
    mixed, shared = row[f"{LORA_RUNS} different LoRAs"], row["one shared LoRA"]
    print(f"  {LORA_RUNS} different / one shared: {mixed / shared:.2f}x (target ≥ 0.8x); "
          f"one shared / no LoRA: {shared / row['no LoRA']:.2f}x")


def print_family_row(family: str, row: dict[int, tuple[float, float]]) -> None:
    print(f"\nbench/batching {family}: images/s (denoise only), CPU "
          f"({torch.get_num_threads()} threads), mid-size random stack")
    print(f"  {'':28}" + "".join(f"{f'{n} concurrent':>15}" for n in CONCURRENCY))
    print(f"  {'diffusers list':28}" + "".join(f"{row[n][0]:15.2f}" for n in CONCURRENCY))
    print(f"  {'farm sampler (step batcher)':28}" + "".join(f"{row[n][1]:15.2f}"
                                                          for n in CONCURRENCY))
    print(f"  {family} sampler / diffusers list: " + ", ".join(
        f"{row[n][1] / row[n][0]:.2f}x at {n}" for n in CONCURRENCY) + " (target ≥ 0.95x)")


if __name__ == "__main__":
    main()
