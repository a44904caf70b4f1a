"""Writes and reads of the ComfyUI front door: client keys, prompts → runs, uploads → assets.

The HTTP and websocket front doors (comfy_api.py, comfy_ws.py) call only these; every read is
scoped as /v1 scopes it (apps/accounts/selectors.py `visible_owner_ids`).
"""

from __future__ import annotations

import hashlib
import posixpath
import secrets
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef, QuerySet
from django.utils import timezone

from apps.accounts.selectors import visible_owner_ids
from apps.accounts.watch import credential_kind_register
from apps.fleet.selectors import model_catalog_families
from apps.graphs.nodes import MAX_PROMPT
from apps.graphs.validation import GraphInvalid
from apps.importer.api_format import AssetResolver
from apps.importer.comfy_shapes import (
    ComfyRefused,
    import_refusal,
    node_refusal,
    submit_refusal,
    unknown_refusal,
)
from apps.importer.models import (
    ComfyHistoryCleared,
    ComfyHistoryHidden,
    ComfyKey,
    ComfyPrompt,
    ComfyUpload,
)
from apps.importer.report import ImportInvalid
from apps.importer.services import Imported, comfy_import
from apps.runs.models import IN_FLIGHT, Run, RunStatus
from apps.runs.services import (
    RunConflict,
    RunLimitReached,
    RunNotCancellable,
    RunPriorityNotAllowed,
    run_cancel,
    run_submit,
)
from apps.runs.services.submit import advisory_lock
from apps.takes.models import Asset
from apps.takes.services import asset_create
from inline_farm.effects import group_send_after_commit
from inline_farm.ids import is_uuid

KEY_PREFIX = "cfk_"
LOCK_COMFY_NUMBER = 4  # advisory-lock namespace (apps/runs/services.py holds 1–3): per owner


# --- client keys ------------------------------------------------------------------------------

def _key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def comfy_key_create(*, user: User, name: str = "") -> tuple[ComfyKey, str]:
    """A new client key for `user`; returns the row and the secret (shown once, never stored)."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ComfyKey.objects.create(user=user, name=name, prefix=secret[:10],
                                  key_sha256=_key_hash(secret))
    return key, secret


def comfy_key_revoke(*, key_id: int) -> bool:
    """Revoke a key (compare-and-set: False when it was already revoked)."""
    return bool(ComfyKey.objects.filter(pk=key_id, revoked_at__isnull=True)
                .update(revoked_at=timezone.now()))


def user_for_comfy_key(secret: str) -> User | None:
    """The active user holding the unrevoked client key `secret`, or None."""
    key = (ComfyKey.objects.select_related("user", "user__limits")
           .filter(key_sha256=_key_hash(secret), revoked_at__isnull=True, user__is_active=True)
           .first())
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
        ComfyKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key.user


def comfy_key_digest(secret: str) -> str:
    """What a socket holding client key `secret` is watched by (apps/accounts/watch.py)."""
    return _key_hash(secret)


def comfy_key_digests_valid(digests: set[str]) -> set[str]:
    """Which of the key digests still authenticate (unrevoked, active user): one query."""
    return set(ComfyKey.objects.filter(key_sha256__in=digests, revoked_at__isnull=True,
                                       user__is_active=True)
               .values_list("key_sha256", flat=True))


credential_kind_register("comfy_key", comfy_key_digests_valid)


# --- prompts ----------------------------------------------------------------------------------

def client_group(owner_id: int, client_id: str) -> str:
    """The channel-layer group told about a new prompt of (owner, client id)."""
    digest = hashlib.sha256(client_id.encode()).hexdigest()[:24]
    return f"comfy.{owner_id}.{digest}"


@dataclass(frozen=True)
class PromptIn:
    """The body of ComfyUI's `POST /prompt`, as far as the farm reads it."""

    prompt: dict[str, Any]
    client_id: str = ""
    extra_data: dict[str, Any] | None = None
    prompt_id: str | None = None


