-- The locked part of a dispatch pass (apps/runs/dispatch.py `_pass`), in one statement on the
-- server: the queue's dispatch lock, its busy slots counted again after it (a fresh snapshot sees
-- every pass committed before the lock was granted), and the marks of the first candidates still
-- eligible, up to the free slots. The lock is never held across a round trip to a Python process.
-- Its COMMIT skips the WAL flush when the call is a transaction of its own: all it writes is
-- `dispatched_at`, which a crash may lose (the run is published again; a duplicate is a no-op).
-- The UPDATE checks the row's status again as committed: a finishing slot may have claimed the
-- candidate meanwhile (`queue_take_next`), and a running run gets neither a mark nor a message.
--
-- Written as pg_get_functiondef prints it (tests/apps/test_db_functions.py compares the two);
-- {QUEUED} and {RUNNING} are RunStatus's values (apps/runs/functions.py fills them in). A change
-- here needs a migration that applies the file again (migrations/runs/0007 is the first).
CREATE OR REPLACE FUNCTION public.inline_dispatch_mark(lock_space integer, lock_key integer, q text, fresh timestamp with time zone, window_size integer, candidates uuid[], own_transaction boolean)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    busy integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_space, lock_key);
    IF own_transaction THEN  -- never inside a caller's transaction that writes anything else
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- a statement after the lock: its snapshot sees every pass committed before the lock
    SELECT (SELECT count(*) FROM runs_run WHERE status = '{RUNNING}' AND queue = q)
         + (SELECT count(*) FROM runs_run WHERE status = '{QUEUED}' AND queue = q
              AND dispatched_at >= fresh)
      INTO busy;
    RETURN QUERY
    WITH pick AS (
        SELECT c.id, c.n FROM unnest(candidates) WITH ORDINALITY AS c(id, n)
        JOIN runs_run r ON r.id = c.id
        WHERE r.status = '{QUEUED}' AND r.queue = q
          AND (r.dispatched_at IS NULL OR r.dispatched_at < fresh)
        ORDER BY c.n LIMIT greatest(window_size - busy, 0)
    ), marked AS (
        UPDATE runs_run r SET dispatched_at = now() FROM pick
        WHERE r.id = pick.id AND r.status = '{QUEUED}'
        RETURNING r.id
    )
    SELECT pick.id FROM pick JOIN marked ON marked.id = pick.id ORDER BY pick.n;
END
$function$
