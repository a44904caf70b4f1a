"""Admin for takes and assets (view-only, with image previews) and the retention audit.

Takes are immutable and content-addressed: nobody adds, edits or deletes one here. The one way a
take goes is the "Remove … (retention)" action, which asks for a reason and leaves an audit record
(`TakeRemoval`); the bytes go once nothing references them.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.takes.media import poster_png
from apps.takes.models import Asset, Take, TakeRemoval
from apps.takes.serve import blob_response
from apps.takes.services import RemovalRefused, take_remove
from apps.takes.storage import BlobMissing, blob_path
from inline_farm.admin_display import ViewOnlyAdmin, pretty_json, short_id, when


def take_thumbnail(take: Take, size: int = 96, link: str = "page") -> SafeString:
    """A preview of `take` in a `size` px box linking to its admin page (`link="bytes"`: to the
    image). Small images are scaled up (pixelated) so a 64 px take is still readable."""
    src = reverse("admin:takes_take_bytes", args=[take.pk])
    href = src if link == "bytes" else reverse("admin:takes_take_change", args=[take.pk])
    if take.media_type.startswith("video/"):  # its poster (first frame) stands for it
        src = reverse("admin:takes_take_poster", args=[take.pk])
    elif not take.media_type.startswith("image/"):  # other media: no <img> of it
        return format_html('<a href="{}" class="take-media">{}</a>', href, take.media_type)
    return format_html(
        '<a href="{}"><img class="take-thumb" src="{}" style="width:{}px;height:{}px;'
        'object-fit:contain;image-rendering:pixelated;vertical-align:middle" alt="take {}"></a>',
        href, src, size, size, short_id(take.pk),
    )


def lora_table(lineage: dict[str, Any]) -> SafeString | str:
    """A take's LoRAs as a table: each file, its strength on the model (lineage `loras`:
    {"loras/<name>": {sha256, strength}}) and on the text encoder (`textEncoderLoras`, the
    same shape; "—": not applied there), and its content hash (short; the full one in the
    title)."""
    sides = [side if isinstance(side := lineage.get(key), dict) else {}
             for key in ("loras", "textEncoderLoras")]
    names = sorted({*sides[0], *sides[1]})
    if not names:
        return "—"

    def strength(entry: Any) -> str:
        value = entry.get("strength") if isinstance(entry, dict) else None
        if value is None:
            return "—"
        return f"{value:g}" if isinstance(value, float | int) else str(value)

    rows = []
    for name in names:
        model, clip = sides[0].get(name), sides[1].get(name)
        sha = str(next((e.get("sha256") for e in (model, clip) if isinstance(e, dict)), ""))
        rows.append((name, strength(model), strength(clip), sha, sha[:12]))
    body = format_html_join("", '<tr><td>{}</td><td>{}</td><td>{}</td>'
                            '<td title="{}"><code>{}</code></td></tr>', rows)
    return format_html('<table class="take-loras"><thead><tr><th>LoRA</th><th>model</th>'
                       '<th>text encoder</th><th>sha256</th></tr></thead><tbody>{}</tbody>'
                       '</table>', body)


def _blob_response(request: HttpRequest, sha256: str, media_type: str, name: str
                   ) -> HttpResponseBase:
    try:
        return blob_response(request, sha256=sha256, media_type=media_type, filename=name)
    except BlobMissing:
        return HttpResponse(status=404)


class RemovalForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=2000,
        help_text="Recorded with your name in the retention log.",
    )


@admin.register(Take)
class TakeAdmin(ViewOnlyAdmin):
    list_display = ("thumbnail", "take_id", "owner", "run_link", "node_id", "dims", "seed",
                    "created")
    ordering = ("-created_at",)
    list_display_links = ("take_id",)
    list_filter = (("owner", admin.RelatedOnlyFieldListFilter), "media_type", "created_at")
    search_fields = ("id", "sha256", "run__id", "node_id")
    list_per_page = 50
    actions = ("remove_for_retention",)
    fieldsets = (
        (None, {"fields": ("preview",)}),
        ("Take", {"fields": ("id", "run_link", "owner", "node_id", "index", "media_type", "dims",
                             "clip", "file_size", "seed", "sha256", "created_at")}),
        ("Lineage", {"fields": ("loras", "lineage_pretty")}),
    )
    readonly_fields = ("preview", "id", "run_link", "owner", "node_id", "index", "media_type",
                       "dims", "clip", "file_size", "seed", "sha256", "created_at", "loras",
                       "lineage_pretty")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Take]:
        return super().get_queryset(request).select_related("owner", "run")

    @admin.display(description="preview")
    def thumbnail(self, take: Take) -> SafeString:
        return take_thumbnail(take, size=64)

    @admin.display(description="take", ordering="id")
    def take_id(self, take: Take) -> str:
        return short_id(take.pk)

    @admin.display(description="run", ordering="run")
    def run_link(self, take: Take) -> SafeString:
        url = reverse("admin:runs_run_change", args=[take.run_id])
        return format_html('<a href="{}" title="{}">{}</a>', url, take.run_id,
                           short_id(take.run_id))

    @admin.display(description="size")
    def dims(self, take: Take) -> str:
        return f"{take.width}×{take.height}" if take.width and take.height else "—"

    @admin.display(description="created", ordering="created_at")
    def created(self, take: Take) -> str:
        return when(take.created_at)

    @admin.display(description="file size")
    def file_size(self, take: Take) -> str:
        return f"{take.size:,} bytes"

    @admin.display(description="image")
    def preview(self, take: Take) -> SafeString:
        if take.media_type.startswith("video/"):  # the browser plays it (Range requests)
            return format_html(
                '<video class="take-video" controls preload="metadata" poster="{}" '
                'style="max-width:512px;max-height:512px"><source src="{}" type="{}"></video>',
                reverse("admin:takes_take_poster", args=[take.pk]),
                reverse("admin:takes_take_bytes", args=[take.pk]), take.media_type)
        return take_thumbnail(take, size=384, link="bytes")

    @admin.display(description="clip")
    def clip(self, take: Take) -> str:
        if take.frame_count is None:
            return "—"
        sound = f"{take.audio_seconds:.2f} s of sound" if take.audio_seconds else "no sound"
        return (f"{take.frame_count} frames at {take.fps:g} fps "
                f"({take.duration_seconds:.2f} s), {sound}")

    @admin.display(description="LoRAs")
    def loras(self, take: Take) -> SafeString | str:
        return lora_table(take.lineage if isinstance(take.lineage, dict) else {})

    @admin.display(description="lineage")
    def lineage_pretty(self, take: Take) -> SafeString:
        return pretty_json(take.lineage)

    def get_urls(self) -> list[Any]:
        extra = [path("<uuid:take_id>/bytes/", self.admin_site.admin_view(self.bytes_view),
                      name="takes_take_bytes"),
                 path("<uuid:take_id>/poster/", self.admin_site.admin_view(self.poster_view),
                      name="takes_take_poster")]
        return extra + super().get_urls()

    def bytes_view(self, request: HttpRequest, take_id: Any) -> HttpResponseBase:
        take = get_object_or_404(Take, pk=take_id)
        return _blob_response(request, take.sha256, take.media_type, str(take.pk))

    def poster_view(self, request: HttpRequest, take_id: Any) -> HttpResponseBase:
        take = get_object_or_404(Take, pk=take_id)
        path_ = blob_path(take.sha256)
        if not path_.exists():
            return HttpResponse(f"blob {take.sha256} is missing", status=500,
                                content_type="text/plain")
        return HttpResponse(poster_png(path_, take.media_type), content_type="image/png",
                            headers={"Cache-Control": "private, max-age=31536000, immutable"})

    def has_retention_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("takes.delete_take")

    @admin.action(description="Remove selected takes (retention, audited)",
                  permissions=["retention"])
    def remove_for_retention(
        self, request: HttpRequest, queryset: QuerySet[Take]
    ) -> TemplateResponse | None:
        form = RemovalForm(request.POST if "confirm" in request.POST else None)
        if form.is_valid():
            try:
                removals = take_remove(take_ids=queryset.values_list("pk", flat=True),
                                       by=request.user,  # type: ignore[arg-type]
                                       reason=form.cleaned_data["reason"])
            except RemovalRefused as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return None
            released = sum(r.blob_released for r in removals)
            self.message_user(request, f"removed {len(removals)} take(s); {released} blob(s) "
                              "no longer referenced were deleted", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Remove takes (retention)",
            "opts": self.model._meta,
            "rows": [(t, take_thumbnail(t, size=64)) for t in queryset.select_related("owner")],
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/takes/take/remove_confirmation.html", context)


@admin.register(TakeRemoval)
class TakeRemovalAdmin(ViewOnlyAdmin):
    list_display = ("removed_at", "take", "owner", "node_id", "removed_by", "reason",
                    "blob_released")
    list_filter = (("removed_by", admin.RelatedOnlyFieldListFilter), "blob_released", "removed_at")
    search_fields = ("take_id", "run_id", "sha256", "reason", "owner__username")
    readonly_fields = ("take_id", "run_id", "owner", "node_id", "sha256", "media_type", "size",
                       "take_created_at", "removed_by", "reason", "removed_at", "blob_released",
                       "lineage_pretty")
    exclude = ("lineage",)

    @admin.display(description="take", ordering="take_id")
    def take(self, removal: TakeRemoval) -> str:
        return short_id(removal.take_id)

    @admin.display(description="lineage")
    def lineage_pretty(self, removal: TakeRemoval) -> SafeString:
        return pretty_json(removal.lineage)


@admin.register(Asset)
class AssetAdmin(ViewOnlyAdmin):
    list_display = ("thumbnail", "asset_id", "owner", "media_type", "dims", "size",
                    "original_name", "created_at")
    list_display_links = ("asset_id",)
    list_filter = (("owner", admin.RelatedOnlyFieldListFilter), "media_type")
    search_fields = ("id", "sha256", "original_name")
    readonly_fields = ("preview", "id", "owner", "sha256", "media_type", "dims", "size",
                       "original_name", "created_at")
    fields = readonly_fields

    @admin.display(description="asset", ordering="id")
    def asset_id(self, asset: Asset) -> str:
        return short_id(asset.pk)

    @admin.display(description="size")
    def dims(self, asset: Asset) -> str:
        return f"{asset.width}×{asset.height}" if asset.width and asset.height else "—"

    @admin.display(description="preview")
    def thumbnail(self, asset: Asset) -> SafeString:
        return self._image(asset, 64)

    @admin.display(description="image")
    def preview(self, asset: Asset) -> SafeString:
        return self._image(asset, 512)

    def _image(self, asset: Asset, size: int) -> SafeString:
        src = reverse("admin:takes_asset_bytes", args=[asset.pk])
        if asset.media_type.startswith("video/"):  # an uploaded clip: the browser plays it
            return format_html('<video controls preload="metadata" style="max-width:{}px;'
                               'max-height:{}px"><source src="{}" type="{}"></video>', size,
                               size, src, asset.media_type)
        return format_html('<img src="{}" style="max-width:{}px;max-height:{}px" '
                           'alt="asset {}">', src, size, size, short_id(asset.pk))

    def get_urls(self) -> list[Any]:
        extra = [path("<uuid:asset_id>/bytes/", self.admin_site.admin_view(self.bytes_view),
                      name="takes_asset_bytes")]
        return extra + super().get_urls()

    def bytes_view(self, request: HttpRequest, asset_id: Any) -> HttpResponseBase:
        asset = get_object_or_404(Asset, pk=asset_id)
        return _blob_response(request, asset.sha256, asset.media_type, str(asset.pk))