def comfy_prompt_queue(
    *, owner: User, body: PromptIn
) -> tuple[ComfyPrompt, list[dict[str, Any]]]:
    """Import the workflow, submit its run and record the prompt; returns the prompt and the
    importer's unmapped nodes (the run goes ahead without them). `ComfyRefused` (ComfyUI's
    error shape, naming the node) when it cannot run here; nothing is stored then."""
    if body.prompt_id is not None and ComfyPrompt.objects.filter(pk=body.prompt_id).exists():
        raise _prompt_id_used(body.prompt_id)
    # A node type the farm does not know is ComfyUI's `invalid_prompt`, wherever it is; unless
    # the workflow is for a model family the farm does not run: that says more.
    unknown = unknown_refusal(body.prompt)
    try:
        catalog, files = model_catalog_families()
        imported = comfy_import(workflow=body.prompt, catalog=catalog, files=files,
                                resolve_asset=asset_resolver(owner))
    except ImportInvalid as exc:
        if unknown is not None and exc.code != "unsupported_family":
            raise unknown from None
        raise import_refusal(exc, body.prompt) from None
    if unknown is not None:
        raise unknown
    kept = _kept_prompt(imported)
    try:
        # One commit for the run and its prompt: a prompt id never names a missing run.
        with transaction.atomic():
            run, _ = run_submit(owner=owner, graph=imported.graph, target=imported.target)
            prompt = _prompt_record(owner, run, body, imported.target, kept)
    except (GraphInvalid, RunConflict, RunLimitReached, RunPriorityNotAllowed) as exc:
        raise submit_refusal(exc, body.prompt, imported.target) from None
    except IntegrityError:  # the client's prompt_id was taken meanwhile; nothing was kept
        raise _prompt_id_used(str(body.prompt_id)) from None
    return prompt, imported.report.unmapped


def _prompt_id_used(prompt_id: str) -> ComfyRefused:
    return ComfyRefused(400, {"type": "invalid_prompt", "message": "prompt_id already used",
                              "details": prompt_id, "extra_info": {}})


def _kept_prompt(imported: Imported) -> dict[str, Any]:
    """The nodes of the prompt that run (API format), as the prompt will be kept and echoed by
    /queue and /history. Nodes off the output path are not kept at all, so no limit needs to
    hold for them; a kept node's every string is held to the limit its text params have
    (MAX_PROMPT), the inputs the farm ignores included: refused naming the node beyond it."""
    kept = {nid: imported.prompt[nid] for nid in imported.graph.nodes if nid in imported.prompt}
    for node_id, node in kept.items():
        too_long = _longest_text_over(node, MAX_PROMPT)
        if too_long is not None:
            raise node_refusal("value_too_long", f"'{too_long}' holds more than {MAX_PROMPT} "
                               "characters", node_id, kept, [])
    return kept


def _longest_text_over(node: Any, limit: int) -> str | None:
    """The input name of the first string over `limit` characters anywhere in `node`."""
    inputs = node.get("inputs") if isinstance(node, dict) else None
    meta = node.get("_meta") if isinstance(node, dict) else None
    stack: list[tuple[str, Any]] = [*(inputs or {}).items(), ("_meta", meta)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, str) and len(value) > limit:
            return name
        if isinstance(value, dict):
            stack.extend((name, v) for v in [*value.keys(), *value.values()])
        elif isinstance(value, list):
            stack.extend((name, v) for v in value)
    return None


def _prompt_record(owner: User, run: Run, body: PromptIn, target: str,
                   kept: dict[str, Any]) -> ComfyPrompt:
    """Record the prompt of `run` (its nodes that run: `kept`); call inside the submit's
    transaction. `number` counts the owner's own prompts (1, 2, 3…): a counter shared by all
    users would tell each how busy the others are. The owner's prompts take turns for it."""
    advisory_lock(LOCK_COMFY_NUMBER, owner.pk)
    top = ComfyPrompt.objects.filter(owner=owner).aggregate(top=Max("number"))["top"]
    number = (top or 0) + 1
    extra = {**(body.extra_data or {}), "client_id": body.client_id} if body.client_id else dict(
        body.extra_data or {})
    prompt = ComfyPrompt.objects.create(
        number=number, owner=owner, run=run, client_id=body.client_id, prompt=kept,
        extra_data=extra, outputs=[target], **({"id": body.prompt_id} if body.prompt_id else {}),
    )
    if body.client_id:
        group_send_after_commit(client_group(owner.pk, body.client_id),
                                {"type": "comfy.prompt", "number": number})
    return prompt


def _prompts_for(user: User) -> QuerySet[ComfyPrompt]:
    owners = visible_owner_ids(user)
    qs = ComfyPrompt.objects.select_related("run").prefetch_related("run__takes")
    return qs if owners is None else qs.filter(owner_id__in=owners)


