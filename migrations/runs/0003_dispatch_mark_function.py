"""`inline_dispatch_mark`: the locked part of a dispatch pass, in one statement on the server.

apps/runs/dispatch.py reads a queue's heads and orders them by its policy without any lock,
then calls this: it takes the queue's dispatch lock, counts the queue's busy slots again (a
fresh snapshot, so every pass committed before the lock was granted is seen), and marks as
published the first of the candidates still eligible, up to the free slots. The lock is held
only while the function runs and its transaction commits — never across a round trip to a
Python process, whose thread may wait milliseconds for the GIL while holding it (with the pass
in Python, 8 users' bursts of submits waited 7–12 ms on average for this lock:
pg_stat_statements). Its COMMIT does not wait for the WAL flush (synchronous_commit off for this
transaction only, when the call is a transaction of its own): all it writes is `dispatched_at`, a mark that a message is out, which a crash
may lose — the run is then published again, at least once, and a duplicate delivery is a no-op.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION inline_dispatch_mark(
    lock_space integer, lock_key integer, q text, fresh timestamptz, window_size integer,
    candidates uuid[], own_transaction boolean
) RETURNS SETOF uuid LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    busy integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_space, lock_key);
    IF own_transaction THEN  -- never inside a caller's transaction that writes anything else
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- a statement after the lock: its snapshot sees every pass committed before the lock
    SELECT (SELECT count(*) FROM runs_run WHERE status = 'running' AND queue = q)
         + (SELECT count(*) FROM runs_run WHERE status = 'queued' AND queue = q
              AND dispatched_at >= fresh)
      INTO busy;
    RETURN QUERY
    WITH pick AS (
        SELECT c.id, c.n FROM unnest(candidates) WITH ORDINALITY AS c(id, n)
        JOIN runs_run r ON r.id = c.id
        WHERE r.status = 'queued' AND r.queue = q
          AND (r.dispatched_at IS NULL OR r.dispatched_at < fresh)
        ORDER BY c.n LIMIT greatest(window_size - busy, 0)
    ), marked AS (
        UPDATE runs_run r SET dispatched_at = now() FROM pick WHERE r.id = pick.id
        RETURNING r.id
    )
    SELECT pick.id FROM pick JOIN marked ON marked.id = pick.id ORDER BY pick.n;
END
$$;
"""

DROP = """DROP FUNCTION IF EXISTS
    inline_dispatch_mark(integer, integer, text, timestamptz, integer, uuid[], boolean);"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0002_client_run_keys_dispatch_indexes")]

    operations = [migrations.RunSQL(CREATE, DROP)]
