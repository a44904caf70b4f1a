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

from importlib import import_module

from django.db import migrations

earlier = import_module("migrations.runs.0005_dispatch_lone_function")

# 0005's functions again, the lone mark without its asynchronous commit (the reverse: 0005's)
LONE = earlier.CREATE.replace("\n    PERFORM set_config('synchronous_commit', 'off', true);", "")
assert LONE != earlier.CREATE

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


class Migration(migrations.Migration):
    dependencies = [("runs", "0005_dispatch_lone_function")]

    operations = [
        migrations.RunSQL(LONE, earlier.CREATE),
        migrations.RunSQL(SUBMITTED, DROP),
    ]