def comfy_prompt_get_for_user(*, user: User, prompt_id: str) -> ComfyPrompt | None:
    return _prompts_for(user).filter(pk=prompt_id).first() if is_uuid(prompt_id) else None


def in_editor_history(qs: QuerySet[ComfyPrompt], user: User) -> QuerySet[ComfyPrompt]:
    """`qs` less the prompts `user` removed from their editor's history: deleted one by one, or
    queued and finished by the time they last cleared it."""
    hidden = ComfyHistoryHidden.objects.filter(user=user, prompt=OuterRef("pk"))
    cleared = ComfyHistoryCleared.objects.filter(
        user=user, cleared_at__gte=OuterRef("created_at"),
    ).filter(cleared_at__gte=OuterRef("run__finished_at"))
    return qs.exclude(Exists(hidden)).exclude(Exists(cleared))


def comfy_history_for_user(*, user: User, max_items: int, offset: int = 0) -> list[ComfyPrompt]:
    """The user's finished prompts, the newest `max_items` (after skipping `offset` newer ones),
    oldest first as ComfyUI lists its history; less those the user removed from it."""
    qs = in_editor_history(_prompts_for(user).exclude(run__status__in=IN_FLIGHT), user)
    return list(reversed(qs.order_by("-created_at", "-number")[offset: offset + max_items]))


def comfy_history_entry_for_user(*, user: User, prompt_id: str) -> ComfyPrompt | None:
    """One finished prompt of the user's history (None while it runs, or once removed)."""
    if not is_uuid(prompt_id):
        return None
    qs = _prompts_for(user).filter(pk=prompt_id).exclude(run__status__in=IN_FLIGHT)
    return in_editor_history(qs, user).first()


def comfy_history_remove(*, user: User, prompt_ids: list[str] | None, clear: bool) -> int:
    """ComfyUI's `POST /history`: hide finished prompts from this user's editor history — the
    named ones the user may see (others' ids, unknown or unfinished ones are ignored, as ComfyUI
    ignores ids not in its history), or (clear) all finished by now. Nothing is deleted: the
    prompts, runs and takes stay, and other users' histories are unchanged. Returns how many
    prompts were named and hidden."""
    if clear:
        ComfyHistoryCleared.objects.update_or_create(
            user=user, defaults={"cleared_at": timezone.now()})
    ids = [i for i in prompt_ids or [] if is_uuid(i)]
    if not ids:
        return 0
    found = _prompts_for(user).filter(pk__in=ids).exclude(run__status__in=IN_FLIGHT)
    rows = [ComfyHistoryHidden(user=user, prompt_id=pk) for pk in found.values_list("pk", flat=True)]
    ComfyHistoryHidden.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def comfy_queue_for_user(*, user: User) -> tuple[list[ComfyPrompt], list[ComfyPrompt]]:
    """(running, pending) prompts the user may see, in queue order."""
    qs = _prompts_for(user).filter(run__status__in=IN_FLIGHT).order_by("created_at", "number")
    rows = list(qs)
    return ([p for p in rows if p.run.status == RunStatus.RUNNING],
            [p for p in rows if p.run.status == RunStatus.QUEUED])


def comfy_queue_remaining(*, user: User) -> int:
    return _prompts_for(user).filter(run__status__in=IN_FLIGHT).count()


def comfy_client_prompts(
    *, owner_id: int, client_id: str, after: int | None
) -> tuple[list[ComfyPrompt], int]:
    """(prompts of one client to follow, the highest number seen): those numbered above `after`,
    or with `after` None (a client connecting) the ones still in flight."""
    qs = ComfyPrompt.objects.select_related("run").filter(owner_id=owner_id, client_id=client_id)
    if after is None:
        top = qs.order_by("-number").values_list("number", flat=True).first() or 0
        return list(qs.filter(run__status__in=IN_FLIGHT).order_by("number")), top
    rows = list(qs.filter(number__gt=after).order_by("number"))
    return rows, max([after, *(p.number for p in rows)])


