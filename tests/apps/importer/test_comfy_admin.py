"""ComfyUI client keys in the admin: created with the URL shown once, revoked there; prompts
are read-only."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from apps.importer.comfy_door import user_for_comfy_key
from apps.importer.models import ComfyKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def lead(client):
    user = get_user_model().objects.create_superuser("lead", "lead@studio.test", "pw")
    client.force_login(user)
    return user


def test_adding_a_key_shows_its_base_url_once_and_stores_only_a_hash(client, lead):
    artist = get_user_model().objects.create_user("artist")
    page = client.post("/admin/importer/comfykey/add/", {"user": artist.pk, "name": "krita"},
                       follow=True)
    assert page.status_code == 200
    text = page.content.decode()
    secret = text.split("/comfy/k/")[1].split("/")[0]
    key = ComfyKey.objects.get()
    assert key.user == artist and key.name == "krita" and secret not in key.key_sha256
    assert user_for_comfy_key(secret) == artist
    assert secret not in client.get(f"/admin/importer/comfykey/{key.pk}/change/").content.decode()


def test_revoking_a_key_locks_its_url_out(client, lead):
    from apps.importer.comfy_door import comfy_key_create

    key, secret = comfy_key_create(user=lead, name="script")
    client.post("/admin/importer/comfykey/", {"action": "revoke", "_selected_action": [key.pk]})
    assert user_for_comfy_key(secret) is None


def test_the_prompt_list_renders_and_offers_no_add(client, lead):
    assert client.get("/admin/importer/comfyprompt/").status_code == 200
    assert client.get("/admin/importer/comfyprompt/add/").status_code == 403
    assert client.get("/admin/importer/comfykey/").status_code == 200
