"""`manage.py farm_token USERNAME [--staff]`: create the user if needed, print a fresh token."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.accounts.services import token_create, user_get_or_create


class Command(BaseCommand):
    help = "Create USERNAME if needed and print a fresh API token (the last line of output)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--staff", action="store_true", help="make a new user staff")
        parser.add_argument("--name", default="cli", help="a label for the token")

    def handle(self, *args: Any, **options: Any) -> None:
        user = user_get_or_create(username=options["username"], is_staff=options["staff"])
        _, secret = token_create(user=user, name=options["name"])
        self.stderr.write(f"token for {user.get_username()} (shown once):")
        self.stdout.write(secret)
