"""`./farm import FILE [--run]` reaches the importer's manage.py command."""

from __future__ import annotations

from inline_farm.cli import build_parser


def test_farm_import_takes_a_file_and_run():
    args = build_parser().parse_args(["import", "flow.json", "--run", "--user", "ana"])
    assert (args.command, args.file, args.run, args.user) == ("import", "flow.json", True, "ana")
