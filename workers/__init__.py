"""The GPU side: Celery tasks, the executor, node runners, device policy, sampling, model code.

Nothing under `workers/` is imported by the web process; heavy libraries (torch, diffusers) are
imported inside functions or in modules that only the worker loads.
"""
