"""`inline_dispatch_lone`: a submit's dispatch when its run is the only one waiting, in one
statement on the server.

A pass (apps/runs/dispatch.py) reads the queue's heads, orders them by the policy in Python and
then calls `inline_dispatch_mark`: two round trips after the submit's commit. When nothing else
of the queue is eligible — the usual case for a farm that keeps up, where each run is
dispatched as it arrives — the policy has nothing to choose: the new run is the pick. This
function checks that (an index probe, no lock) and then does what `inline_dispatch_mark` does
for that one candidate: the queue's dispatch lock, the busy count read afresh after it, the
mark. It answers 1 (marked: publish it), 0 (every slot is busy, or the run is gone or already
marked: whoever frees a slot dispatches it; a full queue answers before any lock, as a
pass's heads read does) or -1 (other runs are eligible: run the full pass,
whose policy orders them).

Same lock, same recount and same recheck of the row as `inline_dispatch_mark` (0003, 0004), so
a lone mark and a pass that run at once never overfill the window and never mark one run twice:
a run that a concurrent pass marked first is not eligible when this UPDATE sees it. Its own
transaction, with synchronous_commit off, as the marks' (a lost mark means one more publish).
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION inline_dispatch_busy(q text, fresh timestamptz)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN  -- plpgsql, not sql: its plan is kept for the session
    RETURN (SELECT count(*) FROM runs_run WHERE status = 'running' AND queue = q)
         + (SELECT count(*) FROM runs_run WHERE status = 'queued' AND queue = q
              AND dispatched_at >= fresh);
END
$$;

CREATE OR REPLACE FUNCTION inline_dispatch_lone(
    lock_space integer, lock_key integer, q text, fresh timestamptz, window_size integer,
    run uuid
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    busy integer;
BEGIN
    -- unlocked, as a pass's heads read: with every slot taken, whoever frees one dispatches
    busy := inline_dispatch_busy(q, fresh);
    IF busy >= window_size THEN
        RETURN 0;
    END IF;
    -- a scalar subquery in the index's order, not EXISTS: as a generic plan (settings.py) EXISTS
    -- was a sequential scan over every queued run of every queue (1.6 ms at 10,000 queued)
    IF (SELECT id FROM runs_run WHERE status = 'queued' AND queue = q AND id <> run
          AND (dispatched_at IS NULL OR dispatched_at < fresh)
        ORDER BY queue, dispatched_at LIMIT 1) IS NOT NULL THEN
        RETURN -1;
    END IF;
    PERFORM pg_advisory_xact_lock(lock_space, lock_key);
    PERFORM set_config('synchronous_commit', 'off', true);
    -- a statement after the lock: its snapshot sees every pass committed before it
    busy := inline_dispatch_busy(q, fresh);
    IF busy >= window_size THEN
        RETURN 0;
    END IF;
    UPDATE runs_run SET dispatched_at = now()
    WHERE id = run AND status = 'queued' AND queue = q
      AND (dispatched_at IS NULL OR dispatched_at < fresh);
    IF FOUND THEN
        RETURN 1;
    END IF;
    RETURN 0;
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS inline_dispatch_lone(integer, integer, text, timestamptz, integer, uuid);
DROP FUNCTION IF EXISTS inline_dispatch_busy(text, timestamptz);
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0004_dispatch_mark_rechecks")]

    operations = [migrations.RunSQL(CREATE, DROP)]
