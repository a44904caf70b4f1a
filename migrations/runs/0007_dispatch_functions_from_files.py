"""The dispatcher's functions from their files: `inline_dispatch_mark` is CREATE OR REPLACEd from
apps/runs/sql/inline_dispatch_mark.sql (its whole current text; 0003 and 0004 keep their
historical text, frozen), and the submit's own dispatch functions (0005, 0006) are dropped:
a submit dispatches after its commit, through the pass, like a finish or a cancel."""

from importlib import import_module

from django.db import migrations

from apps.runs.functions import function_sql

mark_before = import_module("migrations.runs.0004_dispatch_mark_rechecks")
submit_before = import_module("migrations.runs.0006_dispatch_with_the_submit")

DROP_SUBMIT_DISPATCH = """
DROP FUNCTION IF EXISTS inline_dispatch_submitted(integer, integer, text, timestamptz, integer,
                                                  uuid);
DROP FUNCTION IF EXISTS inline_dispatch_lone(integer, integer, text, timestamptz, integer, uuid);
DROP FUNCTION IF EXISTS inline_dispatch_busy(text, timestamptz);
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0006_dispatch_with_the_submit")]

    operations = [
        migrations.RunSQL(function_sql("inline_dispatch_mark"), mark_before.CREATE),
        migrations.RunSQL(DROP_SUBMIT_DISPATCH, submit_before.LONE + submit_before.SUBMITTED),
    ]
