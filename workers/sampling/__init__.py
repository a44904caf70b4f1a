"""The sampler seam: `SampleJob` (one image's denoise state), `StepBatcher` (owns a denoiser) and
`Coalescer` (batches the text encodes and VAE decodes that run slots reach together)."""

from workers.sampling.batcher import StepBatcher
from workers.sampling.coalesce import Coalescer
from workers.sampling.job import SampleJob

__all__ = ["Coalescer", "SampleJob", "StepBatcher"]
