"""Node runners; importing this package registers them all: the generic ones here, and each
registered model family's own nodes (workers/models/families.py)."""

from workers.models.families import import_node_runners
from workers.runners import (  # noqa: F401 — importing registers the runners
    audio,
    diffusion,
    image,
    image_ops,
    logic,
    sampling,
    textgen,
    upscale,
    video,
)
from workers.runners.base import (
    CHOOSERS,
    RUNNERS,
    NodeContext,
    NodeFailed,
    RunCancelled,
    runner,
)

import_node_runners()

__all__ = ["CHOOSERS", "RUNNERS", "NodeContext", "NodeFailed", "RunCancelled", "runner"]
