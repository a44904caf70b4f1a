"""FLUX.2 Klein's Qwen3 at submit: the same file Z-Image reads, its loader's `family` says whose
value it is, so a graph that would condition a FLUX.2 model with Z-Image's encoding is a 422
naming the sampler — never a worker failure."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from apps.fleet.models import Worker
from apps.graphs.schema import GraphDoc
from apps.runs.services import run_submit
from tests.apps.test_model_families import artist, chain, refusal  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

FILES = {
    ("diffusion_models", "flux-2-klein-4b.safetensors"): ("flux2", "transformer", ["flux2"]),
    ("vae", "flux2-vae.safetensors"): ("flux2", "vae", ["flux2"]),
    ("text_encoders", "qwen_3_4b.safetensors"): ("zimage", "text_encoder", ["zimage", "flux2"]),
}


@pytest.fixture
def fleet() -> Worker:
    files = [{"folder": folder, "name": name, "kind": "file", "size": 1000, "family": family,
              "role": role, "families": families}
             for (folder, name), (family, role, families) in FILES.items()]
    return Worker.objects.create(name="cpu@host", queues=["cpu"], state="online",
                                 last_heartbeat=timezone.now(), slots=2,
                                 device={"profile": "cpu"}, model_files=files)


def klein(family: str | None) -> GraphDoc:
    doc: Any = chain("flux-2-klein-4b.safetensors", "flux2-vae.safetensors",
                     "qwen_3_4b.safetensors").model_dump()
    if family is not None:
        doc["nodes"]["clip"]["params"]["family"] = family
    return GraphDoc.model_validate(doc)


def test_a_klein_graph_whose_qwen3_is_loaded_as_flux2_s_submits(fleet, artist):  # noqa: F811
    run, _ = run_submit(owner=artist, graph=klein("flux2"), target="save")
    assert run.status == "queued"


@pytest.mark.parametrize("family", [None, "auto", "zimage"])
def test_the_qwen3_loaded_as_z_image_s_for_a_flux2_model_is_refused_at_the_sampler(
        fleet, artist, family):  # noqa: F811
    error = refusal(artist, klein(family))
    assert (error.code, error.node_id) == ("family_mismatch", "sample")
    assert "zimage" in error.message and "flux2" in error.message


def test_a_loader_naming_a_family_that_does_not_read_the_file_is_refused_naming_it(
        fleet, artist):  # noqa: F811
    error = refusal(artist, klein("sdxl"))
    assert (error.code, error.node_id) == ("model_family", "clip")
    assert "not a sdxl file" in error.message
