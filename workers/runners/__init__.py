"""Node runners; importing this package registers them all: the generic ones here, and each
registered model family's own nodes (workers/models/families.py)."""

from workers.models.families import import_node_runners

# Importing a runner module registers its runners.
from workers.runners import diffusion, image, sampling  # noqa: F401
from workers.runners.base import RUNNERS, NodeContext, NodeFailed, RunCancelled, runner

import_node_runners()

__all__ = ["RUNNERS", "NodeContext", "NodeFailed", "RunCancelled", "runner"]
