"""One rank process of a worker group: joins the group, then steps every job rank 0 broadcasts.

Started by `WorkerGroup` as `python -m workers.parallel.rank RANK WORLD PORT CFG ULYSSES RING
BACKEND [FD]` (a plain subprocess: no multiprocessing re-import of the worker's main module);
FD is rank 0's end of a socketpair to the Celery process. Rank 0 owns that pipe: it receives a
forward (protocol.py), broadcasts it, every rank computes its share of it, and rank 0 sends the
velocities back (every rank ends a forward holding all of them: the split's gathers make it so).
An exception on any rank ends that process (non-zero exit): the parent sees it die and restarts
the whole group — ranks are never re-initialised in place (xfuser's parallel state cannot be,
FACTS.md).
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from workers.parallel.config import Degrees
from workers.parallel.protocol import Forward, ModelRef, receive, send
from workers.sampling.batcher import FORWARD_JOBS

log = logging.getLogger(__name__)

IDLE_PING_S = 60.0  # an idle rank 0 broadcasts a ping this often: no collective waits for long
COLLECTIVE_TIMEOUT_S = 900  # the group's own collective timeout (the parent's is shorter)


def main(argv: list[str]) -> None:
    rank, world, port, cfg, ulysses, ring = (int(a) for a in argv[:6])
    backend = argv[6]
    conn = Connection(int(argv[7])) if len(argv) > 7 else None
    rank_main(rank, world, port, Degrees(cfg, ulysses, ring), backend, conn)


def rank_main(rank: int, world: int, port: int, degrees: Degrees, backend: str,
              conn: Connection | None) -> None:
    """The process entry point; `conn` is rank 0's pipe to the parent (None on other ranks)."""
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(message)s")
    try:
        _serve(rank, world, port, degrees, backend, conn)
    except BaseException:
        log.exception("rank %d failed; the group will be restarted", rank)
        sys.stdout.flush()
        os._exit(1)  # never linger in a collective: the parent restarts the whole group
    os._exit(0)


def _serve(rank: int, world: int, port: int, degrees: Degrees, backend: str,
           conn: Connection | None) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = f"cuda:{rank}" if backend == "xfuser" else "cpu"
    if backend == "xfuser":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if backend == "xfuser" else "gloo", store=store, rank=rank,
                            world_size=world, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    split = _split(backend, degrees, rank, world, torch.device(device))
    models: dict[ModelRef, tuple[Any, Any]] = {}  # the prepared transformer, its predict
    dist.barrier()
    if conn is not None:
        send(conn, "ready")
    while True:
        message = _next_message(conn)
        if message[0] == "quit":
            break
        if message[0] == "forward":
            forward: Forward = message[1]
            if forward.model not in models:
                transformer, family_plugin = _load(forward.model, device)
                models[forward.model] = (split.prepare(transformer, family_plugin),
                                         family_plugin.predict)
            transformer, predict = models[forward.model]
            items = _on(forward.items, device)
            velocities = split.velocities(transformer, items, predict)
            if conn is not None:
                shared = [item.extra.get(FORWARD_JOBS) for item in items]
                send(conn, "velocities", [v.cpu() for v in velocities], split.report(), shared)
    dist.destroy_process_group()


def _split(backend: str, degrees: Degrees, rank: int, world: int, device: Any) -> Any:
    if backend == "xfuser":
        from workers.parallel.xfuser_backend import XfuserSplit

        return XfuserSplit(degrees, rank, world)
    from workers.parallel.split import CpuSplit

    return CpuSplit(degrees, rank, device)


def _next_message(conn: Connection | None) -> tuple[Any, ...]:
    """Rank 0: the parent's next message (a ping when idle); every rank: what rank 0 broadcast."""
    import torch.distributed as dist

    box: list[Any] = [None]
    if conn is not None:
        box[0] = receive(conn) if conn.poll(IDLE_PING_S) else ("ping",)
    dist.broadcast_object_list(box, src=0)
    return tuple(box[0])


def _load(model: ModelRef, device: str) -> tuple[Any, Any]:
    """The model's transformer on this rank's device, and its family's plugin."""
    from workers.device.policy import DevicePolicy
    from workers.models.catalog import resolve
    from workers.models.families import loader_family, plugin

    profile = "cpu" if device == "cpu" else "gpu-max"
    policy = DevicePolicy(profile=profile, device=device, dtype=model.dtype,  # type: ignore[arg-type]
                          attention=model.attention)
    models_dir = Path(model.models_dir)
    family = loader_family(resolve(models_dir, "diffusion_models", model.name), "diffusion_models")
    family_plugin = plugin(family)
    transformer = family_plugin.load_diffusion_model(models_dir, model.name, policy).transformer
    return transformer, family_plugin


def _on(items: list[Any], device: str) -> list[Any]:
    """The forward's items with their tensors on this rank's device."""
    from dataclasses import replace

    def moved(value: Any) -> Any:
        if isinstance(value, tuple) and not hasattr(value, "to"):
            return tuple(moved(v) for v in value)
        return value.to(device) if hasattr(value, "to") else value

    return [replace(item, latents=item.latents.to(device), timestep=item.timestep.to(device),
                    positive=moved(item.positive), negative=moved(item.negative),
                    extra={k: moved(v) for k, v in item.extra.items()})
            for item in items]


if __name__ == "__main__":
    main(sys.argv[1:])
