"""`inline_forbid_update` from its file: CREATE OR REPLACEd from
apps/takes/sql/inline_forbid_update.sql (its whole current text; 0002 keeps its historical text,
frozen, and the triggers it and 0003 made keep calling the function by name)."""

from importlib import import_module

from django.db import migrations

from apps.takes.functions import function_sql

before = import_module("migrations.takes.0002_immutable_takes")

# Undoing this puts back 0002's text of the function, without touching the triggers.
FORBID_UPDATE_0002 = before.FORBID_UPDATE.split("CREATE TRIGGER", 1)[0]


class Migration(migrations.Migration):
    dependencies = [("takes", "0003_retention")]

    operations = [migrations.RunSQL(function_sql("inline_forbid_update"), FORBID_UPDATE_0002)]
