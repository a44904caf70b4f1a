"""`inline_dispatch_mark` marks a candidate only while it is still queued when its row is
updated: a finishing slot may have claimed it meanwhile (apps/runs/dispatch.py
`queue_take_next`, which takes its next run in its finish's transaction). The pick's status
check ran on the statement's snapshot; the UPDATE that waited for that slot's row lock now
checks the row as committed, so a run already running gets neither a mark nor a message."""

from importlib import import_module

from django.db import migrations

earlier = import_module("migrations.runs.0003_dispatch_mark_function")

CREATE = earlier.CREATE.replace(
    "UPDATE runs_run r SET dispatched_at = now() FROM pick WHERE r.id = pick.id\n",
    "UPDATE runs_run r SET dispatched_at = now() FROM pick\n"
    "        WHERE r.id = pick.id AND r.status = 'queued'\n",
)
assert CREATE != earlier.CREATE


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_dispatch_mark_function")]

    operations = [migrations.RunSQL(CREATE, earlier.CREATE)]
