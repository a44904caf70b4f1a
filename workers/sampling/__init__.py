"""The sampler seam: `SampleJob` (one image's denoise state) and `StepBatcher` (owns a denoiser)."""

from workers.sampling.batcher import StepBatcher
from workers.sampling.job import SampleJob

__all__ = ["SampleJob", "StepBatcher"]
