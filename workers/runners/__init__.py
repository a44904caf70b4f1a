"""Node runners, one module per family; importing this package registers them all."""

from workers.runners import diffusion, image  # noqa: F401 — importing registers the runners
from workers.runners.base import RUNNERS, NodeContext, NodeFailed, RunCancelled, runner

__all__ = ["RUNNERS", "NodeContext", "NodeFailed", "RunCancelled", "runner"]