def comfy_interrupt(*, user: User, prompt_id: str | None) -> int:
    """Cancel one prompt's run (any the user may see), or with no id the user's own running
    prompts, as ComfyUI's interrupt stops what is executing. Returns how many were cancelled."""
    if prompt_id:
        prompt = comfy_prompt_get_for_user(user=user, prompt_id=prompt_id)
        prompts = [prompt] if prompt is not None else []
    else:
        prompts = list(ComfyPrompt.objects.select_related("run").filter(
            owner=user, run__status=RunStatus.RUNNING))
    return _cancel_runs({p.run for p in prompts})


def comfy_queue_delete(*, user: User, prompt_ids: list[str] | None, clear: bool) -> int:
    """Drop pending prompts: the named ones the user may see, or (clear) all the user's own."""
    if clear:
        qs = ComfyPrompt.objects.filter(owner=user)
    else:
        ids = [i for i in prompt_ids or [] if is_uuid(i)]
        qs = _prompts_for(user).filter(pk__in=ids)
    return _cancel_runs({p.run for p in qs.select_related("run").filter(run__status=RunStatus.QUEUED)})


def _cancel_runs(runs: set[Run]) -> int:
    cancelled = 0
    for run in runs:
        try:
            run_cancel(run=run)
            cancelled += 1
        except RunNotCancellable:
            pass  # finished meanwhile: nothing to interrupt
    return cancelled


# --- uploads ----------------------------------------------------------------------------------

def comfy_upload_keep(
    *, owner: User, data: bytes, filename: str, subfolder: str = "", overwrite: bool = False
) -> ComfyUpload:
    """Keep an uploaded image as an asset under the name ComfyUI would give it: the file's own
    name, or `name (1).ext` when that name already holds other bytes and `overwrite` is off.
    Raises UploadRejected (apps/takes/services.py) for what the farm does not keep."""
    asset, _ = asset_create(owner=owner, data=data, filename=filename)
    name, subfolder = safe_name(filename), safe_subfolder(subfolder)
    stem, ext = posixpath.splitext(name)
    for i in range(1, 10_000):
        held = _upload_named(owner.pk, subfolder, name)
        if held is None or held.asset_id == asset.pk:
            if held is not None:
                return held
            break
        if overwrite:
            break
        name = f"{stem} ({i}){ext}"
    return ComfyUpload.objects.create(owner=owner, subfolder=subfolder, name=name, asset=asset)


def safe_name(filename: str) -> str:
    """The base name of a client's file name, never a path ("" → "image.png")."""
    name = posixpath.basename(filename.replace("\\", "/")).strip()
    return name[:255] if name not in ("", ".", "..") else "image.png"


def safe_subfolder(subfolder: str) -> str:
    parts = [p for p in subfolder.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return "/".join(parts)[:200]


def _upload_named(owner_id: int, subfolder: str, name: str,
                  with_asset: bool = False) -> ComfyUpload | None:
    qs = ComfyUpload.objects.filter(owner_id=owner_id, subfolder=subfolder, name=name)
    if with_asset:
        qs = qs.select_related("asset")
    return qs.order_by("-created_at", "-pk").first()


def comfy_input_asset(*, user: User, filename: str, subfolder: str = "") -> Asset | None:
    """The asset an input name stands for, for `user`: one of their uploaded names (in
    `subfolder`, or as LoadImage writes it, "sub/name"), or an asset id they may see."""
    name = filename.replace("\\", "/")
    sub, base = posixpath.split(name)
    sub = safe_subfolder(subfolder or sub)
    upload = _upload_named(user.pk, sub, base, with_asset=True)
    if upload is not None:
        return upload.asset
    stem = posixpath.splitext(base)[0]
    if not is_uuid(stem):
        return None
    owners = visible_owner_ids(user)
    qs = Asset.objects.filter(pk=stem)
    return (qs if owners is None else qs.filter(owner_id__in=owners)).first()


def asset_resolver(user: User) -> AssetResolver:
    """LoadImage names → asset ids for `user` (the importer's `resolve_asset`)."""

    def resolve(name: str) -> str | None:
        asset = comfy_input_asset(user=user, filename=name)
        return str(asset.pk) if asset is not None else None

    return resolve


def comfy_upload_names(*, user: User) -> list[str]:
    """The input names the user uploaded (LoadImage's choices in /object_info), newest first."""
    rows = ComfyUpload.objects.filter(owner=user).order_by("-created_at").values_list(
        "subfolder", "name")[:1000]
    seen: dict[str, None] = {}
    for sub, name in rows:
        seen.setdefault(f"{sub}/{name}" if sub else name)
    return list(seen)
