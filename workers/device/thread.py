"""The device thread: the one thread of a worker process that runs torch's compute.

A worker's run slots are threads (Celery's threads pool), and torch's CPU kernels (OpenMP, MKL)
keep a team of helper threads per calling thread. Once a second thread of the process has run a
parallel region, the teams oversubscribe the cores and every later region of every thread runs as
if single-threaded. Measured on a 2-core machine (tiny Z-Image stack, same process): a transformer
forward took 7 ms while one thread did all the torch work and 12–16 ms on either thread once
another thread had done some; a 256² VAE decode took ~140 ms against ~200 ms. bench/generate's
farm − direct gap was mostly this (16 ms denoise steps against the pipeline's 7 ms).

So every torch call of a run goes through `on_device_thread`: model loads on a CPU worker, noise,
the denoiser's forwards and Euler steps (workers/sampling/batcher.py), the batched text encodes
and VAE decodes (workers/sampling/coalesce.py), previews. Tensor creation and `.to()` of small
tensors may stay on a slot thread: they run no parallel region. On a GPU the kernels run on the
device whichever thread launches them; one launching thread also keeps them in one stream's
order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
THREAD_PREFIX = "inline-device"
_device_thread: ThreadPoolExecutor | None = None
_device_lock = threading.Lock()


def on_device_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the process's one device thread; its exception is raised here. Called
    from the device thread itself, it runs inline."""
    global _device_thread
    if threading.current_thread().name.startswith(THREAD_PREFIX):
        return fn(*args)
    with _device_lock:
        if _device_thread is None:
            _device_thread = ThreadPoolExecutor(1, thread_name_prefix=THREAD_PREFIX)
        executor = _device_thread
    return executor.submit(fn, *args).result()
