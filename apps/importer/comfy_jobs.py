"""ComfyUI's jobs API (`GET /api/jobs`, `/api/jobs/{id}`, `POST /api/jobs/cancel`), which the
editor's queue and history panels read: a user's own prompts, each as the job its run is.

The shapes follow the editor's zod schema (src/platform/remote/comfyui/jobs/jobTypes.ts in the
frontend package): `{jobs: [...], pagination: {offset, limit, total, has_more}}`.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.urls import reverse

from apps.importer.comfy_door import comfy_interrupt, in_editor_history
from apps.importer.comfy_shapes import class_of, error_body, history_entry, image_ref, take_url
from apps.importer.models import ComfyPrompt
from apps.runs.models import RunStatus
from inline_farm.ids import is_uuid

# ComfyUI's job statuses and the run statuses each stands for.
JOB_STATUS = {
    RunStatus.QUEUED: "pending", RunStatus.RUNNING: "in_progress",
    RunStatus.SUCCEEDED: "completed", RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "cancelled",
}
RUN_STATUS = {job: run for run, job in JOB_STATUS.items()}
MAX_LIMIT = 500


def _own(user: User) -> QuerySet[ComfyPrompt]:
    """The editor is personal: its panels list the user's own prompts only."""
    return (ComfyPrompt.objects.filter(owner=user).select_related("run")
            .prefetch_related("run__takes"))


def comfy_jobs_for_user(
    *, user: User, statuses: list[str], limit: int, offset: int
) -> tuple[list[ComfyPrompt], int]:
    """(a page of the user's prompts whose job status is one of `statuses`, newest first; how
    many there are in all). Unknown statuses match nothing."""
    runs = [RUN_STATUS[s] for s in statuses if s in RUN_STATUS] if statuses else list(RUN_STATUS.values())
    qs = in_editor_history(_own(user).filter(run__status__in=runs), user)
    return list(qs.order_by("-created_at", "-number")[offset: offset + limit]), qs.count()


def comfy_job_get_for_user(*, user: User, job_id: str) -> ComfyPrompt | None:
    """One of the user's jobs; None once removed from their history, as ComfyUI forgets it."""
    return in_editor_history(_own(user).filter(pk=job_id), user).first() if is_uuid(job_id) else None


def comfy_jobs_cancel(*, user: User, job_ids: list[str]) -> int:
    """Cancel the user's own jobs, pending or running; finished ones are left as they are."""
    ids = _own(user).filter(pk__in=[i for i in job_ids if is_uuid(i)]).values_list("pk", flat=True)
    return sum(comfy_interrupt(user=user, prompt_id=str(pk)) for pk in ids)


def _ms(value: Any) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None


def job_item(prompt: ComfyPrompt, *, base: str, staff: bool = False) -> dict[str, Any]:
    """One prompt as the jobs list shows it. Links go through the door `base` the caller came
    by: `preview_output.url` is the take's bytes (the editor's history opens it when an output
    is clicked), and `farm` names the run and all its takes (id, url); staff also get the
    admin's run page."""
    run = prompt.run
    takes = list(run.takes.all())
    refs = [image_ref(take, class_of(prompt.prompt, take.node_id)) for take in takes]
    preview = None
    if takes:
        preview = {**refs[0], "url": take_url(base, refs[0]), "nodeId": takes[0].node_id,
                   "mediaType": "images"}
    workflow = ((prompt.extra_data or {}).get("extra_pnginfo") or {}).get("workflow")
    item: dict[str, Any] = {
        "id": str(prompt.pk), "status": JOB_STATUS[RunStatus(run.status)],
        "create_time": _ms(prompt.created_at),
        "execution_start_time": _ms(run.started_at), "execution_end_time": _ms(run.finished_at),
        "preview_output": preview, "outputs_count": len(takes),
        "previewable_outputs_count": len(takes),
        "workflow_id": workflow.get("id") if isinstance(workflow, dict) else None,
        "execution_error": None,
        "run_id": str(run.pk),  # the farm's run: /v1/runs/{id}, the admin's run page
        "farm": {
            "run_id": str(run.pk),
            "run_url": reverse("admin:runs_run_change", args=[run.pk]) if staff else None,
            "takes": [{"id": str(take.id), "node_id": take.node_id, "media_type": take.media_type,
                       "url": take_url(base, ref)} for take, ref in zip(takes, refs, strict=True)],
        },
    }
    if run.status == RunStatus.FAILED:
        item["execution_error"] = error_body(
            str(prompt.pk), run.error_node or "", class_of(prompt.prompt, run.error_node),
            run.error_code or "error", run.error_message or "", [], _ms(run.finished_at) or 0)
    return item


def job_detail(prompt: ComfyPrompt, *, base: str, staff: bool = False) -> dict[str, Any]:
    """One job with its workflow (what the editor re-opens) and its outputs (each with its
    `url`, as in /history)."""
    return {**job_item(prompt, base=base, staff=staff),
            "workflow": {"prompt": prompt.prompt, "extra_data": prompt.extra_data},
            "outputs": history_entry(prompt, base)["outputs"],
            "update_time": _ms(prompt.run.finished_at or prompt.run.started_at
                               or prompt.created_at)}
