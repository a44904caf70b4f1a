"""Display helpers shared by the apps' admins: pretty JSON, badges, ages, short ids, view-only.

Everything here returns HTML built with `format_html` (escaped) and styled inline, so a long
value (a prompt, a lineage, a base64 preview) wraps inside the page instead of widening it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

# Wraps anywhere and scrolls inside itself: a pre never pushes the page wider than the window.
PRE_STYLE = ("white-space:pre-wrap;overflow-wrap:anywhere;max-width:60em;max-height:32em;"
             "overflow:auto;margin:0;padding:6px;background:var(--darkened-bg);font-size:12px")

STATUS_COLORS = {
    "queued": "#6c757d", "running": "#0d6efd", "succeeded": "#198754", "failed": "#dc3545",
    "cancelled": "#b58105", "online": "#198754", "draining": "#b58105", "offline": "#6c757d",
}


def pretty_json(value: Any) -> SafeString:
    """`value` as indented, key-sorted JSON in a wrapping <pre>."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="{}">{}</pre>', PRE_STYLE, text)


def badge(text: str) -> SafeString:
    """A coloured status pill (run and worker states)."""
    color = STATUS_COLORS.get(text, "#6c757d")
    return format_html(
        '<span style="background:{};color:#fff;border-radius:8px;padding:1px 8px;'
        'white-space:nowrap">{}</span>', color, text,
    )


def short_id(value: Any) -> str:
    """The first 8 characters of a UUID: enough to tell runs and takes apart on one screen."""
    return str(value)[:8]


def seconds_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def age(when: datetime | None) -> str:
    """How long ago `when` was ("3.2 s ago"), or "never"."""
    if when is None:
        return "never"
    return seconds_text(max((timezone.now() - when).total_seconds(), 0.0)) + " ago"


def when(value: datetime | None) -> str:
    """A compact local time: "14:03:07" today, "Nov 28 14:03" before."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    if local.date() == timezone.localdate():
        return local.strftime("%H:%M:%S")
    return local.strftime("%b %d %H:%M")


def duration(start: datetime | None, end: datetime | None) -> str:
    """Wall time from `start` to `end` (to now while unfinished); "—" before it started."""
    if start is None:
        return "—"
    return seconds_text(max(((end or timezone.now()) - start).total_seconds(), 0.0))


class ViewOnlyAdmin(admin.ModelAdmin):
    """A model nobody edits in the admin: no Add, no Save, no Delete (actions may still act)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
