"""A submit's lone mark in the submit's own transaction: one round trip fewer per run.

The plain submit (apps/runs/services.py `_submit_committed`) sends the owner's lock and its
statement pipelined in autocommit mode, one implicit transaction that the pipeline's Sync
commits; its lone mark (`inline_dispatch_lone`, 0005) was a round trip of its own after that
commit. Now `inline_dispatch_submitted` goes out in the same pipeline, after the submit's
statement: the busy count, the check that nothing else of the queue is eligible, the queue's
dispatch lock, the recount and the mark run on the server before the Sync commits them with the
run — still no round trip to a Python process while the lock is held.

- `inline_dispatch_lone` loses its `synchronous_commit = off`: its mark now commits with the
  submit's run, as durably as the run.
- `inline_dispatch_submitted` calls it and turns an error of the dispatch (its function gone, a
  lock or statement timeout) into an answer (-2 and the message) instead of failing the submit:
  its EXCEPTION block is a subtransaction, so what the dispatch did is undone and the submit's
  writes commit; the run waits unpublished for beat's pass, as when a dispatch after the commit
  failed. Answers otherwise as `inline_dispatch_lone`: 1 marked (publish it), 0, -1 (others are
  eligible: run the full pass after the commit).
"""

from django.db import migrations

LONE = """
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
    PERFORM pg_advisory_xact_lock(lock_space, lock_key);{quick}
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

SUBMITTED = """
CREATE OR REPLACE FUNCTION inline_dispatch_submitted(
    lock_space integer, lock_key integer, q text, fresh timestamptz, window_size integer,
    run uuid, OUT answer integer, OUT error text
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    answer := inline_dispatch_lone(lock_space, lock_key, q, fresh, window_size, run);
EXCEPTION WHEN OTHERS OR query_canceled THEN  -- OTHERS leaves out a statement timeout's cancel
    answer := -2;
    error := SQLERRM;
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS inline_dispatch_submitted(integer, integer, text, timestamptz, integer,
                                                  uuid);
"""

QUICK = """
    PERFORM set_config('synchronous_commit', 'off', true);"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0005_dispatch_lone_function")]

    operations = [
        migrations.RunSQL(LONE.replace("{quick}", ""), LONE.replace("{quick}", QUICK)),
        migrations.RunSQL(SUBMITTED, DROP),
    ]
