"""One image across several GPUs: a worker group of n rank processes behind the sampler seam.

- `config`: INLINE_PARALLEL, the degrees (cfg, ulysses, ring) and the method from the hardware
  (torch-free; checked at worker start).
- `group`: the Celery side — spawns the ranks lazily, hands each job to rank 0 over a local
  pipe, drives its steps (progress, cancellation), restarts the group when a rank dies or hangs
  (`GroupFault`, a worker fault: the run is retried).
- `rank`: one rank process (torch.distributed: gloo on CPU, NCCL + xfuser on GPUs).
- `split`: the CPU split (CFG-parallel, sequence-parallel attention) over gloo: Z-Image's;
  FLUX.1 / FLUX.2 / Qwen-Image / Krea 2 / Wan in `split_family` (their own predict, diffusers'
  context parallelism, CFG rows across the pair).
- `xfuser_backend`: the GPU split (the only module that imports xfuser).
- `worker`: the Celery worker's start check and the denoise hook.

Only the denoise is split: loading, encoding and decoding stay in the worker.
"""
