"""Admin for teams, API tokens (hashes only; revoke) and per-user limits."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.accounts.models import ApiToken, Team, UserLimits
from apps.accounts.services import token_revoke


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name",)
    filter_horizontal = ("members",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "user__username", "name")
    readonly_fields = ("user", "prefix", "key_sha256", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # secrets are shown once: create tokens with `./farm token USERNAME`

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = sum(token_revoke(token_id=t.pk) for t in queryset)
        self.message_user(request, f"revoked {revoked} token(s)", messages.SUCCESS)


@admin.register(UserLimits)
class UserLimitsAdmin(admin.ModelAdmin):
    list_display = ("user", "max_inflight_runs")
