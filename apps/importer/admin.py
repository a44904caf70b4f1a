"""Admin for the ComfyUI front door: client keys (create: the URL is shown once; revoke) and a
read-only view of queued prompts."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.importer.comfy_door import comfy_key_create, comfy_key_revoke
from apps.importer.comfy_editor import editor_url_for_prompt, workflow_url_for_prompt
from apps.importer.models import ComfyKey, ComfyPrompt


def comfy_prompt_links(prompt: ComfyPrompt) -> SafeString | str:
    """Links to the workflow a prompt was queued with: in ComfyUI's editor, and as JSON (only
    prompts queued from the editor carry one; an API client's prompt is its `prompt` JSON)."""
    workflow = ((prompt.extra_data or {}).get("extra_pnginfo") or {}).get("workflow")
    if not isinstance(workflow, dict):
        return "none (queued by an API client: see its prompt)"
    pid = str(prompt.pk)
    return format_html('<a href="{}" target="_blank">open in the editor</a> · '
                       '<a href="{}" target="_blank">workflow JSON</a>',
                       editor_url_for_prompt(pid), workflow_url_for_prompt(pid))


class ComfyKeyForm(forms.ModelForm):
    user = forms.ModelChoiceField(queryset=get_user_model().objects.filter(is_active=True))
    name = forms.CharField(max_length=100, required=False)

    class Meta:
        model = ComfyKey
        fields = ("user", "name")


@admin.register(ComfyKey)
class ComfyKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "user__username", "name")
    actions = ("revoke",)
    form = ComfyKeyForm

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("user", "name", "prefix", "key_sha256", "created_at", "last_used_at",
                "revoked_at")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: ComfyKey, form: Any, change: bool) -> None:
        """Create through the service: the secret exists only in this one message."""
        key, secret = comfy_key_create(user=form.cleaned_data["user"],
                                       name=form.cleaned_data.get("name") or "")
        obj.pk, obj.prefix, obj.key_sha256 = key.pk, key.prefix, key.key_sha256
        obj.created_at = key.created_at
        base = request.build_absolute_uri(f"/comfy/k/{secret}/")
        self.message_user(request, f"ComfyUI base URL for {key.user} (shown once): {base}",
                          messages.SUCCESS)

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ComfyKey]) -> None:
        revoked = sum(comfy_key_revoke(key_id=k.pk) for k in queryset)
        self.message_user(request, f"revoked {revoked} key(s)", messages.SUCCESS)


@admin.register(ComfyPrompt)
class ComfyPromptAdmin(admin.ModelAdmin):
    list_display = ("number", "id", "owner", "client_id", "run", "created_at")
    search_fields = ("id", "client_id", "owner__username", "run__id")
    list_select_related = ("owner", "run")
    readonly_fields = ("id", "number", "owner", "run", "editor_links", "client_id", "prompt",
                       "extra_data", "outputs", "created_at")

    @admin.display(description="workflow")
    def editor_links(self, prompt: ComfyPrompt) -> SafeString | str:
        return comfy_prompt_links(prompt)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
