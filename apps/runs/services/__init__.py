"""Writes on runs, one module per thing a caller does: `submit` (validate, idempotency,
coalescing), `cancel`, and `attempts` (a worker's claim, flushes, finish, hand back).

Every status change is a compare-and-set along an edge declared in RUN_TRANSITIONS: through
`run_move` (apps/runs/transitions.py), or, on the worker's hot path, a single hand-written
UPDATE … RETURNING that checks the same table with `edge_check` first. The queue's dispatch
(apps/runs/dispatch.py) runs after each commit that frees a slot or adds a run.
"""

from apps.runs.services.attempts import (
    Claim,
    queue_take_next,
    run_claim,
    run_claim_next,
    run_error_of,
    run_events_flush,
    run_finish,
    run_hand_back,
    run_is_current,
    run_leases_renew,
)
from apps.runs.services.cancel import RunNotCancellable, run_cancel, run_stop_notify
from apps.runs.services.submit import (
    RunConflict,
    RunLimitReached,
    RunPriorityNotAllowed,
    run_submit,
)

__all__ = [
    "Claim", "RunConflict", "RunLimitReached", "RunNotCancellable", "RunPriorityNotAllowed",
    "queue_take_next", "run_cancel", "run_claim", "run_claim_next", "run_error_of",
    "run_events_flush", "run_finish", "run_hand_back", "run_is_current", "run_leases_renew",
    "run_stop_notify", "run_submit",
]
