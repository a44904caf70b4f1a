"""The contract every model family plugs in behind (zimage, flux1, sdxl, …). TORCH-FREE.

A family is one package, `workers/models/<id>/`, registered by its id in
`workers/models/families.py`, and nothing outside it knows more about it. Two halves:

- `workers/models/<id>/__init__.py` (torch-free: the catalog, routing and the web side read it)
  defines `FAMILY = FamilyInfo(...)`: its id, latent format, how it recognises its files from
  their contents (`recognise(header) -> role | None`, reading safetensors keys/shapes or a
  folder's config, never the file name), a VRAM estimate, and whether it splits across GPUs.
- `workers/models/<id>/plugin.py` (torch, diffusers) is a module with the functions of
  `FamilyPlugin` below: load each component locally (ComfyUI single file or diffusers folder,
  `local_files_only`), encode prompts, its sigma schedule, its denoiser call for the step batcher
  (one forward over the jobs of many runs; each job keeps its own schedule; it declares each
  row's LoRAs with workers/models/lora.py `rows`), VAE encode/decode, its LoRA files' weights,
  and a tiny random stack writer for tests and `./farm models smoke`. `recognise` gives LoRA
  files of the family the role `lora`.

Adding a family is copying a package and adding its id to `families.REGISTERED`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from workers.models.header import ModelHeader

# What a model file is to its family. A folder of the models dir holds files of these roles.
ROLES: tuple[str, ...] = ("transformer", "unet", "vae", "text_encoder", "checkpoint", "lora",
                          "latent_upscaler")
FOLDER_ROLES: dict[str, tuple[str, ...]] = {
    "diffusion_models": ("transformer", "unet"),
    "vae": ("vae",),
    "text_encoders": ("text_encoder",),
    "checkpoints": ("checkpoint",),
    "loras": ("lora",),
    "latent_upscale_models": ("latent_upscaler",),
}


class ModelLoadError(Exception):
    """A model file exists but cannot be loaded (corrupt, incomplete, or not this family)."""


@dataclass(frozen=True)
class LatentFormat:
    """A family's latents: [1, channels, H/downscale, W/downscale]; the denoiser sees
    patch×patch patches, so image sides are multiples of downscale·patch."""

    channels: int
    downscale: int
    patch: int

    @property
    def pixel_multiple(self) -> int:
        return self.downscale * self.patch

    def shape(self, width: int, height: int) -> tuple[int, int, int, int]:
        """[1, C, H/d, W/d] for a width×height image; a ValueError off the pixel grid."""
        m = self.pixel_multiple
        if width % m or height % m or width <= 0 or height <= 0:
            raise ValueError(f"image sides must be positive multiples of {m}, got {width}×{height}")
        return (1, self.channels, height // self.downscale, width // self.downscale)

    def tokens(self, height: int, width: int) -> int:
        """Denoiser tokens of latents [.., height, width] (one per patch)."""
        return (height // self.patch) * (width // self.patch)


@dataclass(frozen=True)
class FamilyInfo:
    """A family's torch-free facts (its package's `FAMILY`).

    - `recognise(header)`: the role of a model whose header (workers/models/header.py) belongs
      to this family, else None. A file may belong to several families (FLUX.1's VAE also
      serves Z-Image); the catalog reports the first registered one and all of them.
    - `activation_gb` + `activation_gb_per_mpx` × megapixels: the memory a run needs beyond its
      weights (apps/fleet/routing.py adds the model files' sizes).
    - `splits`: whether one image's denoise can be split across a GPU group (xfuser.<n>).
    - `guidance`: what a sampler's `guidance` param means: classifier-free guidance (`cfg`: on
      when > 0, with a negative prompt) or a guidance-distilled model's embedded scale
      (`distilled`: FLUX.1 dev, one forward per step).
    - `nodes`: the package's modules that register the family's own node runners
      (`zimage/turbo`); their descriptors are in apps/graphs/nodes.py like every node's.
    - `cfg_offset`: a CFG family's `guidance` for ComfyUI's cfg c is c − cfg_offset: 0 where
      the family mixes uncond + g·(cond − uncond) as ComfyUI (and most diffusers pipelines)
      do; Z-Image's pipeline mixes cond + g·(cond − uncond), the same prediction at g = c − 1.
    - `video`: a video family (Wan): its graphs make clips (latent/empty-video →
      vae/decode-video), and checks that render each family build such a graph.
    - `variant(header)`: what kind of the family's model a file is, where the kinds take other
      graphs (Wan's transformers: "t2v", "i2v", "ti2v"); the catalog reports it. None: one kind.
    - `variant_activation`: (variant, share) pairs: a variant's share of the per-megapixel
      activations (Wan's ti2v: its Wan 2.2 VAE's ÷16 latents hold a quarter of the tokens per
      frame); the estimate takes the largest share among a run's files (none named: 1).
    - `text_encoders`: the encoders a text-encoder loader of this family names, one file each
      (FLUX.1: CLIP-L and T5); a loader naming another count is a 422 at submit. Empty: the
      family's encoders come some other way (a checkpoint).
    """

    id: str
    title: str
    latent: LatentFormat
    recognise: Callable[[ModelHeader], str | None]
    splits: bool = False
    activation_gb: float = 1.0
    activation_gb_per_mpx: float = 3.0
    nodes: tuple[str, ...] = ()  # modules of the package whose import registers node runners
    guidance: Literal["cfg", "distilled"] = "cfg"
    text_encoders: tuple[str, ...] = ()
    cfg_offset: float = 0.0
    video: bool = False
    variant: Callable[[ModelHeader], str | None] | None = None
    variant_activation: tuple[tuple[str, float], ...] = ()


Tensor = Any  # torch.Tensor: this module stays importable without torch
Policy = Any  # workers.device.policy.DevicePolicy


# Optional plug-in functions (looked up with getattr; a family without one gets the default):
# - load_checkpoint(models_dir, name, policy) -> (DiffusionModel, TextEncoder, Vae): an
#   all-in-one `checkpoints/<name>` file (SDXL's); families without such files have none.
# - init_noise(eps, sigmas) -> Tensor: txt2img's start latents from unit noise `eps` (default:
#   `eps`, flow matching's σ = 1; SDXL scales by its scheduler's init_noise_sigma).
# - advance(job, output) -> Tensor: the family's own sampler step, the job's next latents
#   (default: flow-matching Euler; SDXL: EulerDiscreteScheduler.step, bit-identical).
# - text_encoder_parts(encoder) -> {name: module} and text_encoder_lora_state_dict(path,
#   encoder, denoiser) -> {"<name>.<module>": (A, B, scale)}: the text encoders a LoRA file's
#   text-encoder half adapts (diffusers' component names: SDXL `text_encoder` + `text_encoder_2`,
#   FLUX.1 `text_encoder`) and that half of the file (`load/lora`'s `strength_clip`; a
#   ValueError for one it cannot apply). Without them a file with such a half is refused when
#   asked to apply it (workers/models/lora.py `text_encoder_keys`).
# - to_denoised(job, output) -> Tensor: the x0 estimate ("denoised", in the sampler's sigma
#   space) from the model's output for `job` at `job.sigmas[job.step]`, for k-diffusion-style
#   samplers (the session's seam: it joins the contract once every family has it).
# - video_frames(latent_frames) -> int: the frames a video latent of `latent_frames` frames
#   decodes to (a video family: its samplers' progress events carry `frames`).
# - preview_pixels(job) -> uint8 [h, w, 3] | None: a live preview from the job alone (device
#   thread), for a sampler with no preview VAE (LTX-2: its job holds its video VAE and the last
#   step's middle-frame x0 estimate).
# - split_plan(transformer) -> (context-parallel plan, per-row forward arguments): how a GPU
#   group splits one image's denoise (workers/parallel/split_family.py: diffusers'
#   `_cp_plan` form; the rows the CFG pair divides). A family with `splits` but no split_plan
#   is Z-Image (its own split in workers/parallel/split.py).


class FamilyPlugin(Protocol):
    """The functions of `workers/models/<id>/plugin.py` (a module satisfies this protocol).

    Values are those of workers/models/values.py, each loaded one naming its `family`.
    """

    def load_diffusion_model(self, models_dir: Path, name: str, policy: Policy) -> Any:
        """`diffusion_models/<name>` (cached per process) with its `StepBatcher`, whose
        forward is `predict`."""

    def load_vae(self, models_dir: Path, name: str, policy: Policy) -> Any:
        """`vae/<name>` (cached), with a coalescer of decodes."""

    def load_text_encoder(self, models_dir: Path, names: Sequence[str], policy: Policy) -> Any:
        """The family's text encoder(s) from `text_encoders/<name>` files (one per encoder the
        family uses, in any order), with a coalescer of encodes."""

    def encode_prompts(self, encoder: Any, texts: list[str]) -> list[Any]:
        """Each text's conditioning in the family's form, from one batched encoder call."""

    def schedule(self, steps: int, width: int, height: int, denoise: float,
                 shift: float | None = None) -> tuple[Tensor, Tensor]:
        """(sigmas [n + 1] ending in 0, timesteps [n]) of one job: a fresh scheduler per job.
        `shift`: the sigma shift α of a flow family (σ = α·t / (1 + (α − 1)·t), ComfyUI's
        ModelSamplingSD3 / AuraFlow `shift`); None: the family's default; a family without a
        shift ignores it."""

    def renoise(self, init: Tensor, eps: Tensor, sigma: Tensor) -> Tensor:
        """Latents `init` noised to `sigma` with noise `eps` (img2img's start)."""

    def predict(self, transformer: Any, jobs: list[Any]) -> list[Tensor]:
        """One denoiser forward over `jobs` (SampleJobs of any runs); each job's velocity."""

    def to_denoised(self, job: Any, output: Tensor) -> Tensor:
        """The x0 estimate ("denoised", in the sampler's σ space) from `predict`'s output for
        `job` at `job.sigmas[job.step]`: what the generic samplers
        (workers/sampling/samplers.py) step on."""

    def model_sampling(self, width: int, height: int, shift: float | None = None) -> Any:
        """ComfyUI's model sampling of the family's denoiser (workers/sampling/schedulers.py:
        `FlowSampling` or `DiscreteSampling`): the σ table the named schedulers read, σ ↔
        timestep, noise scaling. `shift`: a flow family's sigma shift (None: its default)."""

    def encode_image(self, vae: Any, image: Any, generator: Any = None) -> Tensor:
        """Latents [1, C, H/d, W/d] float32 of an RGB image."""

    def decode_latents_batch(self, vae: Any, latents: list[Tensor]) -> list[Any]:
        """RGB images of same-shape latents, from one VAE decode."""

    def lora_state_dict(self, path: Path, denoiser: Any) -> dict[str, Any]:
        """{denoiser module name: (A [r, in], B [out, r], scale)} of the LoRA file at `path`
        in any format the family's trainers publish (diffusers' own converters: its pipeline's
        `lora_state_dict`), text-encoder weights left out; a ValueError or KeyError for a file
        it cannot read. workers/models/lora.py checks the modules against `denoiser` and
        applies them per batch row (the `load/lora` node)."""

    def write_tiny_stack(self, models_dir: Path) -> dict[str, str]:
        """Write a tiny random-weight stack (names prefixed `smoke-`) as studios lay their
        files out, with a tiny random LoRA (`lora`) in the format its trainers publish;
        returns the file names by role."""
