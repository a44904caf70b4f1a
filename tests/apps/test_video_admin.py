"""The takes admin with video takes: a clip's page plays it in a <video> with its poster, the
list shows a clip by its poster and an image by its own bytes (the last attempt sent every
thumbnail to the poster route and image thumbnails broke)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from PIL import Image

from apps.graphs.models import Graph
from apps.runs.models import Run
from apps.takes.models import Take
from apps.takes.storage import blob_put
from tests.conftest import png
from tests.workers.test_video import smooth_frames
from workers.models.values import Frames, Video

pytestmark = pytest.mark.django_db


@pytest.fixture
def lead(client, settings, tmp_path):
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"
    user = get_user_model().objects.create_superuser("lead", "lead@studio.test", "pw")
    client.force_login(user)
    return user


@pytest.fixture
def takes(lead, tmp_path):
    from workers.video import video_write

    graph = Graph.objects.create(sha256="f" * 64, document={"nodes": {}})
    run = Run.objects.create(owner=lead, graph=graph, target="out")
    path = tmp_path / "clip.mp4"
    facts = video_write(Video(Frames(smooth_frames(count=4)), 8.0), path, format="mp4", crf=30,
                        comment="{}")
    clip_bytes, still = path.read_bytes(), png(8, 8)
    clip = Take.objects.create(
        run=run, owner=lead, node_id="clip", sha256=blob_put(clip_bytes), media_type="video/mp4",
        size=len(clip_bytes), width=facts.width, height=facts.height, frame_count=4, fps=8.0,
        duration_seconds=0.5)
    image = Take.objects.create(run=run, owner=lead, node_id="still", sha256=blob_put(still),
                                media_type="image/png", size=len(still), width=8, height=8)
    return clip, image


def test_a_clips_page_plays_it_and_the_list_shows_posters_for_clips_only(client, takes):
    clip, image = takes
    page = client.get(reverse("admin:takes_take_change", args=[clip.pk])).content.decode()
    bytes_url = reverse("admin:takes_take_bytes", args=[clip.pk])
    poster_url = reverse("admin:takes_take_poster", args=[clip.pk])
    assert "<video" in page and f'src="{bytes_url}"' in page and f'poster="{poster_url}"' in page
    assert "4 frames at 8 fps (0.50 s), no sound" in page

    listing = client.get(reverse("admin:takes_take_changelist")).content.decode()
    assert f'src="{poster_url}"' in listing
    assert f'src="{reverse("admin:takes_take_bytes", args=[image.pk])}"' in listing
    assert reverse("admin:takes_take_poster", args=[image.pk]) not in listing

    poster = client.get(poster_url)
    assert poster.status_code == 200 and poster["Content-Type"] == "image/png"
    assert Image.open(io.BytesIO(poster.content)).size == (clip.width, clip.height)
    image_page = client.get(reverse("admin:takes_take_change", args=[image.pk])).content.decode()
    assert "<video" not in image_page


def test_a_take_whose_bytes_do_not_decode_gets_a_no_preview_card(client, lead):
    """A damaged clip (here: random bytes stored as video/mp4) must not break the takes list:
    its poster is a small grey card, 200, an image that loads."""
    graph = Graph.objects.create(sha256="e" * 64, document={"nodes": {}})
    run = Run.objects.create(owner=lead, graph=graph, target="out")
    junk = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8
    take = Take.objects.create(run=run, owner=lead, node_id="clip", sha256=blob_put(junk),
                               media_type="video/mp4", size=len(junk))
    poster = client.get(reverse("admin:takes_take_poster", args=[take.pk]))
    assert poster.status_code == 200 and poster["Content-Type"] == "image/png"
    card = Image.open(io.BytesIO(poster.content))
    assert card.size == (256, 128)
    assert card.getpixel((1, 1)) == (58, 58, 64)
