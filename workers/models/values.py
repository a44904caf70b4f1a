"""The values that flow between the diffusion nodes (model, vae, text-encoder, conditioning,
latent ports), whatever the family. Images between nodes are PIL RGB images.

Every loaded value names the `family` whose plug-in loaded it (workers/models/families.py): the
generic nodes ask that family's plug-in for its schedule, encode and decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.device.policy import Placement

Tensor = Any  # torch.Tensor


@dataclass(frozen=True, eq=False)
class DiffusionModel:
    """`model` port: a loaded denoiser (transformer or UNet) and the step batcher that owns it."""

    name: str  # the file name in diffusion_models/
    sha256: str
    transformer: Any  # e.g. diffusers.ZImageTransformer2DModel, on placement.device
    batcher: Any  # workers.sampling.StepBatcher
    placement: Placement
    family: str = ""  # the plug-in that loaded it (workers/models/families.py)
    # workers.models.lora.AppliedLora, in the order the load/lora nodes chain them: applied per
    # batch row at each forward; the base `transformer` is shared, never changed
    loras: tuple[Any, ...] = ()
    # DifferentialDiffusion's strength (model/differential-diffusion): a noise mask's grey levels
    # set how long each pixel is re-noised (workers/sampling/inpaint.py); None: the mask as it is
    differential: float | None = None


@dataclass(frozen=True, eq=False)
class Vae:
    """`vae` port: a loaded AutoencoderKL (its family says the latent format)."""

    name: str
    sha256: str
    module: Any  # diffusers.AutoencoderKL
    placement: Placement
    # workers.sampling.Coalescer of latents -> images: decodes that arrive together share a call
    batched: Any = field(default=None, repr=False)
    family: str = ""  # the plug-in that loaded it (workers/models/families.py)


@dataclass(frozen=True, eq=False)
class TextEncoder:
    """`text-encoder` port: a text encoder (or a family's pair of them) and its tokenizer."""

    name: str
    sha256: str
    model: Any  # e.g. transformers.Qwen3Model
    tokenizer: Any
    placement: Placement
    # workers.sampling.Coalescer of (text, loras) -> embeds: encodes that arrive together share
    # a call, each text's rows with its own LoRAs (workers/models/lora.py `encode_rows`)
    batched: Any = field(default=None, repr=False)
    family: str = ""  # the plug-in that loaded it (workers/models/families.py)
    # workers.models.lora.AppliedLora of the load/lora nodes' text-encoder halves (strength_clip),
    # applied per row at each encode; the base `model` is shared, never changed
    loras: tuple[Any, ...] = ()


@dataclass(frozen=True, eq=False)
class Conditioning:
    """`conditioning` port: one prompt's embeddings in its family's form (Z-Image: caption
    embeddings [L, D], padding dropped).

    `encoder` is kept so a sampler can encode the empty negative prompt when guidance > 0 and
    no negative conditioning is wired (what the diffusers pipeline does).
    """

    embeds: Any  # the family's form: Z-Image [L, D], on the text encoder's dtype and device
    text: str
    encoder: TextEncoder
    # the family's per-job denoiser inputs that ride with the prompt (Wan I2V: `condition`, the
    # mask + encoded start / end frames, ComfyUI's concat_latent_image); the sampler passes
    # the positive's on to its SampleJob's `extra`
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Latent:
    """`latent` port: [1, C, H/d, W/d] float32 in a family's (scaled, shifted) latent space,
    d = `downscale` (the family's latent format: Z-Image 16 channels at ÷8).

    `empty` marks a latent from `latent/empty`: only its pixel size matters (a sampler makes its
    own family's latents of that size). `mask` (ComfyUI's noise_mask), shaped as `samples` but
    one channel: 1 where the sampler denoises, 0 where `samples` are kept as given (Wan 2.2
    TI2V-5B's image-to-video: the start image's latent frame); only families that take one
    (`keeps_masked` in their plug-in) sample it.
    """

    samples: Tensor
    empty: bool = False
    downscale: int = 8
    mask: Tensor | None = None

    @property
    def pixel_size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self.samples.shape[-1] * self.downscale, self.samples.shape[-2] * self.downscale


# --- sampling as parts (ComfyUI's NOISE, SAMPLER, SIGMAS, GUIDER) --------------------------------


@dataclass(frozen=True, eq=False)
class Noise:
    """`noise` port: a custom sampler's noise (RandomNoise's seed): its start noise and its
    ancestral / SDE steps' noise."""

    seed: int


@dataclass(frozen=True, eq=False)
class SamplerChoice:
    """`sampler` port: a generic sampler by name (workers/sampling/samplers.py SAMPLERS)."""

    name: str


@dataclass(frozen=True, eq=False)
class Sigmas:
    """`sigmas` port: a schedule. Either explicit `values` ([n + 1] float32, ManualSigmas), or
    a named scheduler over `model`'s sampling, resolved at the sampler once the latent's size
    is known (FLUX.1's shift depends on it)."""

    values: Tensor = None
    scheduler: str = ""
    steps: int = 0
    denoise: float = 1.0
    model: DiffusionModel | None = None


@dataclass(frozen=True, eq=False)
class Guider:
    """`guider` port: the model and conditioning a custom sampler denoises with; `cfg` ≤ 1 is
    one forward per step (BasicGuider), above it classifier-free guidance with `negative`."""

    model: DiffusionModel
    positive: Conditioning
    negative: Conditioning | None = None
    cfg: float = 1.0


@dataclass(frozen=True, eq=False)
class Mask:
    """`mask` port: a float32 plane [H, W] in 0..1, where 1 marks the area to paint (ComfyUI's
    MASK convention). Images stay Pillow images; a mask needs more than 8 bits (feathering)."""

    values: Any  # numpy.ndarray [H, W] float32

    @property
    def width(self) -> int:
        return int(self.values.shape[1])

    @property
    def height(self) -> int:
        return int(self.values.shape[0])

    @property
    def nbytes(self) -> int:  # the node cache's size of it (workers/nodecache.py)
        return int(self.values.nbytes)


# --- video (workers/models/values.py is the one place these shapes are written) ------------------


@dataclass(frozen=True, eq=False)
class Frames:
    """`frames` port: a clip's decoded frames, in order (ComfyUI's IMAGE batch of a video)."""

    array: Any  # numpy.ndarray [F, H, W, 3] uint8 RGB

    @property
    def count(self) -> int:
        return int(self.array.shape[0])

    @property
    def width(self) -> int:
        return int(self.array.shape[2])

    @property
    def height(self) -> int:
        return int(self.array.shape[1])

    @property
    def nbytes(self) -> int:  # the node cache's size of it (workers/nodecache.py)
        return int(self.array.nbytes)


@dataclass(frozen=True, eq=False)
class Audio:
    """`audio` port: a sound track (ComfyUI's AUDIO): float32 samples in [-1, 1]."""

    samples: Any  # numpy.ndarray [channels, n] float32
    sample_rate: int

    @property
    def seconds(self) -> float:
        return float(self.samples.shape[-1]) / self.sample_rate

    @property
    def nbytes(self) -> int:
        return int(self.samples.nbytes)


@dataclass(frozen=True, eq=False)
class Video:
    """`video` port: frames at a frame rate, with an optional sound track (ComfyUI's VIDEO)."""

    frames: Frames
    fps: float
    audio: Audio | None = None

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes + (self.audio.nbytes if self.audio is not None else 0)
