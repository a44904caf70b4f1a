"""Admin for takes (read-only, with image previews) and assets."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from apps.takes.models import Asset, Take
from apps.takes.storage import BlobMissing, blob_read


def take_thumbnail(take: Take, size: int = 96) -> str:
    url = reverse("admin:takes_take_bytes", args=[take.pk])
    return format_html(
        '<a href="{}"><img src="{}" style="max-width:{}px;max-height:{}px" alt="take {}"></a>',
        url, url, size, size, take.pk,
    )


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # immutable: Postgres refuses updates too


@admin.register(Take)
class TakeAdmin(_ReadOnly):
    list_display = ("thumbnail", "id", "owner", "run", "node_id", "width", "height", "seed",
                    "created_at")
    list_filter = (("owner", admin.RelatedOnlyFieldListFilter), "media_type")
    search_fields = ("id", "sha256", "run__id", "node_id")
    readonly_fields = ("preview",)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("owner", "run")

    @admin.display(description="preview")
    def thumbnail(self, take: Take) -> str:
        return take_thumbnail(take)

    @admin.display(description="image")
    def preview(self, take: Take) -> str:
        return take_thumbnail(take, size=512)

    def get_urls(self) -> list[Any]:
        extra = [path("<uuid:take_id>/bytes/", self.admin_site.admin_view(self.bytes_view),
                      name="takes_take_bytes")]
        return extra + super().get_urls()

    def bytes_view(self, request: HttpRequest, take_id: Any) -> HttpResponse:
        take = get_object_or_404(Take, pk=take_id)
        try:
            return HttpResponse(blob_read(take.sha256), content_type=take.media_type)
        except BlobMissing:
            return HttpResponse(status=404)


@admin.register(Asset)
class AssetAdmin(_ReadOnly):
    list_display = ("id", "owner", "media_type", "width", "height", "size", "created_at")
    list_filter = (("owner", admin.RelatedOnlyFieldListFilter), "media_type")
    search_fields = ("id", "sha256", "original_name")
