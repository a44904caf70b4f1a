"""`manage.py farm_comfy_key USERNAME [--name N]`: print a ComfyUI base URL path with a fresh
client key for an existing user (revoke it in the admin)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.importer.comfy_door import comfy_key_create


class Command(BaseCommand):
    help = "Print /comfy/k/<key>/ for USERNAME: a ComfyUI base URL needing no header."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the key")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        _, secret = comfy_key_create(user=user, name=options["name"])
        self.stderr.write(f"ComfyUI base URL path for {user.get_username()} (shown once):")
        self.stdout.write(f"/comfy/k/{secret}/")
