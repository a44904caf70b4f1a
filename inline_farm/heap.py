"""Keep the cycle collector's full passes short: what a process loads once is frozen out of them.

CPython's generation-2 collection walks every tracked object, and it stops every thread while it
does. Measured on the 2-core CI machine:
- a web process holds ~100 k objects once its URLconf is loaded: a full pass took 23–28 ms idle
  and 63 ms on average (91 ms at worst) under the 8-user flood, five times in 30 s: the tail of
  `/v1/health` and of every request in flight;
- a worker with diffusers and transformers imported holds ~460 k: a full pass takes ~180 ms, and
  stops every slot, the device thread and the heartbeat with it.

`gc.freeze()` moves every object alive now into a permanent generation that collections skip.
Frozen objects are still freed by reference counting, but never as part of a cycle, so freeze
only what lives as long as the process (modules, classes, the URLconf) and never a loaded model:
a model may sit in reference cycles (a freshly built diffusers model does; accelerate's hooks can),
and a frozen one evicted from the model cache would never be freed.
Hence the call sites: the web after its URLconf (inline_farm/asgi.py), a worker when
it is ready (workers/tasks.py), and a model worker once more after importing the model libraries,
before its first model is built (workers/models/zimage/loading.py).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def freeze_long_lived(what: str) -> None:
    """Collect the garbage there is, then exempt every object alive from later full passes."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("froze %d long-lived objects (%s) out of the collector's passes in %.0f ms",
             gc.get_freeze_count(), what, (time.perf_counter() - started) * 1000)
